//! Log2 latency histograms, shared by the eBPF aggregation and the limiter's region shards so that
//! both views of a call bucket the same way.

/// Number of buckets. Bucket `i` (for `0 < i < HIST_BUCKETS - 1`) holds latencies in
/// `[2^i, 2^(i+1))` ns; bucket 0 holds 0 and 1 ns; the last bucket holds everything from
/// `2^(HIST_BUCKETS-1)` ns (about 275 s) up.
pub const HIST_BUCKETS: usize = 39;

/// The bucket of a latency in nanoseconds.
#[inline(always)]
pub const fn bucket_of(ns: u64) -> usize {
    if ns < 2 {
        return 0;
    }
    let b = 63 - ns.leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// The lower bound of a bucket, in nanoseconds.
#[inline]
pub const fn bucket_lower_ns(bucket: usize) -> u64 {
    if bucket == 0 { 0 } else { 1u64 << bucket }
}

/// The exclusive upper bound of a bucket, in nanoseconds (`u64::MAX` for the last one).
#[inline]
pub const fn bucket_upper_ns(bucket: usize) -> u64 {
    if bucket + 1 >= HIST_BUCKETS {
        u64::MAX
    } else {
        1u64 << (bucket + 1)
    }
}

/// Estimates a quantile (`q` in 0..=1) from bucket counts by interpolating linearly inside the
/// bucket that holds it. Returns `None` for an empty histogram.
pub fn quantile_ns(buckets: &[u64; HIST_BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    // Rank of the wanted observation, 1-based.
    let rank = ((q * total as f64) as u64).clamp(1, total);
    let mut seen = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if seen + n >= rank {
            let lo = bucket_lower_ns(i);
            let hi = if i + 1 >= HIST_BUCKETS {
                lo.saturating_mul(2)
            } else {
                bucket_upper_ns(i)
            };
            let within = (rank - seen) as f64 / n as f64;
            return Some(lo + ((hi - lo) as f64 * within) as u64);
        }
        seen += n;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(3), 1);
        assert_eq!(bucket_of(4), 2);
        assert_eq!(bucket_of(1023), 9);
        assert_eq!(bucket_of(1024), 10);
        // 200 us lands in [131072, 262144).
        assert_eq!(bucket_of(200_000), 17);
        assert_eq!(bucket_of(u64::MAX), HIST_BUCKETS - 1);
        for b in 1..HIST_BUCKETS - 1 {
            assert_eq!(bucket_of(bucket_lower_ns(b)), b);
            assert_eq!(bucket_of(bucket_upper_ns(b) - 1), b);
        }
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut h = [0u64; HIST_BUCKETS];
        assert_eq!(quantile_ns(&h, 0.5), None);
        h[17] = 100;
        let p50 = quantile_ns(&h, 0.5).unwrap();
        assert!((131_072..262_144).contains(&p50), "{p50}");
        h[10] = 900;
        // 90% of calls are ~1 us, so p50 is in bucket 10 and p99 in bucket 17.
        assert_eq!(bucket_of(quantile_ns(&h, 0.5).unwrap()), 10);
        assert_eq!(bucket_of(quantile_ns(&h, 0.99).unwrap()), 17);
    }
}
