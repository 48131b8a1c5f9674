//! NVML's per-process utilisation samples (`nvmlDeviceGetProcessUtilization`) as both their
//! readers take them in: the limiter's SM correction ([`super::feedback`]) and the agent's GPU
//! use per process (the agent's `nvml/process_use.rs`). One intake, so that the share the loop
//! holds and the use `top` shows are read from the samples the same way.
//!
//! NVML's quirks, and what the intake does about each:
//! - **A sample covers one of the driver's sample periods** (1/6 s on an H200 with driver 580,
//!   `docs/sm-limit.md`), and one comes per process *that was busy* in that period: an idle
//!   process has none. The period is not reported: it is estimated as the median gap between
//!   consecutive samples of one process over the last [`GAP_HISTORY`] gaps, within
//!   [`PERIOD_RANGE_US`].
//! - **Samples become visible late** (up to about 1 s), each process's on its own schedule: a
//!   query that asked only for what is newer than the newest sample seen would hide a slower
//!   process's older ones. Queries look back [`LOOKBACK_US`], and a sample is taken once: when
//!   it is newer than the newest taken of its process.
//! - **Some drivers return only each process's newest sample**, whatever `lastSeenTimeStamp`
//!   asks for (driver 580 on an H100: one per query, 200 ms apart for a busy process, 600 ms
//!   for a duty-cycled one). Then a sample stands for the time since its process's previous
//!   one; with a driver that keeps every sample, for one period (an average of the samples
//!   present would count only the periods a duty-cycled process was busy in). Until one query
//!   returns two samples of one process (new or already taken: queries look back), the driver
//!   is taken to return only the newest ([`SampleIntake::stands_for`]).
//!
//! Pure: no NVML call and no clock read here, so the tests drive it with made-up samples and
//! with samples an H100 returned.

use std::collections::{BTreeMap, VecDeque};

/// How far back each query asks again for samples that became visible late. NVML publishes a
/// process's samples up to about 1 s late; the agent looks back from its previous query (1 s
/// before), the limiter from its container's newest sample. Both readers were validated on GPU
/// with their own value (the agent 2 s, the limiter 1.5 s): the larger one serves both, since a
/// longer look-back loses no late sample that a shorter one counts (each sample is taken once
/// whatever the overlap) and only returns a few more samples already taken per query.
pub const LOOKBACK_US: u64 = 2_000_000;
/// The driver's sample period is taken to lie in this range. Its upper bound is the look-back:
/// a sample standing for more than that would count time before what the queries look at.
/// Observed periods (1/6 s on an H200, 200 ms on an H100) lie far inside it.
pub const PERIOD_RANGE_US: (u64, u64) = (10_000, LOOKBACK_US);
/// Gaps between one process's consecutive samples kept for the period estimate. The period is a
/// constant of the driver, so a longer history only steadies the median against the long gaps
/// of a process's idle stretches; the agent (every process of a device, queried each second)
/// and the limiter (its container's processes, queried every 100 ms) both fill 64 within
/// seconds.
pub const GAP_HISTORY: usize = 64;

/// One process utilisation sample: the process's use of the device over one of the driver's
/// sample periods, ending at `timestamp_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host pid (the driver ignores pid namespaces).
    pub pid: u32,
    /// CPU timestamp of the sample (`CLOCK_REALTIME`), in microseconds.
    pub timestamp_us: u64,
    pub sm_util_pct: u32,
    /// Memory controller (bandwidth) utilisation.
    pub mem_util_pct: u32,
}

/// A sample taken in, with the time since its process's previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewSample {
    pub sample: ProcessSample,
    /// Microseconds since the previous sample of its process (`None`: its first, or the first
    /// since the process was forgotten).
    pub gap_us: Option<u64>,
}

/// The samples of one device taken so far: the newest per process, the gaps between them and
/// how the driver answers.
#[derive(Clone, Debug, Default)]
pub struct SampleIntake {
    /// The newest sample taken per pid.
    newest: BTreeMap<u32, u64>,
    /// Gaps between consecutive samples of one process, newest last.
    gaps: VecDeque<u64>,
    /// A query returned two samples of one process: the driver keeps every sample.
    every_sample: bool,
}

impl SampleIntake {
    /// Takes in one query's answer: the samples newer than `floor` and than the newest taken of
    /// their process, each once, in (pid, time) order.
    pub fn take(&mut self, answer: &[ProcessSample], floor: u64) -> Vec<NewSample> {
        let mut all: Vec<(u32, u64)> = answer.iter().map(|s| (s.pid, s.timestamp_us)).collect();
        all.sort_unstable();
        all.dedup();
        self.every_sample |= all.windows(2).any(|pair| pair[0].0 == pair[1].0);
        let mut new: Vec<ProcessSample> = answer
            .iter()
            .filter(|s| s.timestamp_us > self.newest_of(s.pid).unwrap_or(0).max(floor))
            .copied()
            .collect();
        new.sort_unstable_by_key(|s| (s.pid, s.timestamp_us));
        new.dedup_by_key(|s| (s.pid, s.timestamp_us));
        new.into_iter()
            .map(|sample| {
                let previous = self.newest.insert(sample.pid, sample.timestamp_us);
                let gap_us = previous.map(|p| sample.timestamp_us - p);
                if let Some(g) = gap_us {
                    if self.gaps.len() == GAP_HISTORY {
                        self.gaps.pop_front();
                    }
                    self.gaps.push_back(g);
                }
                NewSample { sample, gap_us }
            })
            .collect()
    }

    /// Forgets the processes with no sample after `t_us`: the next sample of one starts over
    /// (its gap would span its idle time, or it exited and its pid may come back as another).
    pub fn forget_silent_since(&mut self, t_us: u64) {
        self.newest.retain(|_, newest| *newest > t_us);
    }

    fn newest_of(&self, pid: u32) -> Option<u64> {
        self.newest.get(&pid).copied()
    }

    /// Whether the driver keeps every sample (a query returned two of one process).
    pub fn every_sample(&self) -> bool {
        self.every_sample
    }

    /// The driver's sample period as estimated from the gaps seen so far (`None` before any).
    pub fn period_us(&self) -> Option<u64> {
        if self.gaps.is_empty() {
            return None;
        }
        let mut g: Vec<u64> = self.gaps.iter().copied().collect();
        g.sort_unstable();
        Some(g[g.len() / 2].clamp(PERIOD_RANGE_US.0, PERIOD_RANGE_US.1))
    }

    /// The time a sample with gap `gap_us` stands for: the period (every-sample drivers) or its
    /// gap (newest-sample drivers); `unknown_us` where that is not known yet (no gap seen, or
    /// the process's first sample), which each reader chooses.
    pub fn stands_for(&self, gap_us: Option<u64>, unknown_us: u64) -> u64 {
        if self.every_sample {
            self.period_us().unwrap_or(unknown_us)
        } else {
            gap_us.unwrap_or(unknown_us)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    fn s(pid: u32, t: u64) -> ProcessSample {
        ProcessSample {
            pid,
            timestamp_us: t,
            sm_util_pct: 50,
            mem_util_pct: 5,
        }
    }

    fn taken(new: &[NewSample]) -> Vec<(u32, u64, Option<u64>)> {
        new.iter()
            .map(|n| (n.sample.pid, n.sample.timestamp_us, n.gap_us))
            .collect()
    }

    #[test]
    fn a_sample_is_taken_once_however_often_queries_return_it() {
        let mut intake = SampleIntake::default();
        let first = intake.take(&[s(2, 30), s(1, 20), s(1, 10), s(1, 20)], 0);
        assert_eq!(
            taken(&first),
            [(1, 10, None), (1, 20, Some(10)), (2, 30, None)]
        );
        // Looked back: the held samples come again beside a new one and a late one of another
        // process older than the first process's newest.
        let second = intake.take(&[s(1, 10), s(1, 20), s(1, 35), s(2, 30), s(3, 15)], 0);
        assert_eq!(taken(&second), [(1, 35, Some(15)), (3, 15, None)]);
        assert!(intake.take(&[s(1, 35)], 0).is_empty());
    }

    #[test]
    fn samples_not_newer_than_the_floor_are_not_taken() {
        let mut intake = SampleIntake::default();
        let new = intake.take(&[s(1, 5 * SEC), s(2, 7 * SEC)], 6 * SEC);
        assert_eq!(taken(&new), [(2, 7 * SEC, None)]);
    }

    #[test]
    fn the_driver_keeps_every_sample_once_a_query_returns_two_of_one_process() {
        let mut intake = SampleIntake::default();
        intake.take(&[s(1, 10), s(2, 10)], 0);
        intake.take(&[s(1, 10), s(1, 10), s(2, 20)], 0);
        assert!(
            !intake.every_sample(),
            "the same sample twice is one sample"
        );
        assert_eq!(intake.stands_for(Some(7), 99), 7, "newest only: its gap");
        assert_eq!(intake.stands_for(None, 99), 99);
        // Two samples of process 1, one already taken.
        intake.take(&[s(1, 10), s(1, 30)], 0);
        assert!(intake.every_sample());
        assert_eq!(
            intake.stands_for(Some(7), 99),
            PERIOD_RANGE_US.0,
            "every sample: the period (gaps of 10 and 20 us, bounded below)"
        );
    }

    #[test]
    fn the_period_is_the_median_gap_bounded() {
        let mut intake = SampleIntake::default();
        assert_eq!(intake.period_us(), None);
        assert_eq!(intake.stands_for(None, 42), 42);
        let p = SEC / 6;
        let mut answer: Vec<ProcessSample> = (1..=10).map(|i| s(1, i * p)).collect();
        // One long idle stretch does not move the median.
        answer.push(s(1, 10 * p + 5 * SEC));
        intake.take(&answer, 0);
        assert_eq!(intake.period_us(), Some(p));
        // Mostly long gaps: bounded above.
        let mut intake = SampleIntake::default();
        intake.take(&[s(1, SEC), s(1, 11 * SEC), s(1, 21 * SEC)], 0);
        assert_eq!(intake.period_us(), Some(PERIOD_RANGE_US.1));
    }

    #[test]
    fn a_forgotten_process_starts_over() {
        let mut intake = SampleIntake::default();
        intake.take(&[s(1, SEC), s(2, 3 * SEC)], 0);
        intake.forget_silent_since(2 * SEC);
        let new = intake.take(&[s(1, 4 * SEC), s(2, 4 * SEC)], 0);
        assert_eq!(taken(&new), [(1, 4 * SEC, None), (2, 4 * SEC, Some(SEC))]);
    }

    /// Queried each second with fresh pids each time, forgetting as the agent does: what is
    /// held stays bounded.
    #[test]
    fn memory_stays_bounded() {
        let mut intake = SampleIntake::default();
        let mut t = SEC;
        // Well past every bound either way (under miri, which is slow, a few rounds).
        let rounds = if cfg!(miri) { 10 } else { 200 };
        for round in 0..rounds {
            let answer: Vec<_> = (0..50).map(|i| s(round * 50 + i, t - 1)).collect();
            intake.take(&answer, t.saturating_sub(SEC + LOOKBACK_US));
            intake.forget_silent_since(t.saturating_sub(LOOKBACK_US));
            t += SEC;
        }
        assert!(intake.newest.len() <= 150, "{}", intake.newest.len());
        assert!(intake.gaps.len() <= GAP_HISTORY);
    }
}
