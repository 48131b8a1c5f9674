//! The SM share controller (`CUDA_DEVICE_SM_LIMIT`): a closed-loop duty cycle per device.
//!
//! With no limit (unset, 0 or 100) on any device the launch path pays one relaxed load of
//! [`Controller::active`] and one predictable branch: no clock read, no shared write, no thread.
//!
//! Limited to `s`% on a device, launches run freely during an *active window*. The first launch
//! after the window has lasted its budget (`s`% of the period `P`, `VGPU_SM_PERIOD_MS`, default
//! 100 ms) closes it: that thread drains the device (the real `cuCtxSynchronize`: work queued in
//! the window runs to its end, so the wait counts as GPU time), measures `busy = drain end -
//! window start`, and holds the launch back for `idle = busy * (100 - s) / s`. The window's share
//! of wall time is then `busy / (busy + idle) = s`% whatever the queue depth or kernel length:
//! the loop closes on what the device actually took, not on a launch count. Threads of the
//! process share the device's window (atomics, no lock): a thread that launches while another
//! closes or sleeps waits for the same resume time, not an additional one. The time a launch is
//! held back (drain wait and sleep) is recorded as the thread's `throttled_ns` in the region.
//!
//! The windows use the device's *effective* share, not the target: it starts at the target and
//! the NVML feedback loop ([`feedback`]) corrects it when the process gets less (or more)
//! of the device than its duty cycle, e.g. because other contexts time-slice the GPU. A limited
//! launch reads it with one relaxed load.
//!
//! Limits of the model (see docs/sm-limit.md): a window's wall time counts as busy, so a process
//! that launches while mostly busy on the CPU is held to `s`% of its *launching* time; a launch
//! gap longer than `P` starts a new window (the device cannot be told apart from an idle one
//! without device timestamps); the share is per process: `n` processes of a container limited to
//! `s`% may use up to `n * s`% together.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

pub mod feedback;

/// How often a thread waiting for another thread's drain checks whether it finished.
const DRAIN_POLL_NS: u64 = 200_000;
/// `last` is refreshed at most this often (fewer writes to a shared line from many threads).
const LAST_RESOLUTION_NS: u64 = 1_000_000;

/// What the controller needs from the driver and the clock (faked in the tests).
pub trait Env {
    /// The device of the calling thread's current context, if any.
    fn device(&self) -> Option<usize>;
    /// Monotonic nanoseconds.
    fn now_ns(&self) -> u64;
    /// Waits until the device has finished all launched work.
    fn drain(&self);
    /// Blocks the calling thread until `now_ns() >= t`.
    fn sleep_until(&self, t: u64);
}

/// One device's duty cycle. All times are [`Env::now_ns`] values.
#[derive(Debug, Default)]
struct Window {
    /// Start of the current active window (0: none yet).
    start: AtomicU64,
    /// Time of a recent launch (refreshed at most every [`LAST_RESOLUTION_NS`]).
    last: AtomicU64,
    /// Launches wait until this time.
    resume: AtomicU64,
    /// A thread is closing the window (draining and computing `resume`).
    closing: AtomicBool,
    /// Windows closed so far: the feedback loop ([`feedback`]) integrates only while the
    /// limit binds (some window closed since its last tick).
    closes: AtomicU64,
}

impl Window {
    /// Lets a launch through at `pm` per mille of `period_ns`; returns the time it was held back.
    fn admit<E: Env>(&self, env: &E, pm: u64, period_ns: u64) -> u64 {
        let budget = period_ns * pm / 1000;
        let entered = env.now_ns();
        let mut now = entered;
        loop {
            // Acquire: pairs with the closer's Release store, after which `start` is the new
            // window's.
            let resume = self.resume.load(Ordering::Acquire);
            if now < resume {
                env.sleep_until(resume);
                now = env.now_ns();
                continue;
            }
            // Acquire: pairs with the closer's Release store of `false`.
            if self.closing.load(Ordering::Acquire) {
                env.sleep_until(now + DRAIN_POLL_NS);
                now = env.now_ns();
                continue;
            }
            // Relaxed (both): momentary values; a closer re-checks `start` after its CAS.
            let start = self.start.load(Ordering::Relaxed);
            let last = self.last.load(Ordering::Relaxed);
            if start == 0 || now.saturating_sub(last) > period_ns {
                // No window yet, or launches stopped for longer than a period: a new window.
                self.start.store(now, Ordering::Relaxed);
                self.last.store(now, Ordering::Relaxed);
                return now - entered;
            }
            if now.saturating_sub(start) < budget {
                if now.saturating_sub(last) > LAST_RESOLUTION_NS {
                    self.last.store(now, Ordering::Relaxed);
                }
                return now - entered;
            }
            // The window has used its budget: close it (one thread), or wait for its closer.
            // Acquire: pairs with the previous closer's Release store of `false`.
            if self
                .closing
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // Relaxed: we hold `closing`; only a gap reset could have moved `start` meanwhile.
            if self.start.load(Ordering::Relaxed) != start {
                self.closing.store(false, Ordering::Release);
                continue;
            }
            env.drain();
            let end = env.now_ns();
            let busy = end.saturating_sub(start);
            let idle = busy.saturating_mul(1000 - pm) / pm;
            let resume = end + idle;
            // Relaxed: published by the Release stores of `resume` and `closing` below.
            self.start.store(resume, Ordering::Relaxed);
            self.last.store(resume, Ordering::Relaxed);
            // Release: pairs with the Acquire loads of `resume` above.
            self.resume.store(resume, Ordering::Release);
            self.closing.store(false, Ordering::Release);
            // Relaxed: a statistic read by the feedback thread.
            self.closes.fetch_add(1, Ordering::Relaxed);
            now = env.now_ns();
        }
    }
}

/// The per-device controllers of this process.
#[derive(Debug)]
pub struct Controller {
    /// Whether any device is limited: the only thing an unlimited launch reads.
    active: AtomicBool,
    /// Share per device in percent; 0 = unlimited. The target: what the user set.
    percent: [AtomicU8; MAX_DEVICES],
    /// Duty cycle per device in per mille that the windows actually use: `percent * 10` until
    /// the feedback loop corrects it ([`feedback`]); reset to the target when it changes.
    effective: [AtomicU16; MAX_DEVICES],
    period_ns: AtomicU64,
    windows: [Window; MAX_DEVICES],
}

impl Controller {
    pub const fn new() -> Controller {
        Controller {
            active: AtomicBool::new(false),
            percent: [const { AtomicU8::new(0) }; MAX_DEVICES],
            effective: [const { AtomicU16::new(0) }; MAX_DEVICES],
            period_ns: AtomicU64::new(crate::config::DEFAULT_SM_PERIOD_MS * 1_000_000),
            windows: [const {
                Window {
                    start: AtomicU64::new(0),
                    last: AtomicU64::new(0),
                    resume: AtomicU64::new(0),
                    closing: AtomicBool::new(false),
                    closes: AtomicU64::new(0),
                }
            }; MAX_DEVICES],
        }
    }

    /// Sets the share of every device (`None`, 0 or 100: unlimited) and the period.
    pub fn set_limits(&self, percent: &[Option<u8>; MAX_DEVICES], period_ms: u64) {
        // Relaxed (all): configuration read by launches; a launch that sees the old value for a
        // moment behaves as just before the change.
        self.period_ns
            .store(period_ms.max(1) * 1_000_000, Ordering::Relaxed);
        let mut any = false;
        for ((slot, eff), p) in self.percent.iter().zip(&self.effective).zip(percent) {
            let p = p.filter(|&p| p > 0 && p < 100).unwrap_or(0);
            any |= p != 0;
            // A new target restarts the correction from it. `effective` first: a launch that
            // sees the new target with the old effective duty behaves as before the change.
            if slot.load(Ordering::Relaxed) != p {
                eff.store(u16::from(p) * 10, Ordering::Relaxed);
                slot.store(p, Ordering::Relaxed);
            }
        }
        self.active.store(any, Ordering::Relaxed);
    }

    /// The share of `device` in percent (0: unlimited).
    pub fn percent(&self, device: usize) -> u8 {
        // Relaxed: a configuration value.
        self.percent
            .get(device)
            .map_or(0, |p| p.load(Ordering::Relaxed))
    }

    /// Whether any device is limited.
    pub fn active(&self) -> bool {
        // Relaxed: a configuration flag.
        self.active.load(Ordering::Relaxed)
    }

    /// The duty cycle in per mille that `device`'s windows use (0: unlimited).
    pub(crate) fn effective_permille(&self, device: usize) -> u16 {
        // Relaxed: a configuration value.
        self.effective
            .get(device)
            .map_or(0, |e| e.load(Ordering::Relaxed))
    }

    /// Sets the duty cycle `device`'s windows use (the feedback loop's correction for `target`),
    /// unless the device's target is no longer `target`. The target is left as it is.
    pub fn set_effective_permille(&self, device: usize, target: u8, pm: u16) {
        let Some(eff) = self.effective.get(device) else {
            return;
        };
        if self.percent(device) != target {
            return;
        }
        // Relaxed: a configuration value; a launch that sees the old one for a moment is fine.
        // The compare-exchange keeps a concurrent `set_limits` (new target, or unlimited: 0) from
        // being overwritten by a correction computed for the old target.
        let cur = eff.load(Ordering::Relaxed);
        if cur != 0 {
            let _ =
                eff.compare_exchange(cur, pm.clamp(1, 1000), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Windows of `device` closed so far (the limit binds while this grows).
    pub fn closes(&self, device: usize) -> u64 {
        // Relaxed: a statistic.
        self.windows
            .get(device)
            .map_or(0, |w| w.closes.load(Ordering::Relaxed))
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
        let Some(device) = env.device() else {
            return 0;
        };
        // The only load of the correction on the launch path.
        let pm = u64::from(self.effective_permille(device));
        if pm == 0 {
            return 0;
        }
        // Relaxed: a configuration value.
        let period = self.period_ns.load(Ordering::Relaxed);
        self.windows[device].admit(env, pm, period)
    }
}

impl Default for Controller {
    fn default() -> Controller {
        Controller::new()
    }
}

#[cfg(test)]
mod tests;
