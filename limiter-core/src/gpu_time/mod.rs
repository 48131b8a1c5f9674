//! Sampled GPU time: which launches the limiter times on the GPU, and the event pairs it has in
//! flight, read back later without waiting.
//!
//! NVML's per-process utilisation is a sampled "who was running" reading that goes to the
//! tenant it happened to catch once tenants share a GPU; the limiter measures instead. One launch
//! in N gets a pair of events recorded around it on its own stream; the pair's elapsed time is
//! that launch's GPU time, and it stands for the N launches since the previous sample. The
//! thread's later sampled launches poll the pairs in flight (`cuEventQuery`, which never
//! waits); a pair that is done is read (`cuEventElapsedTime`), handed to a [`Samples`] sink and
//! reused. Nothing here waits for the GPU, and nothing runs on the launches between samples.
//!
//! Another context's time slice that falls between a pair's events is not the launch's time:
//! each sample is checked against the recent samples of the same launch shape ([`slices`]).
//!
//! The interval is random around its mean (uniform on `1..=2 * mean - 1`), so a loop that
//! launches the same few kernels in a fixed order is not sampled on the same kernel every time;
//! weighting each sample by the launches since the previous one then estimates the total
//! without bias. The mean adapts so that each launching thread takes about
//! [`SampleRate::Adaptive`]'s samples per second, whatever its launch rate.

use std::collections::VecDeque;

pub mod slices;

pub use slices::Shape;
use slices::SliceFilter;

/// Samples per second of one launching thread by default.
pub const DEFAULT_SAMPLES_PER_SECOND: u32 = 200;
/// Event pairs in flight per thread; a sample due while all are pending is skipped (counted),
/// and its launches are carried to the next sample.
pub const MAX_PENDING: usize = 8;
/// Idle event pairs kept per thread for reuse.
pub const POOL_PAIRS: usize = 8;
/// Most launches one sample stands for.
pub const MAX_INTERVAL: u32 = 1 << 20;

/// How often launches are timed (`VGPU_GPU_TIME_SAMPLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleRate {
    /// Never (`0` or `off`).
    Off,
    /// Exactly every `n`th launch of a thread (`n`; `1`: every launch). Deterministic, for
    /// tests: a fixed interval can alias with a loop's order of kernels.
    Every(u32),
    /// About this many samples per second per launching thread (`auto`, the default).
    Adaptive { per_second: u32 },
}

impl Default for SampleRate {
    fn default() -> SampleRate {
        SampleRate::Adaptive {
            per_second: DEFAULT_SAMPLES_PER_SECOND,
        }
    }
}

/// Decides how many launches come before the next sample.
#[derive(Clone, Debug)]
pub struct Pacer {
    rate: SampleRate,
    /// Mean interval (adaptive).
    mean: u32,
    rng: u64,
}

impl Pacer {
    /// A pacer for `rate`; `seed` varies the random intervals between threads.
    pub fn new(rate: SampleRate, seed: u64) -> Pacer {
        Pacer {
            rate,
            mean: 1,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// The launches until (and including) the next sampled launch, after a sample point that
    /// came `launches` launches and `elapsed_ns` after the previous one (0: the first, whose
    /// rate is unknown: the mean interval stays).
    pub fn next(&mut self, launches: u32, elapsed_ns: u64) -> u32 {
        match self.rate {
            SampleRate::Off => u32::MAX,
            SampleRate::Every(n) => n.max(1),
            SampleRate::Adaptive { per_second } => {
                if elapsed_ns != 0 {
                    // The interval that would have given `per_second` samples over this
                    // stretch; halfway there each time, and at most twice as long as before: a
                    // stretch inside a burst of queued launches (a few launches in a few
                    // microseconds) reads as a huge rate, and an interval grown from it at once
                    // left the thread unsampled (and its pairs unread) for seconds.
                    let wanted = f64::from(launches) * 1e9
                        / (f64::from(per_second.max(1)) * elapsed_ns as f64);
                    let mean =
                        ((f64::from(self.mean) + wanted) / 2.0).min(2.0 * f64::from(self.mean));
                    self.mean = mean.clamp(1.0, f64::from(MAX_INTERVAL)) as u32;
                }
                if self.mean <= 1 {
                    return 1;
                }
                1 + (self.random() % u64::from(2 * self.mean - 1)) as u32
            }
        }
    }

    /// The current mean interval.
    pub fn mean(&self) -> u32 {
        match self.rate {
            SampleRate::Off => u32::MAX,
            SampleRate::Every(n) => n.max(1),
            SampleRate::Adaptive { .. } => self.mean,
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64: cheap, and good enough to break up fixed launch orders.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }
}

/// The stream a launch went to, as its event pair must be recorded on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRef {
    /// The `CUstream` handle (0: the default stream).
    pub handle: u64,
    /// Whether the launch was a `_ptsz` variant (the default stream is then the thread's).
    pub per_thread: bool,
}

/// What an event query answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// The GPU has passed the event.
    Done,
    /// Not yet.
    NotReady,
    /// An error (the context is gone, say): the pair is dropped.
    Failed,
}

/// The driver's events, as the sampler needs them. Every call must return without waiting for
/// the GPU.
pub trait Events {
    /// An event handle.
    type Event: Copy;
    /// A new event with timing enabled, in the current context.
    fn create(&self) -> Option<Self::Event>;
    /// Records `event` on `stream`; false on an error.
    fn record(&self, event: Self::Event, stream: StreamRef) -> bool;
    /// Whether the GPU has passed `event`.
    fn query(&self, event: Self::Event) -> Query;
    /// GPU time between two events the GPU has passed, ns.
    fn elapsed_ns(&self, start: Self::Event, end: Self::Event) -> Option<u64>;
    /// Destroys `event`.
    fn destroy(&self, event: Self::Event);
    /// Whether `stream` is being captured into a graph (`None`: cannot tell). Events recorded
    /// on a capturing stream would become nodes of the application's graph.
    fn capturing(&self, stream: StreamRef) -> Option<bool>;
}

/// One sample as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// GPU time between the pair's events, ns.
    pub elapsed_ns: u64,
    /// Launches it stands for.
    pub launches: u64,
}

/// What can go wrong with a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// An event call failed; the sample is dropped.
    EventError,
    /// A sample was not taken (all pairs pending, or a capturing stream); its launches go to
    /// the next one.
    Skipped,
}

/// Where samples go (the region's shard of the thread, in the limiter).
pub trait Samples<L> {
    /// A sample of a launch on `device` labelled `label` (its kernel's name).
    fn sample(&self, device: usize, label: &L, sample: Sample);
    /// A problem.
    fn problem(&self, problem: Problem);
}

/// A pair recorded before a launch, waiting for the launch's outcome.
#[derive(Debug)]
pub struct Begun<E> {
    context: u64,
    stream: StreamRef,
    shape: Shape,
    start: E,
    end: E,
}

#[derive(Debug)]
struct InFlight<E, L> {
    context: u64,
    shape: Shape,
    start: E,
    end: E,
    device: usize,
    label: L,
    launches: u64,
}

/// One thread's sampling state: its pacer, the launches the next sample stands for, the pairs in
/// flight and the idle pairs.
#[derive(Debug)]
pub struct ThreadSampler<E, L> {
    pacer: Pacer,
    /// The interval that ends at the sample point now being handled.
    assigned: u32,
    /// Launches the next sample stands for (skipped samples' included).
    weight: u64,
    in_flight: VecDeque<InFlight<E, L>>,
    /// Idle pairs and their context.
    pool: Vec<(u64, E, E)>,
    /// The recent samples of each launch shape.
    slices: SliceFilter,
}

impl<E: Copy, L> ThreadSampler<E, L> {
    /// A thread's sampler: its first launch is sampled.
    pub fn new(rate: SampleRate, seed: u64) -> ThreadSampler<E, L> {
        ThreadSampler {
            pacer: Pacer::new(rate, seed),
            assigned: 1,
            weight: 0,
            in_flight: VecDeque::with_capacity(MAX_PENDING),
            pool: Vec::with_capacity(POOL_PAIRS),
            slices: SliceFilter::default(),
        }
    }

    /// A sample point: the launch now being made ends the current interval. Returns the
    /// interval's launches (for [`ThreadSampler::reschedule`]).
    pub fn arrive(&mut self) -> u32 {
        self.weight = self.weight.saturating_add(u64::from(self.assigned));
        self.assigned
    }

    /// The launches until the next sample point, after one that came `launches` launches and
    /// `elapsed_ns` after the previous one.
    pub fn reschedule(&mut self, launches: u32, elapsed_ns: u64) -> u32 {
        self.assigned = self.pacer.next(launches, elapsed_ns);
        self.assigned
    }

    /// Whether sampling is on.
    pub fn enabled(&self) -> bool {
        self.pacer.rate != SampleRate::Off
    }

    /// Reads back every pair in flight that the GPU has finished (never waits).
    pub fn poll<D: Events<Event = E>>(&mut self, events: &D, sink: &impl Samples<L>) {
        let mut i = 0;
        while i < self.in_flight.len() {
            match events.query(self.in_flight[i].end) {
                Query::NotReady => i += 1,
                Query::Done => {
                    let f = self.in_flight.remove(i).expect("an index below len");
                    match events.elapsed_ns(f.start, f.end) {
                        Some(ns) => sink.sample(
                            f.device,
                            &f.label,
                            Sample {
                                elapsed_ns: self.slices.count(f.shape, ns),
                                launches: f.launches,
                            },
                        ),
                        None => sink.problem(Problem::EventError),
                    }
                    self.keep(events, (f.context, f.start, f.end));
                }
                Query::Failed => {
                    let f = self.in_flight.remove(i).expect("an index below len");
                    sink.problem(Problem::EventError);
                    events.destroy(f.start);
                    events.destroy(f.end);
                }
            }
        }
    }

    /// Records a pair's first event on `stream` before the launch of `shape` (after polling),
    /// or `None` (counted) when the sample cannot be taken: its launches go to the next sample.
    pub fn begin<D: Events<Event = E>>(
        &mut self,
        events: &D,
        context: u64,
        (stream, shape): (StreamRef, Shape),
        sink: &impl Samples<L>,
    ) -> Option<Begun<E>> {
        if self.in_flight.len() >= MAX_PENDING || events.capturing(stream) != Some(false) {
            sink.problem(Problem::Skipped);
            return None;
        }
        let (start, end) = match self.pool.iter().rposition(|p| p.0 == context) {
            Some(i) => {
                let (_, s, e) = self.pool.swap_remove(i);
                (s, e)
            }
            None => {
                let Some(start) = events.create() else {
                    sink.problem(Problem::EventError);
                    return None;
                };
                let Some(end) = events.create() else {
                    events.destroy(start);
                    sink.problem(Problem::EventError);
                    return None;
                };
                (start, end)
            }
        };
        if !events.record(start, stream) {
            sink.problem(Problem::EventError);
            events.destroy(start);
            events.destroy(end);
            return None;
        }
        Some(Begun {
            context,
            stream,
            shape,
            start,
            end,
        })
    }

    /// After the launch: records the pair's second event if the launch succeeded, and keeps the
    /// pair in flight for `device` and `label`, standing for the launches since the previous
    /// sample.
    pub fn end<D: Events<Event = E>>(
        &mut self,
        events: &D,
        begun: Begun<E>,
        launched: bool,
        (device, label): (usize, L),
        sink: &impl Samples<L>,
    ) {
        if !launched {
            // The launch failed: nothing ran; its launches count with the next sample.
            self.keep(events, (begun.context, begun.start, begun.end));
            return;
        }
        if !events.record(begun.end, begun.stream) {
            sink.problem(Problem::EventError);
            events.destroy(begun.start);
            events.destroy(begun.end);
            return;
        }
        self.in_flight.push_back(InFlight {
            context: begun.context,
            shape: begun.shape,
            start: begun.start,
            end: begun.end,
            device,
            label,
            launches: std::mem::take(&mut self.weight),
        });
    }

    /// Keeps an idle pair for reuse, or destroys the oldest idle one to make room.
    fn keep<D: Events<Event = E>>(&mut self, events: &D, pair: (u64, E, E)) {
        if self.pool.len() >= POOL_PAIRS {
            let (_, s, e) = self.pool.remove(0);
            events.destroy(s);
            events.destroy(e);
        }
        self.pool.push(pair);
    }

    /// Pairs in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Samples capped because another context's time slice fell inside them, and the time
    /// removed from them, ns ([`slices`]).
    pub fn capped(&self) -> (u64, u64) {
        self.slices.capped()
    }
}

#[cfg(test)]
pub(crate) mod fake_gpu;

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::fake_gpu::FakeGpu;
    use super::*;

    #[derive(Default)]
    struct Sink {
        samples: RefCell<Vec<(usize, &'static str, Sample)>>,
        errors: Cell<u64>,
        skipped: Cell<u64>,
    }

    impl Samples<&'static str> for Sink {
        fn sample(&self, device: usize, label: &&'static str, sample: Sample) {
            self.samples.borrow_mut().push((device, label, sample));
        }
        fn problem(&self, p: Problem) {
            match p {
                Problem::EventError => self.errors.set(self.errors.get() + 1),
                Problem::Skipped => self.skipped.set(self.skipped.get() + 1),
            }
        }
    }

    const STREAM: StreamRef = StreamRef {
        handle: 0,
        per_thread: false,
    };

    fn shape_of(kernel: &str) -> Shape {
        Shape::kernel(
            kernel.len() as u64,
            [kernel.as_bytes()[0].into(), 1, 1],
            [1; 3],
            0,
        )
    }

    /// Drives a sampler the way the launch hook does: a countdown per launch, and at a sample
    /// point poll, begin, launch, end, reschedule.
    struct Driven {
        sampler: ThreadSampler<u32, &'static str>,
        countdown: u32,
        /// CPU time between launches, as the pacer is told.
        gap_ns: u64,
    }

    impl Driven {
        fn new(rate: SampleRate) -> Driven {
            Driven {
                sampler: ThreadSampler::new(rate, 7),
                countdown: 0,
                gap_ns: 1_000,
            }
        }

        fn launch(&mut self, gpu: &FakeGpu, sink: &Sink, kernel: &'static str, ns: u64) {
            if self.countdown > 1 {
                self.countdown -= 1;
                gpu.launch(ns);
                return;
            }
            let launches = self.sampler.arrive();
            self.sampler.poll(gpu, sink);
            let begun = self.sampler.begin(gpu, 1, (STREAM, shape_of(kernel)), sink);
            gpu.launch(ns);
            if let Some(b) = begun {
                self.sampler.end(gpu, b, true, (0, kernel), sink);
            }
            self.countdown = self
                .sampler
                .reschedule(launches, u64::from(launches) * self.gap_ns);
        }
    }

    #[test]
    fn every_launch_sampled_gives_each_kernels_exact_time() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut d = Driven::new(SampleRate::Every(1));
        for i in 0..100 {
            let (name, ns) = if i % 4 == 0 {
                ("big", 300)
            } else {
                ("small", 100)
            };
            d.launch(&gpu, &sink, name, ns);
            gpu.advance(1_000);
        }
        d.sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        assert_eq!(samples.len(), 100);
        let total = |k: &str| -> u64 {
            samples
                .iter()
                .filter(|s| s.1 == k)
                .map(|s| s.2.elapsed_ns * s.2.launches)
                .sum()
        };
        assert_eq!(total("big"), 25 * 300);
        assert_eq!(total("small"), 75 * 100);
        assert_eq!(sink.errors.get() + sink.skipped.get(), 0);
        assert!(gpu.live.get() <= 2 * POOL_PAIRS as i32, "pairs are reused");
    }

    /// One in N: each sample stands for the launches since the previous one, so the weights add
    /// up to the launches and the estimate to the truth when every launch takes as long.
    #[test]
    fn a_sample_stands_for_the_launches_since_the_previous_one() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut d = Driven::new(SampleRate::Every(10));
        for _ in 0..1_000 {
            d.launch(&gpu, &sink, "k", 50);
            gpu.advance(100);
        }
        d.sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        assert_eq!(samples.len(), 100);
        // The first launch, then every tenth: the last nine launches wait for the next sample.
        let launches: u64 = samples.iter().map(|s| s.2.launches).sum();
        assert_eq!(launches, 1 + 99 * 10);
        assert!(samples.iter().all(|s| s.2.elapsed_ns == 50));
    }

    /// Random intervals: a loop of three kernels in a fixed order is estimated without bias
    /// (a fixed interval of 3 would only ever see one of them).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "statistical: 300,000 launches (the sampler's logic is the other tests')"
    )]
    fn random_intervals_do_not_alias_with_a_fixed_launch_order() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut d = Driven::new(SampleRate::Adaptive { per_second: 1 });
        // 12 launches per second at 1 sample per second: a mean interval of 12.
        d.gap_ns = 1_000_000_000 / 12;
        let kernels = [("a", 100u64), ("b", 200), ("c", 700)];
        let n = 300_000;
        for i in 0..n {
            let (name, ns) = kernels[i % 3];
            d.launch(&gpu, &sink, name, ns);
            gpu.advance(1_000);
        }
        d.sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        let estimate = |k: &str| -> f64 {
            samples
                .iter()
                .filter(|s| s.1 == k)
                .map(|s| (s.2.elapsed_ns * s.2.launches) as f64)
                .sum()
        };
        for (name, ns) in kernels {
            let truth = (n / 3) as f64 * ns as f64;
            let err = (estimate(name) - truth).abs() / truth;
            assert!(err < 0.1, "{name}: {} vs {truth}", estimate(name));
        }
        assert!(
            d.sampler.pacer.mean() > 6 && d.sampler.pacer.mean() < 24,
            "{}",
            d.sampler.pacer.mean()
        );
    }

    #[test]
    fn the_adaptive_interval_follows_the_launch_rate() {
        let mut p = Pacer::new(SampleRate::Adaptive { per_second: 200 }, 1);
        // 1,000,000 launches per second: 5,000 per sample.
        let mut next = 1;
        for _ in 0..40 {
            next = p.next(next, u64::from(next) * 1_000);
        }
        assert!((4_000..6_000).contains(&p.mean()), "{}", p.mean());
        // 100 launches per second: every launch (fewer launches than the target rate).
        for _ in 0..40 {
            next = p.next(next, u64::from(next) * 10_000_000);
        }
        assert_eq!(p.mean(), 1);
        assert_eq!(Pacer::new(SampleRate::Off, 1).next(1, 1), u32::MAX);
        // The first sample point says nothing of the rate.
        let mut first = Pacer::new(SampleRate::Adaptive { per_second: 200 }, 1);
        assert_eq!(first.next(1, 0), 1);
        assert_eq!(first.mean(), 1);
        assert_eq!(Pacer::new(SampleRate::Every(0), 1).next(1, 1), 1);
        // A burst of queued launches (2 in 2 us reads as a million a second) grows the interval
        // at most twofold per sample point, not to 5,000 at once.
        let mut burst = Pacer::new(SampleRate::Adaptive { per_second: 200 }, 1);
        burst.next(2, 2_000);
        assert_eq!(burst.mean(), 2);
        burst.next(2, 2_000);
        assert_eq!(burst.mean(), 4);
    }

    /// A GPU far behind: pairs stay pending, samples due meanwhile are skipped (counted) and
    /// their launches carried to the next sample taken; nothing waits.
    #[test]
    fn a_gpu_far_behind_skips_samples_and_carries_their_launches() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut d = Driven::new(SampleRate::Every(1));
        for _ in 0..20 {
            d.launch(&gpu, &sink, "k", 1_000_000);
        }
        assert_eq!(d.sampler.in_flight(), MAX_PENDING);
        assert_eq!(sink.skipped.get(), 20 - MAX_PENDING as u64);
        gpu.advance(100_000_000);
        d.launch(&gpu, &sink, "k", 1);
        gpu.advance(100_000_000);
        d.sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        let launches: u64 = samples.iter().map(|s| s.2.launches).sum();
        assert_eq!(launches, 21, "every launch is stood for");
    }

    /// Another context's time slice between a pair's events (one sample in five, 2 ms) is not
    /// counted as the launch's time once the shape's history is known.
    #[test]
    fn another_contexts_slice_inside_a_pair_is_not_the_launchs_time() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut sampler: ThreadSampler<u32, &'static str> =
            ThreadSampler::new(SampleRate::Every(1), 7);
        for i in 0..200 {
            sampler.arrive();
            sampler.poll(&gpu, &sink);
            let begun = sampler
                .begin(&gpu, 1, (STREAM, shape_of("k")), &sink)
                .expect("a pair");
            if i % 5 == 4 {
                // The other context's slice runs after the first event, before the launch.
                gpu.launch(2_000_000);
            }
            gpu.launch(30_000);
            sampler.end(&gpu, begun, true, (0, "k"), &sink);
            sampler.reschedule(1, 1_000);
            gpu.advance(3_000_000);
        }
        sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        assert_eq!(samples.len(), 200);
        let counted: u64 = samples
            .iter()
            .skip(MIN_HISTORY_SKIP)
            .map(|s| s.2.elapsed_ns)
            .sum();
        assert_eq!(counted, (200 - MIN_HISTORY_SKIP as u64) * 30_000);
        assert_eq!(sampler.capped().0, 39, "every hit past the first");
    }

    /// Samples before the history of a shape is long enough: the first hit (sample 4) among them.
    const MIN_HISTORY_SKIP: usize = slices::MIN_HISTORY;

    /// A capturing stream is never given events (they would become graph nodes), and failing
    /// event calls drop the sample without leaking events.
    #[test]
    fn capture_and_errors_skip_the_sample() {
        let (gpu, sink) = (FakeGpu::default(), Sink::default());
        let mut d = Driven::new(SampleRate::Every(1));
        gpu.capturing.set(true);
        d.launch(&gpu, &sink, "k", 10);
        assert_eq!((sink.skipped.get(), gpu.live.get()), (1, 0));
        gpu.capturing.set(false);
        gpu.fail_records.set(true);
        d.launch(&gpu, &sink, "k", 10);
        assert_eq!(sink.errors.get(), 1);
        assert_eq!(gpu.live.get(), 0, "the pair is destroyed");
        gpu.fail_records.set(false);
        d.launch(&gpu, &sink, "k", 10);
        gpu.advance(100);
        d.sampler.poll(&gpu, &sink);
        let samples = sink.samples.borrow();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].2.launches, 3);
    }
}
