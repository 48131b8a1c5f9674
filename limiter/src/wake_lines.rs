//! The lines the rest of an allocation or a free touches after its driver call: gathered before
//! the call, fetched all at once the moment it returns.
//!
//! With several processes allocating at once the driver makes each call wait, and the thread
//! sleeps there; when it wakes, every line it touches is a miss. Found through the structures
//! that lead to them, those misses come one after the other: the hot line gives the thread
//! words' offset, the words give the statistics writer, the writer gives the record; the process
//! gives the reservation cells. Before the call all of these are at hand (the hook has just
//! used them), so their addresses are kept in one line of the stack and, after the call, one
//! prefetch per line is issued back to back: one dependent miss (the stack line) and then all of
//! them overlapped. Measured on the H100: docs/benchmarks.md, "Sixth session".
//!
//! Hints only: an address is never dereferenced here, and a stale one costs nothing wrong.

use std::sync::atomic::Ordering::Relaxed;

use agent_common::api::ApiId;
use region::layout::ApiRecord;

use crate::{accounting::Accounting as _, hot::hot, process::Process, state::State, thread_words};

/// See the module documentation: one line of the caller's stack.
#[repr(C, align(64))]
pub struct WakeLines {
    /// Lines to fetch for writing (a repeated address where there is nothing else to fetch).
    lines: [usize; 7],
    /// The call's statistics record: its histogram line depends on the latency.
    record: Option<&'static ApiRecord>,
}

const _: () = assert!(size_of::<WakeLines>() == 64);

impl WakeLines {
    /// Before an allocation's driver call: what keeping it (the table insert) and recording it
    /// touch.
    #[inline(always)]
    pub fn for_allocation(state: &State, process: &Process, api: ApiId) -> WakeLines {
        let ptrs = std::ptr::from_ref(&process.ptrs) as usize;
        Self::gather(state, process, api, [ptrs, ptrs + 64])
    }

    /// Before a free's driver call: what recording it and, if it `releases` a charge on device
    /// 0, the release touch (the container's line is shared with the other processes: it is not
    /// taken from them for a free that releases nothing).
    #[inline(always)]
    pub fn for_free(state: &State, process: &Process, api: ApiId, releases: bool) -> WakeLines {
        let extra = if releases {
            let hot = hot();
            // Relaxed: addresses kept as hints (see `Hot`).
            [
                hot.slot_line.load(Relaxed),
                hot.container_line.load(Relaxed),
            ]
        } else {
            [0, 0]
        };
        Self::gather(state, process, api, extra)
    }

    #[inline(always)]
    fn gather(state: &State, process: &Process, api: ApiId, extra: [usize; 2]) -> WakeLines {
        let hot = std::ptr::from_ref(hot()) as usize;
        let nonzero = |a: usize| if a == 0 { hot } else { a };
        WakeLines {
            lines: [
                hot,
                std::ptr::from_ref(state) as usize,
                std::ptr::from_ref(thread_words::current()) as usize,
                nonzero(thread_words::thread_pointer()),
                std::ptr::from_ref(process) as usize,
                nonzero(extra[0]),
                nonzero(extra[1]),
            ],
            record: process.ledger.stats_record(api),
        }
    }

    /// Right after the driver call, which took `latency_ns`: fetches every line at once.
    #[inline(always)]
    pub fn fetch(&self, latency_ns: u64) {
        for &line in &self.lines {
            region::prefetch::line_for_write(line as *const u8);
        }
        if let Some(record) = self.record {
            record.prefetch(latency_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_common::api::ApiId;
    use region::{Region, RegionConfig};

    use crate::{
        accounting::{Accounting as _, Call},
        shared::RegionLedger,
    };

    /// The record the wake lines prefetch is the one the call is then written into, and looking
    /// it up never claims a writer (it runs outside the hooks' shields).
    #[test]
    fn the_prefetched_record_is_the_one_written() {
        let path = std::env::temp_dir().join(format!("vgpu-wake-lines-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
        let region: &'static Region = Box::leak(Box::new(region));
        let ledger = RegionLedger::new(region, region.claim_slot().unwrap());
        let api = ApiId::from_name("cuMemAlloc_v2").unwrap();
        // A fresh thread has no writer yet: nothing to prefetch, and none claimed.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(ledger.stats_record(api).is_none());
                assert!(ledger.stats_record(api).is_none());
                let call = Call {
                    latency_ns: 1_000,
                    ok: true,
                    ..Call::default()
                };
                ledger.record(api, call, || 10);
                let record = ledger
                    .stats_record(api)
                    .expect("the writer claimed by the record");
                assert_eq!(record.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
                ledger.record(api, call, || 10);
                assert_eq!(record.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
                // Prefetching is harmless whatever the latency's bucket.
                for latency in [0, 1, 1_000_000, u64::MAX] {
                    record.prefetch(latency);
                }
            });
        });
        let _ = std::fs::remove_file(&path);
    }
}
