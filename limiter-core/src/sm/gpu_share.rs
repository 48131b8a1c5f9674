//! The container's share of a device measured from the GPU time its limiters sample (event
//! pairs around 1-in-N launches, [`crate::gpu_time`]), for the SM share's correction.
//!
//! NVML's per-process samples say which context the device was running when it looked; once
//! contexts share a GPU they go to whichever ran then (on an H100, true shares of 16.0 / 34.2%
//! read as 10.1 / 43.3%). The limiters' own samples time each process's kernels on the device,
//! so the container's share is the growth of the GPU time its slots estimate, summed, over the
//! wall time it grew in: `100 * d(busy) / dt` over the newest [`SPAN_NS`], without NVML's lag.
//!
//! A slot is followed by its owner (slot, pid, start time): a new owner's time before it was
//! first seen is not counted, and a slot that is gone simply stops adding. Without
//! [`MIN_SAMPLES`] samples in the span (a container that hardly launches, or the first second)
//! there is no reading and the correction holds; a container whose limiters never sampled
//! (sampling off) is measured with NVML's samples instead (`auto`, see [`GpuShare::sampled`]).

use std::collections::VecDeque;

/// The span the share is averaged over: long enough for a few hundred samples per launching
/// thread (about 200 a second each by default), short beside NVML's 3 s and its 1 s lag.
pub const SPAN_NS: u64 = 2_000_000_000;
/// Fewer samples than this in the span give no reading: too few to estimate the time of every
/// launch from (each stands for the launches since the previous one).
pub const MIN_SAMPLES: u64 = 20;
/// The span must be at least this long for a reading (right after start, or after a gap).
const MIN_SPAN_NS: u64 = SPAN_NS / 2;

/// What one slot of the container measured on the device, as the region holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotReading {
    pub slot: u32,
    pub pid: u32,
    pub start_time: u64,
    /// Estimated GPU time of all the owner's launches on the device, ns (grows).
    pub estimated_ns: u64,
    /// Samples behind it (grows).
    pub samples: u64,
}

impl SlotReading {
    fn owner(&self) -> (u32, u32, u64) {
        (self.slot, self.pid, self.start_time)
    }
}

/// The container's measured share of one device (pure: the tests drive it in virtual time).
#[derive(Debug, Default, Clone)]
pub struct GpuShare {
    /// Each owner's last reading.
    seen: Vec<SlotReading>,
    /// The container's busy time and samples added since the first reading, ns and count.
    busy_ns: u64,
    samples: u64,
    /// `(now_ns, busy_ns, samples)` at each reading of the newest span (and one before it).
    history: VecDeque<(u64, u64, u64)>,
    /// Some slot of the container has taken a sample.
    sampled: bool,
}

impl GpuShare {
    /// Takes in a reading of every live slot of the container at `now_ns` (a monotonic clock).
    pub fn observe(&mut self, now_ns: u64, slots: &[SlotReading]) {
        for r in slots {
            // A new owner: what it measured before now is not in the span.
            if let Some(prev) = self.seen.iter().find(|s| s.owner() == r.owner()) {
                // The words only grow while the slot has this owner; a smaller value is a
                // reading torn by a reset and adds nothing.
                self.busy_ns = self
                    .busy_ns
                    .saturating_add(r.estimated_ns.saturating_sub(prev.estimated_ns));
                self.samples = self
                    .samples
                    .saturating_add(r.samples.saturating_sub(prev.samples));
            }
        }
        self.sampled |= slots.iter().any(|r| r.samples > 0);
        self.seen.clear();
        self.seen.extend_from_slice(slots);
        if self.history.back().is_some_and(|&(t, ..)| now_ns < t) {
            // The clock went back (it does not; but never divide by a negative span).
            self.history.clear();
        }
        self.history.push_back((now_ns, self.busy_ns, self.samples));
        // Keep one reading at or before the span's start.
        while self.history.len() > 2 && self.history[1].0 + SPAN_NS <= now_ns {
            self.history.pop_front();
        }
    }

    /// Whether the container's limiters have sampled GPU time at all: then its share is theirs
    /// to measure, and a span without a reading (the container idles) holds the correction
    /// instead of handing it to NVML, which misreads shared GPUs.
    pub fn sampled(&self) -> bool {
        self.sampled
    }

    /// The container's share of the device over the newest span, percent (at most 100), or
    /// `None` when the span is too short or holds too few samples.
    pub fn share(&self) -> Option<f64> {
        let (&(t0, b0, s0), &(t1, b1, s1)) = (self.history.front()?, self.history.back()?);
        let span = t1 - t0;
        if span < MIN_SPAN_NS || s1 - s0 < MIN_SAMPLES {
            return None;
        }
        Some((100.0 * (b1 - b0) as f64 / span as f64).min(100.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn slot(slot: u32, pid: u32, estimated_ns: u64, samples: u64) -> SlotReading {
        SlotReading {
            slot,
            pid,
            start_time: u64::from(pid) * 7,
            estimated_ns,
            samples,
        }
    }

    #[test]
    fn the_share_is_the_containers_growth_of_gpu_time_over_the_span() {
        let mut g = GpuShare::default();
        // Two processes: one busy 30%, the other 10% of wall time, 100 samples a second each.
        for i in 0..=40u64 {
            let t = i * 100 * MS;
            g.observe(
                t,
                &[
                    slot(0, 10, 5 * MS + t * 3 / 10, i * 10),
                    slot(3, 11, t / 10, i * 10),
                ],
            );
        }
        let share = g.share().unwrap();
        assert!((share - 40.0).abs() < 1e-6, "{share}");
    }

    #[test]
    fn no_reading_without_enough_span_or_samples() {
        let mut g = GpuShare::default();
        assert_eq!(g.share(), None);
        for i in 0..=5u64 {
            g.observe(i * 100 * MS, &[slot(0, 10, i * 50 * MS, i * 100)]);
        }
        assert_eq!(g.share(), None, "half a second is too short");
        let mut g = GpuShare::default();
        for i in 0..=30u64 {
            // One sample a second: 3 in the span.
            g.observe(i * 100 * MS, &[slot(0, 10, i * 50 * MS, i / 10)]);
        }
        assert_eq!(g.share(), None, "too few samples");
        assert!(g.sampled(), "but it samples");
        let mut off = GpuShare::default();
        off.observe(0, &[slot(0, 10, 0, 0)]);
        off.observe(SPAN_NS, &[slot(0, 10, 0, 0)]);
        assert!(!off.sampled(), "sampling off");
    }

    #[test]
    fn a_slot_taken_by_a_new_owner_counts_only_what_it_adds() {
        let mut g = GpuShare::default();
        for i in 0..=20u64 {
            g.observe(i * 100 * MS, &[slot(0, 10, i * 50 * MS, i * 10)]);
        }
        assert!((g.share().unwrap() - 50.0).abs() < 1e-6);
        // Pid 10 exits; pid 12 takes the slot with 9 s of GPU time already counted elsewhere:
        // none of it is in the span, only its growth (20%).
        for i in 21..=60u64 {
            let own = (i - 21) * 20 * MS;
            g.observe(i * 100 * MS, &[slot(0, 12, 9_000 * MS + own, i * 10)]);
        }
        let share = g.share().unwrap();
        assert!((share - 20.0).abs() < 1e-6, "{share}");
    }

    #[test]
    fn a_smaller_reading_adds_nothing_and_the_share_is_capped() {
        let mut g = GpuShare::default();
        g.observe(0, &[slot(0, 10, 10 * MS, 0)]);
        g.observe(100 * MS, &[slot(0, 10, 5 * MS, 50)]);
        assert_eq!(g.busy_ns, 0);
        // Overlapping streams: more GPU time than wall time.
        for i in 2..=30u64 {
            g.observe(
                i * 100 * MS,
                &[slot(0, 10, 5 * MS + i * 300 * MS, 50 + i * 10)],
            );
        }
        assert_eq!(g.share(), Some(100.0));
    }

    #[test]
    fn the_span_is_the_newest_two_seconds() {
        let mut g = GpuShare::default();
        let mut busy = 0;
        for i in 0..=100u64 {
            // 80% for the first 5 s, then 20%.
            busy += if i <= 50 { 80 } else { 20 } * MS;
            g.observe(i * 100 * MS, &[slot(0, 10, busy, i * 10)]);
        }
        let share = g.share().unwrap();
        assert!((share - 20.0).abs() < 1e-6, "{share}");
        assert!(g.history.len() <= 22, "{}", g.history.len());
    }
}
