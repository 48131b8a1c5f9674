//! The SM share's closed-loop correction from NVML's per-process utilisation.
//!
//! The duty cycle ([`super`]) counts the wall time of a window as the container's busy time. When
//! other contexts share the GPU, the device time-slices between them during the window, so the
//! container gets less than its share (measured on an H200: 27.9% for a 60% limit beside a 30%
//! one). With some device limited (and `VGPU_SM_FEEDBACK` not `0`), one process of the container
//! (the holder of the window's lease, see `region::sm_share`) reads every [`TICK`] the samples of
//! `nvmlDeviceGetProcessUtilization`, keeps those of the container's processes, sums per process
//! the average `smUtil` over the newest [`AVERAGE_US`] of them, and corrects the duty cycle the
//! windows use (the *effective* share, the window's `duty` word; the target stays what the user
//! set):
//!
//! `d_eff += GAIN * (target - measured) / g`, with `g = measured / mean(d_eff over the last
//! 3.5 s)` the plant's gain (how much of its duty cycle the container really gets, clamped to
//! [0.25, 2]), a dead band of [`DEAD_BAND`] points, steps of at most [`MAX_STEP`] and `d_eff`
//! within `[target / 2, 100]`. Normalising by `g` keeps the loop gain at [`GAIN`] per tick
//! whatever the contention, so the loop converges in about 5 to 7 s and does not oscillate with
//! NVML samples that lag up to 1 s (tuned in `feedback/tests.rs` against a plant model with
//! that lag). It only raises `d_eff` while the limit binds (windows closed since the last tick):
//! a container that launches little is not below its share because of the limiter.
//!
//! Limits: NVML reports host pids; processes in another pid namespace never find their pids in
//! the samples, and the correction stays off (logged once at Info). Without NVML (library,
//! `nvmlInit_v2` or the symbol missing) the thread logs once at Info and exits: open loop. The
//! thread never touches the launch path: launches read `d_eff` from the window.

use std::{collections::VecDeque, time::Duration};

/// How often the thread reads NVML.
pub const TICK: Duration = Duration::from_millis(500);
/// Samples averaged: the newest 3 s of them (NVML timestamps). On the H200 two time-slicing
/// processes' 1 s averages swung between 12% and 66% around a 30% share (a 100 ms duty cycle
/// sampled every 1/6 s aliases); 3 s cuts that spread enough for the loop to hold its target.
pub(crate) const AVERAGE_US: u64 = 3_000_000;
/// `d_eff` values averaged for the plant gain: those of the last 3.5 s (the averaged samples
/// plus NVML's lag).
const EFFECTIVE_HISTORY_MS: u64 = 3_500;
/// Correction per tick, as a fraction of the error (after normalising by the plant gain).
pub(crate) const GAIN: f64 = 0.12;
/// Errors within this many points are left alone.
pub(crate) const DEAD_BAND: f64 = 1.0;
/// The largest change of `d_eff` per tick, in points.
pub(crate) const MAX_STEP: f64 = 5.0;

/// One device's correction (pure: the tests drive it in virtual time).
#[derive(Debug, Clone)]
pub struct Loop {
    target: f64,
    /// The effective share in percent.
    eff: f64,
    /// `(pid, NVML timestamp in us, smUtil)` of the container's processes, in arrival order.
    samples: VecDeque<(u32, u64, f64)>,
    /// `(now_ms, eff)` at each tick, newest last.
    effs: VecDeque<(u64, f64)>,
    /// The last average, if any.
    measured: Option<f64>,
}

impl Loop {
    pub fn new(target: u8) -> Loop {
        Loop::resume(target, f64::from(target))
    }

    /// A loop for `target` that starts from the effective share `eff` (percent) another process
    /// left in the window: a correction that changes hands is not restarted.
    pub fn resume(target: u8, eff: f64) -> Loop {
        let t = f64::from(target);
        Loop {
            target: t,
            eff: eff.clamp(t / 2.0, 100.0),
            samples: VecDeque::new(),
            effs: VecDeque::new(),
            measured: None,
        }
    }

    /// The share the user set, in percent.
    pub fn target(&self) -> f64 {
        self.target
    }

    pub fn effective(&self) -> f64 {
        self.eff
    }

    pub fn measured(&self) -> Option<f64> {
        self.measured
    }

    /// One tick at `now_ms`: `fresh` are new samples `(pid, timestamp us, smUtil)` of the
    /// container's processes, `binding` whether a window closed since the last tick. The measured
    /// share is the sum over processes of each one's average over the newest [`AVERAGE_US`].
    /// Returns the new effective share.
    pub fn tick(&mut self, now_ms: u64, fresh: &[(u32, u64, u32)], binding: bool) -> f64 {
        self.effs.push_back((now_ms, self.eff));
        while self
            .effs
            .front()
            .is_some_and(|&(t, _)| t + EFFECTIVE_HISTORY_MS < now_ms)
        {
            self.effs.pop_front();
        }
        let before = self.samples.len();
        for &(pid, t, v) in fresh {
            // Samples already held (NVML may return one again) are not counted twice.
            let held = self
                .samples
                .iter()
                .filter(|s| s.0 == pid)
                .map(|s| s.1)
                .max()
                .unwrap_or(0);
            if t > held {
                self.samples.push_back((pid, t, f64::from(v.min(100))));
            }
        }
        if self.samples.len() == before {
            return self.eff;
        }
        let newest = self.samples.iter().map(|s| s.1).max().unwrap_or(0);
        self.samples.retain(|s| s.1 + AVERAGE_US > newest);
        let mut pids: Vec<u32> = self.samples.iter().map(|s| s.0).collect();
        pids.sort_unstable();
        pids.dedup();
        let measured = pids
            .iter()
            .map(|&p| {
                let (sum, n) = self
                    .samples
                    .iter()
                    .filter(|s| s.0 == p)
                    .fold((0.0, 0u32), |(sum, n), s| (sum + s.2, n + 1));
                sum / f64::from(n)
            })
            .sum::<f64>()
            .min(100.0);
        self.measured = Some(measured);
        let err = self.target - measured;
        if err.abs() <= DEAD_BAND || (err > 0.0 && !binding) {
            return self.eff;
        }
        let applied = self.effs.iter().map(|e| e.1).sum::<f64>() / self.effs.len() as f64;
        let gain = (measured / applied).clamp(0.25, 2.0);
        let step = (GAIN * err / gain).clamp(-MAX_STEP, MAX_STEP);
        self.eff = (self.eff + step).clamp(self.target / 2.0, 100.0);
        self.eff
    }
}

#[cfg(test)]
mod tests;
