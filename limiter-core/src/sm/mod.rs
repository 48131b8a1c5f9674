//! The SM share controller (`CUDA_DEVICE_SM_LIMIT`): a closed-loop duty cycle per device, shared
//! by every process of the container.
//!
//! With no limit (unset, 0 or 100) on any device the launch path pays one relaxed load of
//! [`Controller::active`] and one predictable branch: no clock read, no shared write, no thread.
//!
//! Limited to `s`% on a device, launches run freely during an *active window*. The first launch
//! after the window has lasted its budget (`s`% of the period `P`, `VGPU_SM_PERIOD_MS`, default
//! 100 ms) closes it: its process drains its work (the real `cuCtxSynchronize`: work queued in
//! the window runs to its end, so the wait counts as GPU time), measures `busy = drain end -
//! window start`, and launches are held back until `busy * (100 - s) / s` later. The window's
//! share of wall time is then `busy / (busy + idle) = s`% whatever the queue depth or kernel
//! length: the loop closes on what the device actually took, not on a launch count.
//!
//! The window's words ([`Window`]) are the container's: in the region (`region::SmShare`), so
//! every process of the container draws from the same window (a process without a region has its
//! own). Each process that finds the budget spent drains its own work and closes the window with
//! its own drain end, and one that launched in a window someone else closed drains before it
//! waits; the resume time only grows, so the latest end among them sets the idle time. Nothing is
//! locked: a process killed anywhere leaves a window the others close and reopen without it
//! ([`window`]). Threads of a process share the window the same way. The time a launch is held
//! back (drain wait and sleep) is recorded as the thread's `throttled_ns` in the region.
//!
//! The windows use the container's *effective* share, not the target: it starts at the target and
//! the feedback loop ([`feedback`]), run by one process of the container, corrects it when the
//! container gets less (or more) of the device than its duty cycle, e.g. because other contexts
//! time-slice the GPU, measured by the GPU time the container's limiters sample ([`gpu_share`])
//! or by NVML's samples ([`samples`]). A limited launch reads it from the window's `duty` word.
//!
//! Limits of the model (see docs/sm-limit.md): a window's wall time counts as busy, so a process
//! that launches while mostly busy on the CPU is held to `s`% of its *launching* time; a launch
//! gap longer than `P` starts a new window (the device cannot be told apart from an idle one
//! without device timestamps).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use agent_common::MAX_DEVICES;

mod env;
pub mod feedback;
pub mod gpu_share;
pub mod samples;
mod window;

pub use env::{Env, View, Window};
pub use window::{MAX_HOLD_NS, note_unlimited};

/// The duty cycle, in per mille, that `target` percent runs at given the window's `duty` word:
/// the feedback loop's correction if it was made for this target, else the target itself.
pub fn effective_permille(target: u8, duty: Option<(u8, u16)>) -> u16 {
    match duty {
        Some((t, pm)) if t == target && pm != 0 => pm.min(1000),
        _ => u16::from(target) * 10,
    }
}

/// The SM limits of this process and its place in the windows.
#[derive(Debug)]
pub struct Controller {
    /// Whether any device is limited: the only thing an unlimited launch reads.
    active: AtomicBool,
    /// Share per device in percent; 0 = unlimited. The target: what the user set.
    percent: [AtomicU8; MAX_DEVICES],
    period_ns: AtomicU64,
    /// Per device, the start of the window this process last launched in (0: none, or drained
    /// since): a process that launched in a window another one closed drains before it waits.
    marks: [AtomicU64; MAX_DEVICES],
    /// Per device, the share the container's QoS tier is allocated now, percent (0: none):
    /// launches run at the smaller of it and `percent` ([`Controller::target`]).
    qos: [AtomicU8; MAX_DEVICES],
    /// Per device: a best-effort container beside a latency-tier one; launches wait while the
    /// latency tenant's work is in flight.
    gated: [AtomicBool; MAX_DEVICES],
    /// Whether any device is gated: the one word a launch reads to know that its thread's
    /// backlog is bounded (`qos::backlog`).
    gating: AtomicBool,
    /// Per device: a container with a QoS tier; launches note that it is launching (its
    /// activity, and for the latency tier, that its work is in flight).
    tiered: [AtomicBool; MAX_DEVICES],
}

/// The longest a best-effort launch waits for latency-tier work in one go: a latency tenant that
/// never stops (or a board that says so) slows best-effort work down, never stops it.
pub const MAX_GATE_WAIT_NS: u64 = 1_000_000_000;

impl Controller {
    pub const fn new() -> Controller {
        Controller {
            active: AtomicBool::new(false),
            percent: [const { AtomicU8::new(0) }; MAX_DEVICES],
            period_ns: AtomicU64::new(crate::config::DEFAULT_SM_PERIOD_MS * 1_000_000),
            marks: [const { AtomicU64::new(0) }; MAX_DEVICES],
            qos: [const { AtomicU8::new(0) }; MAX_DEVICES],
            gated: [const { AtomicBool::new(false) }; MAX_DEVICES],
            gating: AtomicBool::new(false),
            tiered: [const { AtomicBool::new(false) }; MAX_DEVICES],
        }
    }

    /// Sets the share of every device (`None`, 0 or 100: unlimited) and the period.
    pub fn set_limits(&self, percent: &[Option<u8>; MAX_DEVICES], period_ms: u64) {
        // Relaxed (all): configuration read by launches; a launch that sees the old value for a
        // moment behaves as just before the change.
        self.period_ns
            .store(period_ms.max(1) * 1_000_000, Ordering::Relaxed);
        for (slot, p) in self.percent.iter().zip(percent) {
            let p = p.filter(|&p| p > 0 && p < 100).unwrap_or(0);
            slot.store(p, Ordering::Relaxed);
        }
        self.refresh_active();
    }

    /// Sets the share the container's QoS tier is allocated on `device` (`None`, 0 or 100: the
    /// whole device).
    pub fn set_qos(&self, device: usize, percent: Option<u8>) {
        if let Some(slot) = self.qos.get(device) {
            // Relaxed: as `set_limits`.
            slot.store(
                percent.filter(|&p| p > 0 && p < 100).unwrap_or(0),
                Ordering::Relaxed,
            );
            self.refresh_active();
        }
    }

    /// Gates `device`'s launches on a latency-tier neighbour's work (this container is best
    /// effort beside one), or stops.
    pub fn set_gate(&self, device: usize, gated: bool) {
        if let Some(slot) = self.gated.get(device) {
            // Relaxed: as `set_limits`.
            slot.store(gated, Ordering::Relaxed);
            // Relaxed (both): as `set_limits`.
            let any = self.gated.iter().any(|g| g.load(Ordering::Relaxed));
            self.gating.store(any, Ordering::Relaxed);
            self.refresh_active();
        }
    }

    /// Whether `device`'s launches are gated on a latency-tier neighbour.
    pub fn gated(&self, device: usize) -> bool {
        // Relaxed: a configuration flag.
        self.gated
            .get(device)
            .is_some_and(|g| g.load(Ordering::Relaxed))
    }

    /// Whether any device's launches are gated (their threads' backlogs are bounded).
    #[inline(always)]
    pub fn gating(&self) -> bool {
        // Relaxed: a configuration flag; a launch that sees the old value behaves as just
        // before the change.
        self.gating.load(Ordering::Relaxed)
    }

    /// Marks `device`'s launches as a QoS-tiered container's (each notes that it launched), or
    /// stops.
    pub fn set_tiered(&self, device: usize, tiered: bool) {
        if let Some(slot) = self.tiered.get(device) {
            // Relaxed: as `set_limits`.
            slot.store(tiered, Ordering::Relaxed);
            self.refresh_active();
        }
    }

    fn refresh_active(&self) {
        let any = (0..MAX_DEVICES).any(|d| {
            // Relaxed: configuration values.
            self.target(d) != 0
                || self.gated[d].load(Ordering::Relaxed)
                || self.tiered[d].load(Ordering::Relaxed)
        });
        // Relaxed: see `admit`; a launch that sees the old flag behaves as before the change.
        self.active.store(any, Ordering::Relaxed);
    }

    /// The share of `device` the user set, in percent (0: unlimited): the ceiling.
    pub fn percent(&self, device: usize) -> u8 {
        // Relaxed: a configuration value.
        self.percent
            .get(device)
            .map_or(0, |p| p.load(Ordering::Relaxed))
    }

    /// The share of `device` launches run at now, percent (0: unlimited): the smaller of the
    /// user's ceiling and the QoS tier's allocation.
    pub fn target(&self, device: usize) -> u8 {
        let whole = |p: u8| if p == 0 { 100 } else { p };
        // Relaxed: a configuration value.
        let qos = self
            .qos
            .get(device)
            .map_or(0, |q| q.load(Ordering::Relaxed));
        let t = whole(self.percent(device)).min(whole(qos));
        if t >= 100 { 0 } else { t }
    }

    /// Whether any device is limited.
    pub fn active(&self) -> bool {
        // Relaxed: a configuration flag.
        self.active.load(Ordering::Relaxed)
    }

    /// Called before every launch: returns at once when nothing is limited (`env` is not even
    /// built), else holds the launch back as the device's duty cycle requires and returns the
    /// time it was held.
    #[inline(always)]
    pub fn admit<E: Env>(&self, env: impl FnOnce() -> E) -> u64 {
        // Relaxed: a configuration flag (see `set_limits`).
        if !self.active.load(Ordering::Relaxed) {
            return 0;
        }
        self.admit_limited(&env())
    }

    #[cold]
    #[inline(never)]
    fn admit_limited<E: Env>(&self, env: &E) -> u64 {
        let Some(device) = env.device().filter(|&d| d < MAX_DEVICES) else {
            return 0;
        };
        let mut held = 0;
        // Relaxed (both): configuration flags.
        if self.gated[device].load(Ordering::Relaxed) {
            held = wait_for_latency(env, device);
        }
        let tiered = self.tiered[device].load(Ordering::Relaxed);
        let target = self.target(device);
        if target == 0 {
            // No window to run in: note the launch for the tier's activity (with a window, its
            // own bookkeeping does, and a note here would hide the gaps that start windows).
            if tiered {
                env.mark_launch(device, env.now_ns());
                env.tiered_launch(device);
            }
            return held;
        }
        let Some(w) = env.window(device) else {
            return held;
        };
        let pm = u64::from(effective_permille(target, w.duty()));
        // Relaxed: a configuration value.
        let period = self.period_ns.load(Ordering::Relaxed);
        held += window::admit(env, &w, &self.marks[device], pm, period);
        if tiered {
            env.tiered_launch(device);
        }
        held
    }
}

/// A best-effort launch beside a latency tenant: waits while the latency tenant's work is in
/// flight, at most [`MAX_GATE_WAIT_NS`]; returns the time it waited.
fn wait_for_latency<E: Env>(env: &E, device: usize) -> u64 {
    let start = env.now_ns();
    let mut now = start;
    loop {
        let until = env.latency_until(device);
        if until <= now || now - start >= MAX_GATE_WAIT_NS {
            return now - start;
        }
        env.sleep_until(until.min(start + MAX_GATE_WAIT_NS));
        now = env.now_ns();
    }
}

impl Default for Controller {
    fn default() -> Controller {
        Controller::new()
    }
}

#[cfg(test)]
mod tests {
    //! The controller against a simulated device in virtual time: deterministic, so the steady-state
    //! error is checked tightly across kernel lengths, queue depths and numbers of processes sharing
    //! one window.

    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Condvar, Mutex};

    use super::*;

    /// Duty-cycle words with the region's semantics (`region::SmShare`): `start` and `resume` only
    /// grow; a close that moves the resume past the window's start records it.
    #[derive(Default)]
    struct Words {
        start: AtomicU64,
        last: AtomicU64,
        resume: AtomicU64,
        closed: AtomicU64,
        closes: AtomicU64,
        duty: AtomicU64,
    }

    impl Window for Words {
        fn view(&self) -> View {
            View {
                start: self.start.load(Relaxed),
                last: self.last.load(Relaxed),
                resume: self.resume.load(Relaxed),
                closed: self.closed.load(Relaxed),
            }
        }
        fn open(&self, now: u64) {
            self.start.fetch_max(now, Relaxed);
            self.last.store(now, Relaxed);
        }
        fn touch(&self, now: u64) {
            self.last.store(now, Relaxed);
        }
        fn close(&self, start: u64, resume: u64) {
            let before = self.resume.fetch_max(resume, Relaxed);
            if before <= start && resume > start {
                self.closed.fetch_max(start, Relaxed);
                self.closes.fetch_add(1, Relaxed);
            }
        }
        fn repair(&self, seen: View) {
            let _ = self.start.compare_exchange(seen.start, 0, Relaxed, Relaxed);
            let _ = self
                .resume
                .compare_exchange(seen.resume, 0, Relaxed, Relaxed);
            let _ = self.last.compare_exchange(seen.last, 0, Relaxed, Relaxed);
            let _ = self
                .closed
                .compare_exchange(seen.closed, 0, Relaxed, Relaxed);
        }
        fn duty(&self) -> Option<(u8, u16)> {
            let w = self.duty.load(Relaxed);
            (w != 0).then_some(((w >> 16) as u8, w as u16))
        }
    }

    /// A device in virtual time for one process: launches queue work after earlier work; the
    /// workload costs 2 us of CPU per launch and synchronises every `sync_every` launches.
    struct Sim {
        now: Cell<u64>,
        busy_until: Cell<u64>,
        /// Device-busy nanoseconds launched so far.
        busy: Cell<u64>,
        drains: Cell<u32>,
        words: Words,
    }

    impl Sim {
        fn new(now: u64) -> Sim {
            Sim {
                now: Cell::new(now),
                busy_until: Cell::new(0),
                busy: Cell::new(0),
                drains: Cell::new(0),
                words: Words::default(),
            }
        }
    }

    impl<'a> Env for &'a Sim {
        type Window = &'a Words;
        fn device(&self) -> Option<usize> {
            Some(0)
        }
        fn window(&self, _: usize) -> Option<&'a Words> {
            Some(&self.words)
        }
        fn now_ns(&self) -> u64 {
            self.now.get()
        }
        fn drain(&self) {
            self.drains.set(self.drains.get() + 1);
            self.now.set(self.now.get().max(self.busy_until.get()));
        }
        fn sleep_until(&self, t: u64) {
            // A real sleep overshoots a little.
            self.now.set(self.now.get().max(t) + 60_000);
        }
        fn mark_launch(&self, _: usize, now: u64) {
            note_unlimited(&self.words, now);
        }
    }

    struct Run {
        share: f64,
        throttled_ns: u64,
        wall_ns: u64,
    }

    /// Runs a saturating workload for `seconds` of virtual time and returns the device's busy share
    /// after the first second.
    fn run(pct: u8, kernel_ns: u64, sync_every: u64, seconds: u64) -> Run {
        run_on(&limited(pct), None, kernel_ns, sync_every, seconds)
    }

    /// A controller with device 0 limited to `pct`% (period 100 ms).
    fn limited(pct: u8) -> Controller {
        let c = Controller::new();
        let mut limits = [None; MAX_DEVICES];
        limits[0] = Some(pct);
        c.set_limits(&limits, 100);
        c
    }

    fn run_on(
        c: &Controller,
        duty: Option<u64>,
        kernel_ns: u64,
        sync_every: u64,
        seconds: u64,
    ) -> Run {
        let sim = Sim::new(1);
        if let Some(d) = duty {
            sim.words.duty.store(d, Relaxed);
        }
        let warm = 1_000_000_000;
        let end = seconds * 1_000_000_000;
        let (mut busy_at_warm, mut throttled) = (None, 0);
        let mut n = 0u64;
        while sim.now.get() < end {
            if busy_at_warm.is_none() && sim.now.get() >= warm {
                // Work launched but not yet run at the warm-up point belongs to the measured part.
                let queued = sim.busy_until.get().saturating_sub(sim.now.get());
                busy_at_warm = Some((sim.busy.get() - queued, sim.now.get()));
            }
            let held = c.admit(|| &sim);
            if busy_at_warm.is_some() {
                throttled += held;
            }
            let now = sim.now.get();
            sim.busy_until
                .set(sim.busy_until.get().max(now) + kernel_ns);
            sim.busy.set(sim.busy.get() + kernel_ns);
            sim.now.set(now + 2_000);
            n += 1;
            if n.is_multiple_of(sync_every) {
                sim.now.set(sim.now.get().max(sim.busy_until.get()));
            }
        }
        let (b0, t0) = busy_at_warm.unwrap();
        // Work still queued at the end has not run within the measured time.
        let queued = sim.busy_until.get().saturating_sub(sim.now.get());
        let wall = sim.now.get() - t0;
        Run {
            share: (sim.busy.get() - queued - b0) as f64 / wall as f64 * 100.0,
            throttled_ns: throttled,
            wall_ns: wall,
        }
    }

    #[test]
    fn steady_state_share_holds_across_kernel_lengths_and_queue_depths() {
        // Miri interprets every step of the simulation: two shares, the longer kernels, 3 s there.
        let (shares, cases, seconds): (&[u8], &[(u64, u64)], u64) = if cfg!(miri) {
            (&[25, 75], &[(2_000_000, 1), (30_000_000, 3)], 3)
        } else {
            (
                &[10, 25, 50, 75, 90],
                &[
                    (20_000, 1),
                    (20_000, 1_000),
                    (500_000, 8),
                    // The workload of limiter/tests/sm.rs: 500 us launches, 16 a step.
                    (500_000, 16),
                    (2_000_000, 1),
                    (30_000_000, 1),
                    (30_000_000, 3),
                ],
                20,
            )
        };
        for &pct in shares {
            for &(kernel_ns, sync_every) in cases {
                let r = run(pct, kernel_ns, sync_every, seconds);
                assert!(
                    (r.share - f64::from(pct)).abs() < 2.0,
                    "limit {pct}%, kernel {kernel_ns} ns, sync every {sync_every}: share {:.2}%",
                    r.share
                );
                // Held time is the rest of the wall time, less the workload's own waits/CPU time.
                assert!(r.throttled_ns < r.wall_ns);
            }
        }
    }

    #[test]
    fn unlimited_builds_no_environment() {
        let c = Controller::new();
        let env = || -> &Sim { panic!("an unlimited launch must not reach the environment") };
        assert_eq!(c.admit(env), 0);
        c.set_limits(&[Some(100); MAX_DEVICES], 100);
        assert_eq!(c.admit(env), 0);
        c.set_limits(&[Some(0); MAX_DEVICES], 100);
        assert_eq!(c.admit(env), 0);
        // Limited on another device only: the environment is asked for the device, nothing else.
        let mut limits = [None; MAX_DEVICES];
        limits[3] = Some(50);
        c.set_limits(&limits, 100);
        let sim = Sim::new(1);
        assert_eq!(c.admit(|| &sim), 0);
        assert_eq!(sim.drains.get(), 0);
        assert_eq!(sim.words.view(), View::default(), "no window on device 0");
    }

    #[test]
    fn a_launch_gap_longer_than_a_period_starts_a_new_window() {
        let c = limited(50);
        let sim = Sim::new(1_000);
        assert_eq!(c.admit(|| &sim), 0);
        // Ten idle seconds: not charged as busy time.
        sim.now.set(10_000_000_000);
        assert_eq!(c.admit(|| &sim), 0);
        assert_eq!(sim.drains.get(), 0);
        assert_eq!(sim.words.view().start, 10_000_000_000);
    }

    #[test]
    fn windows_use_the_duty_cycle_set_for_their_target() {
        assert_eq!(effective_permille(40, None), 400);
        assert_eq!(effective_permille(40, Some((40, 800))), 800);
        assert_eq!(
            effective_permille(40, Some((30, 500))),
            400,
            "made for another target"
        );
        assert_eq!(effective_permille(40, Some((40, 0))), 400);
        assert_eq!(effective_permille(40, Some((40, 5000))), 1000);
        let seconds = if cfg!(miri) { 3 } else { 20 };
        // The feedback loop's correction is what the duty cycle holds; the target stays.
        let c = limited(40);
        let r = run_on(&c, Some(40 << 16 | 800), 500_000, 8, seconds);
        assert!((r.share - 80.0).abs() < 2.0, "share {:.2}%", r.share);
        assert_eq!(c.percent(0), 40);
        // A correction made for another target is not used.
        let r = run_on(&c, Some(30 << 16 | 800), 500_000, 8, seconds);
        assert!((r.share - 40.0).abs() < 2.0, "share {:.2}%", r.share);
        // Unlimited: nothing is held whatever the word says.
        let mut limits = [None; MAX_DEVICES];
        limits[0] = None;
        c.set_limits(&limits, 100);
        assert_eq!(c.admit(|| -> &Sim { panic!("built the environment") }), 0);
    }

    #[test]
    fn a_window_from_another_boot_is_forgotten_not_waited_for() {
        let c = limited(50);
        let sim = Sim::new(5_000_000_000);
        // Times far ahead of this clock: a region file kept from a boot whose clock ran longer.
        sim.words.start.store(1 << 62, Relaxed);
        sim.words.resume.store(1 << 62, Relaxed);
        assert_eq!(c.admit(|| &sim), 0, "not held");
        assert_eq!(sim.words.view(), View::default());
        // The next launch opens a window of this boot.
        assert_eq!(c.admit(|| &sim), 0);
        assert_eq!(sim.words.view().start, 5_000_000_000);
    }

    /// Virtual time for several "processes" (threads), one of which runs at a time: a thread runs
    /// until it blocks (a sleep, a drain, CPU time), then the earliest wake time among the blocked
    /// ones comes next (ties in thread order). Deterministic whatever the host scheduler does.
    struct Des {
        state: Mutex<Sched>,
        turn: Condvar,
    }

    struct Sched {
        now: u64,
        running: usize,
        /// Per thread: the time it waits for; `None` once finished.
        wake: Vec<Option<u64>>,
        /// The shared device: all work finishes in launch order (time-slicing, as a FIFO).
        busy_until: u64,
        launched_ns: u64,
        /// Device time executed by `warm` and by `end`, recorded as the clock passes them.
        marks: [Option<u64>; 2],
        bounds: [u64; 2],
    }

    impl Sched {
        fn executed(&self, at: u64) -> u64 {
            self.launched_ns - self.busy_until.saturating_sub(at)
        }
    }

    impl Des {
        fn new(threads: usize, warm: u64, end: u64) -> Arc<Des> {
            Arc::new(Des {
                state: Mutex::new(Sched {
                    now: 1,
                    running: 0,
                    wake: vec![Some(1); threads],
                    busy_until: 0,
                    launched_ns: 0,
                    marks: [None; 2],
                    bounds: [warm, end],
                }),
                turn: Condvar::new(),
            })
        }

        fn now(&self) -> u64 {
            self.state.lock().unwrap().now
        }

        /// Blocks thread `me` until `t` (or finishes it, `None`), runs whoever comes next.
        fn yield_until(&self, me: usize, t: Option<u64>) {
            let mut s = self.state.lock().unwrap();
            s.wake[me] = t.map(|t| t.max(s.now));
            let next = s
                .wake
                .iter()
                .enumerate()
                .filter_map(|(i, w)| w.map(|w| (w, i)))
                .min();
            if let Some((at, i)) = next {
                for k in 0..2 {
                    if s.marks[k].is_none() && s.now < s.bounds[k] && at >= s.bounds[k] {
                        // Nothing launches while the clock jumps: the device's state now is its
                        // state at the bound.
                        let bound = s.bounds[k];
                        s.marks[k] = Some(s.executed(bound));
                    }
                }
                s.now = at;
                s.running = i;
                self.turn.notify_all();
            }
            if t.is_some() {
                while s.running != me || s.wake[me].is_none_or(|w| w > s.now) {
                    s = self.turn.wait(s).unwrap();
                }
            }
        }

        /// Queues a launch of `kernel_ns`; returns when this process's work will have finished.
        fn launch(&self, kernel_ns: u64) -> u64 {
            let mut s = self.state.lock().unwrap();
            s.busy_until = s.busy_until.max(s.now) + kernel_ns;
            s.launched_ns += kernel_ns;
            s.busy_until
        }
    }

    /// One process of the container in the simulation (or one thread of a process): its
    /// controller (its marks), the work its process queued, the container's window.
    struct Process<'a> {
        des: &'a Des,
        me: usize,
        words: &'a Words,
        /// When the work this thread's process launched finishes (shared by the threads of one
        /// process: a drain synchronises the whole context).
        mine: &'a AtomicU64,
    }

    impl<'a> Env for &'a Process<'a> {
        type Window = &'a Words;
        fn device(&self) -> Option<usize> {
            Some(0)
        }
        fn window(&self, _: usize) -> Option<&'a Words> {
            Some(self.words)
        }
        fn now_ns(&self) -> u64 {
            self.des.now()
        }
        fn drain(&self) {
            self.des.yield_until(self.me, Some(self.mine.load(Relaxed)));
        }
        fn sleep_until(&self, t: u64) {
            self.des.yield_until(self.me, Some(t + 60_000));
        }
    }

    /// A saturating workload on one device in virtual time: `launchers` threads, each launching
    /// `kernel_ns` kernels (2 us of CPU each) and synchronising every `sync_every` launches.
    #[derive(Clone, Copy, Debug)]
    struct Workload {
        pct: u8,
        launchers: usize,
        /// The launchers are threads of one process (one controller, one context) rather than
        /// processes of one container (a controller and a context each).
        threads: bool,
        kernel_ns: u64,
        sync_every: u64,
        /// The device's share is measured from `warm` to `end` (virtual ns).
        warm: u64,
        end: u64,
        /// This launcher stops for good at `warm` (SIGKILL: mid-window, nothing closed).
        killed: Option<usize>,
        /// The limit is set at this time (a run-time change, seen at each launcher's next launch as
        /// the control block is); before it, nothing is limited.
        limit_at: u64,
    }

    impl Workload {
        fn container(
            pct: u8,
            processes: usize,
            kernel_ns: u64,
            sync_every: u64,
            seconds: u64,
        ) -> Self {
            Workload {
                pct,
                launchers: processes,
                threads: false,
                kernel_ns,
                sync_every,
                warm: 1_000_000_000,
                end: seconds * 1_000_000_000,
                killed: None,
                limit_at: 0,
            }
        }
    }

    struct Outcome {
        /// The device's busy share from `warm` to `end`, percent.
        share: f64,
        /// Windows closed.
        closes: u64,
        /// Per launcher, when a launch of it was first held back.
        first_held: Vec<Option<u64>>,
    }

    /// Runs `w` in virtual time.
    fn simulate(w: Workload) -> Outcome {
        let des = Des::new(w.launchers, w.warm, w.end);
        let words = Words::default();
        let process_controller = Controller::new();
        let process_work = AtomicU64::new(0);
        let first_held: Vec<AtomicU64> = (0..w.launchers).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|scope| {
            for me in 0..w.launchers {
                let (des, words, first_held) = (&*des, &words, &first_held);
                let (process_controller, process_work) = (&process_controller, &process_work);
                scope.spawn(move || {
                    des.yield_until(me, Some(1));
                    let own_controller = Controller::new();
                    let own_work = AtomicU64::new(0);
                    let (c, mine) = if w.threads {
                        (process_controller, process_work)
                    } else {
                        (&own_controller, &own_work)
                    };
                    let p = Process {
                        des,
                        me,
                        words,
                        mine,
                    };
                    let mut limits = [None; MAX_DEVICES];
                    limits[0] = Some(w.pct);
                    let mut applied = false;
                    let mut n = 0u64;
                    while des.now() < w.end {
                        if w.killed == Some(me) && des.now() >= w.warm {
                            break;
                        }
                        if !applied && des.now() >= w.limit_at {
                            c.set_limits(&limits, 100);
                            applied = true;
                        }
                        let at = des.now();
                        if c.admit(|| &p) != 0 && first_held[me].load(Relaxed) == 0 {
                            first_held[me].store(at, Relaxed);
                        }
                        mine.fetch_max(des.launch(w.kernel_ns), Relaxed);
                        n += 1;
                        let t = des.now() + 2_000;
                        des.yield_until(me, Some(t));
                        if n.is_multiple_of(w.sync_every) {
                            des.yield_until(me, Some(mine.load(Relaxed)));
                        }
                    }
                    des.yield_until(me, None);
                });
            }
        });
        let s = des.state.lock().unwrap();
        let [Some(at_warm), Some(at_end)] = s.marks else {
            panic!("the clock never passed the bounds");
        };
        Outcome {
            share: (at_end - at_warm) as f64 / (w.end - w.warm) as f64 * 100.0,
            closes: words.closes.load(Relaxed),
            first_held: first_held
                .iter()
                .map(|t| Some(t.load(Relaxed)).filter(|&t| t != 0))
                .collect(),
        }
    }

    #[test]
    fn processes_of_a_container_share_one_budget() {
        // Miri interprets every step: one case, 3 s there.
        let (cases, seconds): (&[(u8, usize, u64, u64)], u64) = if cfg!(miri) {
            (&[(40, 2, 500_000, 16)], 3)
        } else {
            (
                &[
                    (40, 2, 500_000, 16),
                    (40, 4, 500_000, 16),
                    (25, 3, 2_000_000, 1),
                    (60, 2, 50_000, 100),
                    (40, 8, 500_000, 4),
                ],
                12,
            )
        };
        for &(pct, processes, kernel_ns, sync_every) in cases {
            let o = simulate(Workload::container(
                pct, processes, kernel_ns, sync_every, seconds,
            ));
            let (share, closes) = (o.share, o.closes);
            eprintln!(
                "{processes} processes at {pct}%, kernel {kernel_ns} ns, sync every {sync_every}: \
             {share:.2}%, {closes} windows"
            );
            assert!(
                (share - f64::from(pct)).abs() < 2.0,
                "{processes} processes at {pct}%, kernel {kernel_ns} ns, sync every {sync_every}: \
             container share {share:.2}%"
            );
            assert!(closes > 10, "{closes} windows closed");
        }
    }

    #[test]
    fn a_killed_process_leaves_the_others_their_share() {
        if cfg!(miri) {
            return;
        }
        // One of three processes is killed mid-window after a second: the other two go on drawing
        // from the same window, held to the container's share (nobody waits for the dead one).
        let share = simulate(Workload {
            killed: Some(1),
            ..Workload::container(40, 3, 500_000, 16, 12)
        })
        .share;
        eprintln!("3 processes at 40%, one killed: {share:.2}%");
        assert!((share - 40.0).abs() < 2.0, "container share {share:.2}%");
    }

    #[test]
    fn threads_of_a_process_share_one_duty_cycle() {
        // One controller and one context for all threads: a thread that finds the budget spent
        // drains every thread's work, and none adds idle time of its own (which would push the
        // share far below the limit).
        let (cases, seconds): (&[(u8, usize)], u64) = if cfg!(miri) {
            (&[(50, 2)], 3)
        } else {
            (&[(50, 4), (25, 2), (75, 3)], 12)
        };
        for &(pct, threads) in cases {
            let o = simulate(Workload {
                threads: true,
                ..Workload::container(pct, threads, 500_000, 16, seconds)
            });
            eprintln!("{threads} threads at {pct}%: {:.2}%", o.share);
            assert!(
                (o.share - f64::from(pct)).abs() < 2.0,
                "{threads} threads of one process at {pct}%: share {:.2}%",
                o.share
            );
            assert!(o.closes > 10, "{} windows closed", o.closes);
        }
    }

    #[test]
    fn a_share_set_at_run_time_holds_launches_from_the_next_window() {
        if cfg!(miri) {
            return;
        }
        // Two processes of a container launch unlimited for a second; then the share is set (each
        // sees it at its next launch, as the control block is polled at every launch). Each is held
        // back within one window of the change (its budget, 40 ms, plus the work then queued), far
        // inside the second `vgpu-agent limit` promises, and together they hold the share.
        let change = 1_000_000_000;
        for (processes, threads) in [(1, false), (2, false), (2, true)] {
            let o = simulate(Workload {
                threads,
                limit_at: change,
                warm: 2_000_000_000,
                ..Workload::container(40, processes, 500_000, 16, 8)
            });
            for (i, held) in o.first_held.iter().enumerate() {
                let held = held.unwrap_or_else(|| panic!("launcher {i} was never held back"));
                assert!(
                    held >= change,
                    "launcher {i} held before the change, at {held}"
                );
                let after = held - change;
                assert!(
                    after < 100_000_000,
                    "launcher {i} first held {after} ns after the change"
                );
            }
            assert!(
                (o.share - 40.0).abs() < 2.0,
                "{processes} launchers (threads: {threads}) at 40% from 1 s: share {:.2}%",
                o.share
            );
        }
    }

    #[test]
    fn the_qos_allocation_lowers_the_share_below_the_ceiling_only() {
        let c = limited(60);
        assert_eq!(c.target(0), 60);
        c.set_qos(0, Some(30));
        assert_eq!((c.percent(0), c.target(0)), (60, 30));
        c.set_qos(0, Some(90));
        assert_eq!(c.target(0), 60, "the ceiling holds");
        let free = Controller::new();
        assert!(!free.active());
        free.set_qos(1, Some(25));
        assert!(free.active());
        assert_eq!(free.target(1), 25);
        // In virtual time the launches run at the allocation.
        let r = run_on(
            &free_on_0(25),
            None,
            500_000,
            16,
            if cfg!(miri) { 3 } else { 6 },
        );
        assert!((r.share - 25.0).abs() < 2.0, "{}", r.share);
        free.set_qos(1, Some(100));
        assert!(!free.active(), "a whole device is no limit");
        free.set_qos(MAX_DEVICES, Some(10));
    }

    /// A guaranteed container runs unlimited while its neighbour idles (its allocation is the
    /// whole device), then is allocated 30% again: it is held back within a window of the change,
    /// by a window's idle time, not for the seconds it ran unlimited, and holds 30% after.
    #[test]
    fn a_container_back_under_an_allocation_starts_from_a_fresh_window() {
        if cfg!(miri) {
            // 7 s of virtual time, 70,000 launches: the window logic is the other tests' there.
            return;
        }
        let c = Controller::new();
        c.set_tiered(0, true);
        c.set_qos(0, Some(30));
        let sim = Sim::new(1);
        let kernel_ns = 100_000;
        let launch = |until: u64, held_max: &mut u64| {
            while sim.now.get() < until {
                *held_max = (*held_max).max(c.admit(|| &sim));
                let now = sim.now.get();
                sim.busy_until
                    .set(sim.busy_until.get().max(now) + kernel_ns);
                sim.busy.set(sim.busy.get() + kernel_ns);
                // 8 launches in flight at most, as the validation's workers keep them.
                sim.now
                    .set((now + 2_000).max(sim.busy_until.get().saturating_sub(8 * kernel_ns)));
            }
        };
        let mut held = 0;
        launch(1_000_000_000, &mut held);
        // The neighbour idles: the whole device, for 3 s.
        c.set_qos(0, Some(100));
        assert!(c.active(), "a tiered container's launches are still noted");
        held = 0;
        launch(4_000_000_000, &mut held);
        assert_eq!(held, 0, "nothing is held while the device is not limited");
        // The neighbour is back.
        c.set_qos(0, Some(30));
        let (busy0, t0) = (sim.busy.get(), sim.now.get());
        launch(4_300_000_000, &mut held);
        assert!(
            held < 250_000_000,
            "held {held} ns at once after the change"
        );
        let early = (sim.busy.get() - busy0) as f64 / (sim.now.get() - t0) as f64;
        assert!(
            early > 0.15,
            "{early}: the container ran in the first 300 ms"
        );
        let (busy1, t1) = (sim.busy.get(), sim.now.get());
        launch(7_000_000_000, &mut held);
        let share = (sim.busy.get() - busy1) as f64 / (sim.now.get() - t1) as f64 * 100.0;
        assert!((share - 30.0).abs() < 3.0, "{share}");
    }

    fn free_on_0(qos: u8) -> Controller {
        let c = Controller::new();
        c.set_qos(0, Some(qos));
        c
    }

    /// A best-effort launch beside a latency tenant, in virtual time.
    struct Gate {
        now: Cell<u64>,
        until: Cell<u64>,
        marks: Cell<u32>,
    }

    impl Env for &Gate {
        type Window = &'static Words;
        fn device(&self) -> Option<usize> {
            Some(0)
        }
        fn window(&self, _: usize) -> Option<&'static Words> {
            None
        }
        fn now_ns(&self) -> u64 {
            self.now.get()
        }
        fn drain(&self) {}
        fn sleep_until(&self, t: u64) {
            self.now.set(self.now.get().max(t));
        }
        fn latency_until(&self, _: usize) -> u64 {
            self.until.get()
        }
        fn mark_launch(&self, _: usize, _: u64) {
            self.marks.set(self.marks.get() + 1);
        }
    }

    #[test]
    fn best_effort_waits_for_latency_work_and_a_tiered_launch_is_marked() {
        let g = Gate {
            now: Cell::new(1_000),
            until: Cell::new(0),
            marks: Cell::new(0),
        };
        let c = Controller::new();
        c.set_gate(0, true);
        assert!(c.active());
        assert_eq!(c.admit(|| &g), 0, "no latency work in flight");
        g.until.set(5_001_000);
        assert_eq!(c.admit(|| &g), 5_000_000);
        assert_eq!(g.now.get(), 5_001_000);
        // A latency tenant that never stops: at most MAX_GATE_WAIT_NS per launch.
        g.until.set(u64::MAX);
        assert_eq!(c.admit(|| &g), MAX_GATE_WAIT_NS);
        c.set_gate(0, false);
        assert!(!c.active());
        assert_eq!(c.admit(|| &g), 0);
        c.set_tiered(0, true);
        assert_eq!(c.admit(|| &g), 0);
        assert_eq!(c.admit(|| &g), 0);
        assert_eq!(g.marks.get(), 2);
    }
}
