//! The SM share's closed-loop correction from NVML's per-process utilisation.
//!
//! The duty cycle ([`super`]) counts the wall time of a window as the container's busy time. When
//! other contexts share the GPU, the device time-slices between them during the window, so the
//! container gets less than its share (measured on an H200: 27.9% for a 60% limit beside a 30%
//! one). With some device limited (and `VGPU_SM_FEEDBACK` not `0`), one process of the container
//! (the holder of the window's lease, see `region::sm_share`) reads every [`SAMPLE_EVERY`] the
//! samples of `nvmlDeviceGetProcessUtilization` and keeps those of the container's processes;
//! every [`TICK`] it measures the container's share over the newest [`AVERAGE_US`] of them (the
//! time each process kept the SMs busy, summed, over the time the samples cover: see
//! [`Loop::tick`]) and corrects the duty cycle the windows use (the *effective* share, the
//! window's `duty` word; the target stays what the user set):
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

use super::samples::{ProcessSample, SampleIntake};

/// How often the thread corrects the duty cycle.
pub const TICK: Duration = Duration::from_millis(500);
/// How often the thread reads NVML's samples: a driver that keeps only each process's newest
/// sample (one every 200 ms for a busy process on an H100) would lose most of them to a query
/// every [`TICK`], and the fewer the samples, the noisier the measured share.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Samples averaged: the newest 3 s of them (NVML timestamps). On the H200 two time-slicing
/// processes' 1 s averages swung between 12% and 66% around a 30% share (a 100 ms duty cycle
/// sampled every 1/6 s aliases); 3 s cuts that spread enough for the loop to hold its target.
pub(crate) const AVERAGE_US: u64 = 3_000_000;
/// How far before the container's newest sample each query asks again: NVML publishes each
/// process's samples on its own schedule, up to about 1 s late, so asking only for what is newer
/// than another process's newest sample would lose them (the intake takes a sample once).
pub use super::samples::LOOKBACK_US;
/// `d_eff` values averaged for the plant gain: those of the last 3.5 s (the averaged samples
/// plus NVML's lag).
const EFFECTIVE_HISTORY_MS: u64 = 3_500;
/// Correction per tick, as a fraction of the error (after normalising by the plant gain).
pub(crate) const GAIN: f64 = 0.12;
/// Errors within this many points are left alone.
pub(crate) const DEAD_BAND: f64 = 1.0;
/// The largest change of `d_eff` per tick, in points.
pub(crate) const MAX_STEP: f64 = 5.0;

/// A sample's weight before its process has a previous one (newest-sample-only drivers), and the
/// period before any gap was seen: one tick.
const FIRST_WEIGHT_US: u64 = TICK.as_micros() as u64;

/// One sample of a process of the container.
#[derive(Debug, Clone, Copy)]
struct Sample {
    pid: u32,
    /// NVML's timestamp, us.
    t: u64,
    sm_util: f64,
    /// The time since the same process's previous sample (`None`: its first).
    gap: Option<u64>,
}

/// One device's correction (pure: the tests drive it in virtual time).
///
/// How a share is measured from NVML's samples depends on the driver; [`super::samples`] tells
/// which way it answers and what each sample stands for (the agent reads them through the same
/// intake, so the share the loop holds and the GPU use `top` shows agree):
/// - **Every sample** (an H200 with driver 580: one per process and sample period of 1/6 s, for
///   the periods the process was busy in): each sample stands for one period. A period without
///   a sample was idle.
/// - **Only each process's newest sample** (an H100 with driver 580): each sample stands for the
///   time since the process's previous one. An average of the samples present would count only
///   the periods a duty-cycled process was busy in, and on the H100 read a container at 38%
///   (pmon) as anything from 36% to 93%.
#[derive(Debug, Clone)]
pub struct Loop {
    target: f64,
    /// The effective share in percent.
    eff: f64,
    /// The container's samples of the newest [`AVERAGE_US`], in arrival order.
    samples: VecDeque<Sample>,
    /// What each sample stands for.
    intake: SampleIntake,
    /// Where the first sample's time began (us): the measured span does not reach before it.
    first_begin: Option<u64>,
    /// `(now_ms, eff)` at each tick, newest last.
    effs: VecDeque<(u64, f64)>,
    /// The last measured share, if any.
    measured: Option<f64>,
    /// Samples came in since the last tick.
    unused: bool,
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
            intake: SampleIntake::default(),
            first_begin: None,
            effs: VecDeque::new(),
            measured: None,
            unused: false,
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
    /// container's processes (a sample already held is not counted again, so a query may look
    /// back), `binding` whether a window closed since the last tick. The measured share is the
    /// sum over the container's processes of the time each kept the SMs busy (each sample's
    /// `smUtil` times the time it stands for, clipped to the newest [`AVERAGE_US`]) over the time
    /// its samples cover. Returns the new effective share.
    pub fn tick(&mut self, now_ms: u64, fresh: &[(u32, u64, u32)], binding: bool) -> f64 {
        self.effs.push_back((now_ms, self.eff));
        while self
            .effs
            .front()
            .is_some_and(|&(t, _)| t + EFFECTIVE_HISTORY_MS < now_ms)
        {
            self.effs.pop_front();
        }
        self.observe(fresh);
        if !std::mem::take(&mut self.unused) {
            return self.eff;
        }
        let Some(measured) = self.share() else {
            return self.eff;
        };
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

    /// Takes in a query's samples between ticks (`fresh` as for [`Loop::tick`]).
    pub fn observe(&mut self, fresh: &[(u32, u64, u32)]) {
        self.unused |= self.fold(fresh);
    }

    /// Takes in the samples newer than each process's newest held; whether there were any.
    fn fold(&mut self, fresh: &[(u32, u64, u32)]) -> bool {
        let answer: Vec<ProcessSample> = fresh
            .iter()
            .map(|&(pid, timestamp_us, sm_util_pct)| ProcessSample {
                pid,
                timestamp_us,
                sm_util_pct,
                mem_util_pct: 0,
            })
            .collect();
        let new = self.intake.take(&answer, 0);
        if new.is_empty() {
            return false;
        }
        for n in new {
            let t = n.sample.timestamp_us;
            let first = t.saturating_sub(self.intake.stands_for(None, FIRST_WEIGHT_US));
            self.first_begin = Some(self.first_begin.map_or(first, |f| f.min(first)));
            self.samples.push_back(Sample {
                pid: n.sample.pid,
                t,
                sm_util: f64::from(n.sample.sm_util_pct.min(100)),
                gap: n.gap_us,
            });
        }
        let newest = self.samples.iter().map(|s| s.t).max().unwrap_or(0);
        self.samples.retain(|s| s.t + AVERAGE_US > newest);
        // A process silent for twice the averaging span starts over.
        self.intake
            .forget_silent_since(newest.saturating_sub(2 * AVERAGE_US));
        true
    }

    /// The container's share of the newest [`AVERAGE_US`] (percent), or `None` when the samples
    /// cover no time. Each process's busy time is taken over the span its own samples reach: a
    /// process's newest sample is often a few hundred milliseconds older than another's, and
    /// counting that time as idle read a container of two processes 4-5 points low on the H100.
    fn share(&self) -> Option<f64> {
        let newest = self.samples.iter().map(|s| s.t).max()?;
        let from = newest.saturating_sub(AVERAGE_US);
        // From the start of the span, or of the first sample: a period without a sample of the
        // container in between was idle.
        let start = self.first_begin.map_or(from, |f| f.max(from));
        let mut by_pid: Vec<(u32, f64, u64)> = Vec::new();
        for s in &self.samples {
            let stands_for = self
                .intake
                .stands_for(s.gap, FIRST_WEIGHT_US)
                .min(AVERAGE_US);
            let begins = s.t.saturating_sub(stands_for).max(start);
            let busy = s.sm_util * s.t.saturating_sub(begins) as f64;
            match by_pid.iter_mut().find(|p| p.0 == s.pid) {
                Some(p) => {
                    p.1 += busy;
                    p.2 = p.2.max(s.t);
                }
                None => by_pid.push((s.pid, busy, s.t)),
            }
        }
        let mut any = false;
        let mut share = 0.0;
        for (_, busy, reach) in by_pid {
            let covered = reach.saturating_sub(start);
            if covered > 0 {
                any = true;
                share += busy / covered as f64;
            }
        }
        any.then(|| share.min(100.0))
    }
}

#[cfg(test)]
mod tests;
