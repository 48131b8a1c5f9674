//! Three views of a process's device memory and when they disagree.
//!
//! - the limiter's accounting (bytes held in the region, context memory included),
//! - what the probes tracked (allocations seen since the probes were attached),
//! - what NVML reports (the driver's per-process usage, context memory included).
//!
//! They measure different things, so only comparable pairs are checked: limiter vs NVML; probes
//! vs the limiter's allocations (held minus context) when the probes saw the whole life of the
//! process; and probes vs NVML only one way (the probes can never legitimately see more than the
//! driver reports). A difference over max(64 MiB, 5%) is drift.

use serde::{Deserialize, Serialize};

pub const DRIFT_MIN_BYTES: u64 = 64 << 20;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryViews {
    pub limiter: Option<u64>,
    /// The limiter's figure without context memory.
    pub limiter_allocations: Option<u64>,
    pub probes: Option<u64>,
    /// Live allocations behind `probes`.
    pub probes_allocations: Option<u64>,
    /// The probes saw all its allocations: they were attached before the process started, and
    /// tracked every allocation they saw (none past its share of the kernel's table:
    /// `Process::probe_losses`).
    pub probes_complete: bool,
    pub nvml: Option<u64>,
    pub drift: Option<Drift>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// The two views that disagree, e.g. `limiter/nvml`.
    pub between: String,
    pub bytes: u64,
}

fn threshold(a: u64, b: u64) -> u64 {
    DRIFT_MIN_BYTES.max(a.max(b) / 20)
}

impl MemoryViews {
    /// The pairs of views that are compared for this process (the same conditions as
    /// [`MemoryViews::reconcile`]): a pair missing here can never drift.
    pub fn compared(&self) -> Vec<&'static str> {
        let mut v = vec![];
        if self.limiter.is_some() && self.nvml.is_some() {
            v.push("limiter/nvml");
        }
        if self.probes.is_some() && self.limiter_allocations.is_some() && self.probes_complete {
            v.push("probes/limiter");
        }
        if self.probes.is_some() && self.nvml.is_some() {
            v.push("probes/nvml");
        }
        v
    }

    /// Fills in `drift` from the views present.
    pub fn reconcile(mut self) -> MemoryViews {
        let mut worst: Option<Drift> = None;
        let mut consider = |between: &str, diff: u64, limit: u64| {
            if diff > limit && worst.as_ref().is_none_or(|w| diff > w.bytes) {
                worst = Some(Drift {
                    between: between.into(),
                    bytes: diff,
                });
            }
        };
        if let (Some(l), Some(n)) = (self.limiter, self.nvml) {
            consider("limiter/nvml", l.abs_diff(n), threshold(l, n));
        }
        if let (Some(p), Some(l), true) =
            (self.probes, self.limiter_allocations, self.probes_complete)
        {
            consider("probes/limiter", p.abs_diff(l), threshold(p, l));
        }
        if let (Some(p), Some(n)) = (self.probes, self.nvml)
            && p > n
        {
            consider("probes/nvml", p - n, threshold(p, n));
        }
        self.drift = worst;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn drift_is_only_reported_between_compared_views() {
        let all = [None, Some(0), Some(GIB)];
        for limiter in all {
            for nvml in all {
                for probes in all {
                    for complete in [false, true] {
                        let v = MemoryViews {
                            limiter,
                            limiter_allocations: limiter,
                            probes,
                            probes_complete: complete,
                            nvml,
                            ..Default::default()
                        };
                        let compared = v.compared();
                        if let Some(d) = v.reconcile().drift {
                            assert!(compared.contains(&d.between.as_str()), "{d:?} {compared:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn agreeing_views_have_no_drift() {
        let v = MemoryViews {
            limiter: Some(4 * GIB + 500 * MIB),
            limiter_allocations: Some(4 * GIB),
            probes: Some(4 * GIB),
            probes_allocations: Some(4),
            probes_complete: true,
            nvml: Some(4 * GIB + 510 * MIB),
            drift: None,
        }
        .reconcile();
        assert_eq!(v.drift, None);
    }

    #[test]
    fn flags_the_largest_disagreement_over_the_threshold() {
        let v = MemoryViews {
            limiter: Some(4 * GIB),
            limiter_allocations: Some(3 * GIB),
            probes: Some(3 * GIB),
            probes_allocations: Some(3),
            probes_complete: true,
            nvml: Some(5 * GIB),
            drift: None,
        }
        .reconcile();
        assert_eq!(
            v.drift,
            Some(Drift {
                between: "limiter/nvml".into(),
                bytes: GIB
            })
        );
    }

    #[test]
    fn threshold_is_64_mib_or_5_percent() {
        let small = MemoryViews {
            limiter: Some(100 * MIB),
            nvml: Some(160 * MIB),
            ..Default::default()
        }
        .reconcile();
        assert_eq!(small.drift, None, "60 MiB < 64 MiB");
        let big = MemoryViews {
            limiter: Some(40 * GIB),
            nvml: Some(42 * GIB),
            ..Default::default()
        }
        .reconcile();
        assert_eq!(big.drift, None, "2 GiB < 5% of 42 GiB");
        let over = MemoryViews {
            limiter: Some(40 * GIB),
            nvml: Some(43 * GIB),
            ..Default::default()
        }
        .reconcile();
        assert_eq!(over.drift.map(|d| d.bytes), Some(3 * GIB));
    }

    #[test]
    fn probes_that_missed_the_start_of_a_process_are_not_compared_with_the_limiter() {
        let v = MemoryViews {
            limiter_allocations: Some(8 * GIB),
            probes: Some(GIB),
            probes_complete: false,
            ..Default::default()
        }
        .reconcile();
        assert_eq!(v.drift, None);
    }

    #[test]
    fn probes_below_nvml_is_expected_context_memory_above_is_drift() {
        let below = MemoryViews {
            probes: Some(GIB),
            nvml: Some(GIB + 600 * MIB),
            ..Default::default()
        }
        .reconcile();
        assert_eq!(below.drift, None);
        let above = MemoryViews {
            probes: Some(3 * GIB),
            nvml: Some(GIB),
            ..Default::default()
        }
        .reconcile();
        assert_eq!(above.drift.unwrap().between, "probes/nvml");
    }
}
