//! Per-second rates of a process over the interval between two snapshots ([`Rates`]).

use super::{ApiUsage, Process, Rates};

fn sum(apis: &[&ApiUsage], earlier: &[&ApiUsage], kind: &str, f: impl Fn(&ApiUsage) -> u64) -> u64 {
    apis.iter()
        .filter(|a| a.kind == kind || kind.is_empty())
        .map(|a| {
            let before = earlier
                .iter()
                .find(|e| e.api == a.api && e.source == a.source);
            f(&a.since(before.copied()))
        })
        .sum()
}

impl Rates {
    /// Rates of `now` relative to `before` (the same process in the previous snapshot).
    pub fn between(now: &Process, before: &Process, seconds: f64) -> Rates {
        if seconds <= 0.0 {
            return Rates::default();
        }
        let (a, b) = (now.effective_apis(), before.effective_apis());
        let (a, b) = (a.as_slice(), b.as_slice());
        let per_s = |v: u64| v as f64 / seconds;
        let throttled_ns = |p: &Process| p.limiter.as_ref().map(|l| l.throttled_ns).unwrap_or(0);
        let throttled = throttled_ns(now).saturating_sub(throttled_ns(before));
        Rates {
            allocations_per_s: per_s(sum(a, b, "alloc", |u| u.calls)),
            launches_per_s: per_s(sum(a, b, "launch", |u| u.calls)),
            calls_per_s: per_s(sum(a, b, "", |u| u.calls)),
            nccl_bytes_per_s: per_s(sum(a, b, "nccl", |u| u.bytes)),
            // Threads block concurrently, and a long wait is counted in the interval it ends in:
            // the share is capped at the whole interval.
            sync_share: (sum(a, b, "sync", |u| u.total_ns) as f64 / (seconds * 1e9)).min(1.0),
            throttled_share: throttled as f64 / (seconds * 1e9),
            denied_per_s: per_s(sum(a, b, "", |u| u.denied)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Source;

    fn usage(api: &str, kind: &str, source: Source, calls: u64, total_ns: u64) -> ApiUsage {
        ApiUsage {
            api: api.into(),
            kind: kind.into(),
            source,
            calls,
            errors: 0,
            bytes: 0,
            total_ns,
            hook_ns: 0,
            denied: 0,
            hist: vec![],
            latency: None,
            probed: None,
        }
    }

    fn process(apis: Vec<ApiUsage>) -> Process {
        Process::with_apis(apis)
    }

    #[test]
    fn rates_over_an_interval_prefer_the_limiter_where_both_sources_count() {
        let before = process(vec![
            usage("cuMemAlloc_v2", "alloc", Source::Probes, 10, 0),
            usage("cuMemAlloc_v2", "alloc", Source::Limiter, 12, 0),
            usage("cuStreamSynchronize", "sync", Source::Probes, 0, 0),
        ]);
        let now = process(vec![
            usage("cuMemAlloc_v2", "alloc", Source::Probes, 20, 0),
            usage("cuMemAlloc_v2", "alloc", Source::Limiter, 32, 0),
            usage(
                "cuStreamSynchronize",
                "sync",
                Source::Probes,
                5,
                500_000_000,
            ),
        ]);
        let r = Rates::between(&now, &before, 2.0);
        assert_eq!(
            r.allocations_per_s, 10.0,
            "20 limiter-counted allocations in 2 s"
        );
        assert_eq!(r.sync_share, 0.25, "0.5 s blocked in 2 s");
        assert_eq!(r.calls_per_s, 12.5);
        assert_eq!(Rates::between(&now, &before, 0.0), Rates::default());
    }
}
