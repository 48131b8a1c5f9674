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
//! the NVML feedback loop ([`feedback`]), run by one process of the container, corrects it when
//! the container gets less (or more) of the device than its duty cycle, e.g. because other
//! contexts time-slice the GPU. A limited launch reads it from the window's `duty` word.
//!
//! Limits of the model (see docs/sm-limit.md): a window's wall time counts as busy, so a process
//! that launches while mostly busy on the CPU is held to `s`% of its *launching* time; a launch
//! gap longer than `P` starts a new window (the device cannot be told apart from an idle one
//! without device timestamps).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use agent_common::MAX_DEVICES;

pub mod feedback;
pub mod samples;
mod window;

pub use window::MAX_HOLD_NS;

/// One device's duty-cycle words as a launch reads them (CLOCK_MONOTONIC ns; 0 = never set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Start of the window opened last (the first launch, or one after a gap).
    pub start: u64,
    /// A recent launch.
    pub last: u64,
    /// Launches wait until then; the next window starts then.
    pub resume: u64,
    /// Start of the window closed last.
    pub closed: u64,
}

/// One device's duty-cycle words: the region's (`region::SmShare`, shared by the container's
/// processes) or this process's own. `start` and `resume` only grow.
pub trait Window {
    fn view(&self) -> View;
    /// Opens a window at `now` (raises `start` to `now`, sets `last`).
    fn open(&self, now: u64);
    /// Notes a launch at `now`.
    fn touch(&self, now: u64);
    /// Closes the window that started at `start`: launches wait until at least `resume`.
    fn close(&self, start: u64, resume: u64);
    /// Forgets a window whose words still hold `seen` (times that cannot be believed).
    fn repair(&self, seen: View);
    /// The `(target percent, per mille)` the feedback loop set, if any.
    fn duty(&self) -> Option<(u8, u16)>;
}

impl<W: Window + ?Sized> Window for &W {
    fn view(&self) -> View {
        (**self).view()
    }
    fn open(&self, now: u64) {
        (**self).open(now)
    }
    fn touch(&self, now: u64) {
        (**self).touch(now)
    }
    fn close(&self, start: u64, resume: u64) {
        (**self).close(start, resume)
    }
    fn repair(&self, seen: View) {
        (**self).repair(seen)
    }
    fn duty(&self) -> Option<(u8, u16)> {
        (**self).duty()
    }
}

/// What the controller needs from the driver, the clock and the region (faked in the tests).
pub trait Env {
    type Window: Window;
    /// The device of the calling thread's current context, if any.
    fn device(&self) -> Option<usize>;
    /// The duty-cycle words of `device`.
    fn window(&self, device: usize) -> Option<Self::Window>;
    /// Monotonic nanoseconds (`CLOCK_MONOTONIC`: the same in every process of the host).
    fn now_ns(&self) -> u64;
    /// Waits until the device has finished all work this process launched.
    fn drain(&self);
    /// Blocks the calling thread until `now_ns() >= t`.
    fn sleep_until(&self, t: u64);
}

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
}

impl Controller {
    pub const fn new() -> Controller {
        Controller {
            active: AtomicBool::new(false),
            percent: [const { AtomicU8::new(0) }; MAX_DEVICES],
            period_ns: AtomicU64::new(crate::config::DEFAULT_SM_PERIOD_MS * 1_000_000),
            marks: [const { AtomicU64::new(0) }; MAX_DEVICES],
        }
    }

    /// Sets the share of every device (`None`, 0 or 100: unlimited) and the period.
    pub fn set_limits(&self, percent: &[Option<u8>; MAX_DEVICES], period_ms: u64) {
        // Relaxed (all): configuration read by launches; a launch that sees the old value for a
        // moment behaves as just before the change.
        self.period_ns
            .store(period_ms.max(1) * 1_000_000, Ordering::Relaxed);
        let mut any = false;
        for (slot, p) in self.percent.iter().zip(percent) {
            let p = p.filter(|&p| p > 0 && p < 100).unwrap_or(0);
            any |= p != 0;
            slot.store(p, Ordering::Relaxed);
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
        let target = self.percent(device);
        if target == 0 {
            return 0;
        }
        let Some(w) = env.window(device) else {
            return 0;
        };
        let pm = u64::from(effective_permille(target, w.duty()));
        // Relaxed: a configuration value.
        let period = self.period_ns.load(Ordering::Relaxed);
        window::admit(env, &w, &self.marks[device], pm, period)
    }
}

impl Default for Controller {
    fn default() -> Controller {
        Controller::new()
    }
}

#[cfg(test)]
mod tests;
