//! The accounting boundary: what the hooks reserve, release and record.
//!
//! Hooks only call the [`Accounting`] trait. Two implementations: [`InProcess`] (per-device atomic
//! counters with compare-and-swap reservation, exact within one process; used when no region is
//! configured or it cannot be opened) and the limiter's region ledger (the container's region:
//! exact across processes, statistics in per-thread shards). The limiter picks one per process.
//!
//! [`crate::alloc_table::AllocTable`] remembers what each live allocation charged (address or
//! handle to device and bytes) so frees release exactly that.

use std::sync::atomic::{AtomicU64, Ordering};

use agent_common::api::{API_SLOTS, ApiId};

use agent_common::MAX_DEVICES;

use crate::config::Config;

/// One hooked call, as it is recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Call {
    /// Latency as the application saw it (the driver's part), ns.
    pub latency_ns: u64,
    /// Whether the call succeeded.
    pub ok: bool,
    /// Bytes the call allocated.
    pub bytes_allocated: u64,
    /// Bytes the call freed.
    pub bytes_freed: u64,
    /// Bytes the call copied.
    pub bytes_moved: u64,
}

/// A reservation that would pass the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("device {device}: {requested} bytes requested, {used} of {limit} in use")]
pub struct Denied {
    pub device: usize,
    pub requested: u64,
    pub used: u64,
    pub limit: u64,
}

/// What the hooks need from an accounting backend.
pub trait Accounting: Sync {
    /// Reserves `bytes` on `device` if that keeps it within its limit.
    fn try_reserve(&self, device: usize, bytes: u64) -> Result<(), Denied>;
    /// Returns bytes reserved earlier.
    fn release(&self, device: usize, bytes: u64);
    /// Bytes reserved on `device`.
    fn used(&self, device: usize) -> u64;
    /// The limit of `device`, if any.
    fn limit(&self, device: usize) -> Option<u64>;
    /// One call of `api`, recorded at once (one seqlock section in a region): `hook_ns`, the
    /// limiter's self-time for it, is computed last, so that a clock read there covers the
    /// recording too.
    fn record(&self, api: ApiId, call: Call, hook_ns: impl FnOnce() -> u64);
    /// One call of `api` that took `latency_ns` in the driver and `hook_ns` in the limiter.
    #[inline(always)]
    fn record_call(&self, api: ApiId, latency_ns: u64, hook_ns: u64, ok: bool) {
        let call = Call {
            latency_ns,
            ok,
            ..Call::default()
        };
        self.record(api, call, || hook_ns);
    }
    fn record_denied(&self, api: ApiId, bytes: u64);
    /// Time spent in the limiter's own logic around a call.
    fn add_hook_ns(&self, api: ApiId, ns: u64);
    /// Time the SM controller held a call of `api` back.
    fn record_throttled(&self, api: ApiId, ns: u64);
}

/// Counters of one API. Every field is an independent statistic: Relaxed throughout.
#[derive(Debug, Default)]
pub(crate) struct ApiStats {
    pub(crate) calls: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) latency_ns: AtomicU64,
    pub(crate) hook_ns: AtomicU64,
    pub(crate) alloc_bytes: AtomicU64,
    pub(crate) free_bytes: AtomicU64,
    pub(crate) moved_bytes: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) denied_bytes: AtomicU64,
}

/// Accounting within this process.
#[derive(Debug)]
pub struct InProcess {
    /// `u64::MAX` where a device has no limit.
    limit: [u64; MAX_DEVICES],
    used: [AtomicU64; MAX_DEVICES],
    apis: [ApiStats; API_SLOTS],
    /// Releases larger than what was reserved (a bookkeeping bug); clamped at zero, never wrapped.
    underflows: AtomicU64,
    /// Time launches were held back by the SM controller, ns.
    throttled_ns: AtomicU64,
}

impl InProcess {
    pub fn new(config: &Config) -> InProcess {
        InProcess {
            limit: config.memory_limit.map(|l| l.unwrap_or(u64::MAX)),
            used: std::array::from_fn(|_| AtomicU64::new(0)),
            apis: std::array::from_fn(|_| ApiStats::default()),
            underflows: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
        }
    }

    #[cfg(test)]
    pub(crate) fn stats(&self, api: ApiId) -> Option<&ApiStats> {
        self.apis.get(api.0 as usize)
    }

    #[cfg(test)]
    pub(crate) fn underflows(&self) -> u64 {
        self.underflows.load(Ordering::Relaxed)
    }

    /// One call of `api` and the limiter's self-time for it, `hook_ns`.
    #[inline(never)]
    pub fn record_now(&self, api: ApiId, call: Call, hook_ns: u64) {
        let Some(s) = self.apis.get(api.0 as usize) else {
            return;
        };
        // Relaxed (all): independent statistics.
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.latency_ns.fetch_add(call.latency_ns, Ordering::Relaxed);
        if !call.ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        if call.bytes_allocated != 0 {
            s.alloc_bytes
                .fetch_add(call.bytes_allocated, Ordering::Relaxed);
        }
        if call.bytes_freed != 0 {
            s.free_bytes.fetch_add(call.bytes_freed, Ordering::Relaxed);
        }
        if call.bytes_moved != 0 {
            s.moved_bytes.fetch_add(call.bytes_moved, Ordering::Relaxed);
        }
        if hook_ns != 0 {
            s.hook_ns.fetch_add(hook_ns, Ordering::Relaxed);
        }
    }
}

/// Out of line (`inline(never)`): a process with a region, the common case, never calls these, and
/// inlined into every hook they would sit between the hot lines of the region path.
impl Accounting for InProcess {
    #[inline(never)]
    fn try_reserve(&self, device: usize, bytes: u64) -> Result<(), Denied> {
        // Devices beyond the table are not limited (no configuration can name them).
        let (Some(used), Some(&limit)) = (self.used.get(device), self.limit.get(device)) else {
            return Ok(());
        };
        // Relaxed: `used` is the only state a reservation touches and nothing is published with it;
        // the atomicity of the compare-and-swap alone keeps every sum of reservations <= limit.
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => {
                    return Err(Denied {
                        device,
                        requested: bytes,
                        used: cur,
                        limit,
                    });
                }
            };
            match used.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    #[inline(never)]
    fn release(&self, device: usize, bytes: u64) {
        let Some(used) = self.used.get(device) else {
            return;
        };
        // Relaxed: as in `try_reserve`. Saturating so that a bookkeeping bug can never wrap the
        // counter into an enormous value (HAMi-core #200).
        let r = used.try_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
            Some(cur.saturating_sub(bytes))
        });
        if let Ok(prev) = r
            && prev < bytes
        {
            self.underflows.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn used(&self, device: usize) -> u64 {
        self.used
            .get(device)
            .map_or(0, |u| u.load(Ordering::Relaxed))
    }

    fn limit(&self, device: usize) -> Option<u64> {
        self.limit.get(device).copied().filter(|&l| l != u64::MAX)
    }

    #[inline(always)]
    fn record(&self, api: ApiId, call: Call, hook_ns: impl FnOnce() -> u64) {
        self.record_now(api, call, hook_ns());
    }

    fn record_denied(&self, api: ApiId, bytes: u64) {
        if let Some(s) = self.apis.get(api.0 as usize) {
            s.denied.fetch_add(1, Ordering::Relaxed);
            s.denied_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    fn add_hook_ns(&self, api: ApiId, ns: u64) {
        if let Some(s) = self.apis.get(api.0 as usize) {
            s.hook_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    fn record_throttled(&self, _api: ApiId, ns: u64) {
        // Relaxed: a statistic.
        self.throttled_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;

    fn limited(bytes: u64) -> InProcess {
        let mut c = Config::default();
        c.memory_limit[0] = Some(bytes);
        InProcess::new(&c)
    }

    #[test]
    fn reservations_stop_at_the_limit() {
        let a = limited(100);
        assert_eq!(a.try_reserve(0, 60), Ok(()));
        assert_eq!(
            a.try_reserve(0, 41),
            Err(Denied {
                device: 0,
                requested: 41,
                used: 60,
                limit: 100
            })
        );
        assert_eq!(a.try_reserve(0, 40), Ok(()));
        assert_eq!(a.used(0), 100);
        a.release(0, 60);
        assert_eq!(a.used(0), 40);
        assert_eq!(
            a.try_reserve(0, u64::MAX),
            Err(Denied {
                device: 0,
                requested: u64::MAX,
                used: 40,
                limit: 100
            })
        );
        // Unlimited devices and devices outside the table always succeed.
        assert_eq!(a.try_reserve(1, u64::MAX / 2), Ok(()));
        assert_eq!(a.limit(1), None);
        assert_eq!(a.try_reserve(MAX_DEVICES, 1), Ok(()));
    }

    #[test]
    fn release_saturates_and_counts_underflow() {
        let a = limited(100);
        a.try_reserve(0, 10).unwrap();
        a.release(0, 20);
        assert_eq!(a.used(0), 0);
        assert_eq!(a.underflows(), 1);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        const THREADS: usize = 16;
        let a = limited(1000 * 7 + 3);
        let start = Barrier::new(THREADS);
        let granted: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let mut n = 0;
                        while a.try_reserve(0, 7).is_ok() {
                            n += 7;
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(granted, 7000);
        assert_eq!(a.used(0), 7000);
    }

    #[test]
    fn records_per_api() {
        let a = limited(10);
        let id = ApiId(0);
        a.record_call(id, 5, 0, true);
        a.record_call(id, 7, 3, false);
        a.record_denied(id, 11);
        let s = a.stats(id).unwrap();
        assert_eq!(s.calls.load(Ordering::Relaxed), 2);
        assert_eq!(s.errors.load(Ordering::Relaxed), 1);
        assert_eq!(s.latency_ns.load(Ordering::Relaxed), 12);
        assert_eq!(s.denied_bytes.load(Ordering::Relaxed), 11);
        assert_eq!(s.hook_ns.load(Ordering::Relaxed), 3);
    }
}
