//! Sampled GPU time: each thread's sampler (`limiter_core::gpu_time`) over the real driver's
//! events, writing what it reads back into the thread's shard of the region.
//!
//! The launch hook counts each launch down in the thread's words; only when the countdown runs
//! out (a sample point) does it come here, out of line: [`begin`] reads back the pairs in
//! flight that the GPU has finished, records the first event of a pair on the launch's stream,
//! and sets the next countdown; after the launch, [`end`] records the second event. Between
//! sample points a launch pays one decrement and one branch. Without a region (no agent can read
//! the figures), without the event functions in the driver, or with `VGPU_GPU_TIME_SAMPLE=0`, the
//! countdown is set to its maximum and nothing is sampled.

use std::cell::RefCell;

use limiter_core::gpu_time::{Begun, Problem, Sample, Samples, Shape, StreamRef, ThreadSampler};
use region::{GpuSample, KernelName, SampleProblem, ShardWriter};

use super::{process::Process, state::State};
use crate::platform::{cuda::CUfunction, driver::DriverEvents, log, thread_words::ThreadWords};

/// What was launched at a sample point.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Launched {
    /// A kernel (a `CUfunction`, or a library `CUkernel` passed as one).
    Kernel(CUfunction),
    /// A graph, timed as one item.
    Graph,
}

/// The launch at a sample point: what and on which stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub(crate) launched: Launched,
    pub(crate) stream: StreamRef,
    /// The launch's shape (kernel and geometry, or graph), whose recent samples tell another
    /// context's time slice inside a pair from the launch's own time.
    pub(crate) shape: Shape,
}

/// A sampled launch between its two events.
#[derive(Debug)]
pub(crate) struct InProgress {
    begun: Begun<usize>,
    device: usize,
    label: KernelName,
}

/// The label of launched graphs.
const GRAPH: &[u8] = b"graph";
/// The label of a kernel whose name the driver does not give.
const UNNAMED: &[u8] = b"(unnamed)";

/// A thread's sampling state.
struct Thread {
    sampler: ThreadSampler<usize, KernelName>,
    /// `None`: the driver lacks a function the sampler needs.
    events: Option<DriverEvents>,
    /// Clock reading of the previous sample point.
    last: u64,
    /// Clock reading of the previous debug line on capped samples.
    logged: u64,
}

/// How often a thread logs its capped samples (at `LIBCUDA_LOG_LEVEL=4`).
const CAPPED_LOG_NS: u64 = 5_000_000_000;

thread_local! {
    /// This thread's sampler; created at its first sample point (its first launch).
    static SAMPLER: RefCell<Option<Thread>> = const { RefCell::new(None) };
}

/// Where samples go: this thread's shard.
struct ShardSink(&'static ShardWriter<'static>);

impl Samples<KernelName> for ShardSink {
    fn sample(&self, device: usize, label: &KernelName, s: Sample) {
        let sample = GpuSample {
            elapsed_ns: s.elapsed_ns,
            launches: s.launches,
        };
        self.0.record_gpu_sample(device, sample);
        self.0.record_kernel_sample(label, sample);
    }

    fn problem(&self, problem: Problem) {
        self.0.count_sample_problem(match problem {
            Problem::EventError => SampleProblem::EventError,
            Problem::Skipped => SampleProblem::Skipped,
        });
    }
}

/// No more sample points on this thread (sampling is off or cannot work).
fn stop(words: &ThreadWords) {
    words.sample_countdown.set(u32::MAX);
}

/// A sample point, before the launch: see the module documentation. `None`: this launch is not
/// timed.
#[cold]
#[inline(never)]
pub(crate) fn begin(
    state: &'static State,
    process: &'static Process,
    words: &ThreadWords,
    target: impl FnOnce() -> Target,
) -> Option<InProgress> {
    let Some(writer) = process.ledger.region().and_then(|l| l.thread_writer()) else {
        stop(words);
        return None;
    };
    SAMPLER
        .try_with(|cell| {
            let mut cell = cell.try_borrow_mut().ok()?;
            let thread = cell.get_or_insert_with(|| Thread {
                sampler: ThreadSampler::new(
                    state.config.gpu_time_sample,
                    std::ptr::from_ref(words) as u64,
                ),
                events: state.driver.events(),
                last: 0,
                logged: 0,
            });
            let Some(events) = thread.events.filter(|_| thread.sampler.enabled()) else {
                stop(words);
                return None;
            };
            let now = state.clock.now();
            let launches = thread.sampler.arrive();
            let elapsed = if thread.last == 0 {
                0
            } else {
                state.clock.get().ns_between(thread.last, now)
            };
            thread.last = now;
            if state.clock.get().ns_between(thread.logged, now) >= CAPPED_LOG_NS {
                thread.logged = now;
                let (capped, removed_ns) = thread.sampler.capped();
                log::debug!(
                    state.config.log_level,
                    "GPU time: {capped} samples capped so far on this thread ({} ms of other \
                     contexts' time slices left out)",
                    removed_ns / 1_000_000
                );
            }
            words
                .sample_countdown
                .set(thread.sampler.reschedule(launches, elapsed));
            let sink = ShardSink(writer);
            let target = target();
            events.relaxed(|| {
                thread.sampler.poll(&events, &sink);
                let context = events.current_context();
                let begun =
                    thread
                        .sampler
                        .begin(&events, context, (target.stream, target.shape), &sink)?;
                let label = match target.launched {
                    Launched::Graph => KernelName::new(GRAPH),
                    Launched::Kernel(f) => {
                        KernelName::new(events.function_name(f).map_or(UNNAMED, |n| n.to_bytes()))
                    }
                };
                Some(InProgress {
                    begun,
                    device: state.current_device(),
                    label,
                })
            })
        })
        .ok()
        .flatten()
}

/// After a sampled launch: records the pair's second event (or takes the pair back if the
/// launch failed).
#[cold]
#[inline(never)]
pub(crate) fn end(process: &'static Process, sampled: InProgress, launched: bool) {
    let Some(writer) = process.ledger.region().and_then(|l| l.thread_writer()) else {
        return;
    };
    let _ = SAMPLER.try_with(|cell| {
        let Ok(mut cell) = cell.try_borrow_mut() else {
            return;
        };
        let Some(thread) = cell.as_mut() else {
            return;
        };
        let Some(events) = thread.events else {
            return;
        };
        let InProgress {
            begun,
            device,
            label,
        } = sampled;
        thread.sampler.end(
            &events,
            begun,
            launched,
            (device, label),
            &ShardSink(writer),
        );
    });
}
