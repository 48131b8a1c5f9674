//! The per-container rate of spans. The probes write a span event for every NCCL call, every
//! call slower than `--trace-slow` and one in `--trace-sample-rate` of the others (per CPU); of
//! each kind, each container (its cgroup, the kernel's name for it) may send at most so many
//! spans per second (a token bucket per container and kind holding one second's worth):
//! `--trace-container-rate` rate-sampled spans, `--trace-container-event-rate` NCCL spans and as
//! many slow-call spans. So one container's flood of NCCL calls cannot fill the bounded queue and
//! crowd out the others' spans, nor its own slow calls. What a bucket refuses is counted per
//! container and kind ([`super::metrics::SpanCounters`]).

use std::collections::HashMap;

use agent_common::maps::{SPAN_NCCL, SPAN_SAMPLED, SPAN_SLOW, SpanEvent};

/// Containers tracked at most; a bucket that has refilled completely is forgotten first (it
/// holds nothing a new bucket would not).
pub const MAX_CONTAINERS: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    /// CLOCK_MONOTONIC ns of the last refill.
    at_ns: u64,
}

/// Token buckets keyed by cgroup id.
#[derive(Debug)]
pub struct ContainerRate {
    /// Spans per second per container; 0: no limit.
    per_s: f64,
    buckets: HashMap<u64, Bucket>,
}

impl ContainerRate {
    pub fn new(per_s: f64) -> ContainerRate {
        ContainerRate {
            per_s,
            buckets: HashMap::new(),
        }
    }

    /// Whether a span of container `cgroup` at `now_ns` (monotonic) may go.
    pub fn admit(&mut self, cgroup: u64, now_ns: u64) -> bool {
        if self.per_s <= 0.0 {
            return true;
        }
        let burst = self.per_s.max(1.0);
        if !self.buckets.contains_key(&cgroup) && self.buckets.len() >= MAX_CONTAINERS {
            let refill_ns = (burst / self.per_s * 1e9) as u64;
            self.buckets
                .retain(|_, b| now_ns.saturating_sub(b.at_ns) < refill_ns);
            if self.buckets.len() >= MAX_CONTAINERS {
                return false;
            }
        }
        let b = self.buckets.entry(cgroup).or_insert(Bucket {
            tokens: burst,
            at_ns: now_ns,
        });
        // Events of different CPUs arrive slightly out of order: time never goes back here.
        if now_ns > b.at_ns {
            let refill = (now_ns - b.at_ns) as f64 / 1e9 * self.per_s;
            b.tokens = (b.tokens + refill).min(burst);
            b.at_ns = now_ns;
        }
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    #[cfg(test)]
    fn containers(&self) -> usize {
        self.buckets.len()
    }
}

/// The name of a span event's kind, as the `gpu.sampled_by` attribute and the per-container
/// drop counters say it.
pub fn kind_name(reason: u8) -> &'static str {
    match reason {
        SPAN_NCCL => "nccl",
        SPAN_SLOW => "slow",
        _ => "rate",
    }
}

/// One [`ContainerRate`] per span kind.
#[derive(Debug)]
pub struct SpanRates {
    sampled: ContainerRate,
    nccl: ContainerRate,
    slow: ContainerRate,
}

impl SpanRates {
    /// `sampled_per_s` for rate-sampled spans, `event_per_s` for NCCL and for slow-call spans
    /// (each its own bucket); 0: no limit.
    pub fn new(sampled_per_s: f64, event_per_s: f64) -> SpanRates {
        SpanRates {
            sampled: ContainerRate::new(sampled_per_s),
            nccl: ContainerRate::new(event_per_s),
            slow: ContainerRate::new(event_per_s),
        }
    }

    /// Whether the event may go, by its container's bucket of its kind.
    pub fn admit(&mut self, ev: &SpanEvent) -> bool {
        let rate = match ev.reason {
            SPAN_NCCL => &mut self.nccl,
            SPAN_SLOW => &mut self.slow,
            SPAN_SAMPLED => &mut self.sampled,
            // Not a kind the probes write: held to the strictest rate.
            _ => &mut self.sampled,
        };
        rate.admit(ev.cgroup_id, ev.end_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn each_container_gets_its_own_rate() {
        let mut r = ContainerRate::new(5.0);
        // A burst of 100 in one instant: one second's worth (5) goes.
        let a = (0..100).filter(|_| r.admit(1, 10 * S)).count();
        assert_eq!(a, 5);
        // Another container is not held back by the first.
        assert_eq!((0..100).filter(|_| r.admit(2, 10 * S)).count(), 5);
        // 10 s at 1000 calls/s: about 5 per second (plus nothing saved up).
        let admitted = (0..10_000)
            .filter(|i| r.admit(1, 10 * S + (i + 1) * S / 1000))
            .count();
        assert!((49..=51).contains(&admitted), "{admitted}");
        // Out-of-order times refill nothing.
        let mut r = ContainerRate::new(1.0);
        assert!(r.admit(7, 5 * S));
        assert!(!r.admit(7, 4 * S));
        assert!(!r.admit(7, 5 * S + S / 2));
        assert!(r.admit(7, 6 * S));
    }

    #[test]
    fn no_limit_at_zero() {
        let mut r = ContainerRate::new(0.0);
        assert!((0..1000).all(|_| r.admit(1, S)));
        assert_eq!(r.containers(), 0);
    }

    #[test]
    fn the_map_is_bounded_and_forgets_full_buckets_first() {
        let mut r = ContainerRate::new(2.0);
        for c in 0..MAX_CONTAINERS as u64 {
            assert!(r.admit(c, S));
        }
        // Full of recently used buckets: a new container waits.
        assert!(!r.admit(u64::MAX, S + S / 10));
        assert_eq!(r.containers(), MAX_CONTAINERS);
        // A second later every bucket has refilled: they make room.
        assert!(r.admit(u64::MAX, 2 * S + 1));
        assert_eq!(r.containers(), 1);
    }
}
