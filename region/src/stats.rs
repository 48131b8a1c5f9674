//! Lock-free statistics: a per-thread writer handle over a single-writer shard of per-API
//! records, each under its own seqlock.
//!
//! A thread claims one of the slot's [`THREAD_SHARDS`] once (CAS of the slot header's
//! `shard_owner[i]` from 0 to its tid) and is then the only writer of its records. When all are
//! taken, threads share the overflow shard, where each record's odd sequence doubles as a
//! try-only writer bit: a contended record is counted in the slot's `dropped_records` instead of
//! waiting (threads recording different APIs do not contend). Recording a call is one section
//! of plain `Relaxed` loads and stores in the API's record: its first cache line (sequence and
//! counters) and one histogram line, on one page. No locks, no allocation, no system calls.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_common::api::ApiId;
use agent_common::hist::bucket_of;

use crate::layout::{ApiRecord, OVERFLOW_SHARD, Shard, SlotHeader, THREAD_SHARDS};
use crate::region::Region;
use crate::seqlock;
use crate::slots::Slot;

/// One call as a hook records it, in one section of the API's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// The calling thread's handle for recording statistics into its process's slot.
///
/// Not `Send`: it belongs to the thread that made it. Keep one per thread (a thread-local);
/// dropping it frees its shard for another thread. After `fork()`, the child must not use or drop
/// writers made in the parent (forget them); dropping one there is harmless because `Drop`
/// only releases the shard in the process that claimed it.
pub struct ShardWriter<'r> {
    shard: &'r Shard,
    slot: &'r SlotHeader,
    shard_index: u8,
    exclusive: bool,
    owner_pid: u32,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for ShardWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter")
            .field("shard", &self.shard_index)
            .field("exclusive", &self.exclusive)
            .finish()
    }
}

/// Adds to a counter that only the current section's writer changes: a load and a store, no
/// read-modify-write instruction needed.
#[inline(always)]
fn bump(counter: &AtomicU64, value: u64) {
    // Relaxed: inside a seqlock write section; published by the section's Release end.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(value),
        Ordering::Relaxed,
    );
}

impl ApiRecord {
    /// Prefetches the two lines a record of a call that took `latency_ns` touches: the first
    /// (sequence and counters) and the histogram bucket's.
    #[inline(always)]
    pub fn prefetch(&self, latency_ns: u64) {
        crate::prefetch::line_for_write(&self.seq);
        crate::prefetch::line_for_write(&self.hist[bucket_of(latency_ns)]);
    }
}

impl Region {
    /// A statistics writer for the calling thread in `slot`: claims a free thread shard, or
    /// falls back to the shared overflow shard.
    pub fn shard_writer(&self, slot: &Slot) -> ShardWriter<'_> {
        let record = self
            .slot_record(slot.index())
            .expect("a Slot always indexes its region");
        let tid = crate::procfs::current_tid();
        let mut chosen = (OVERFLOW_SHARD, false);
        for (i, owner) in record
            .header
            .shard_owner
            .iter()
            .enumerate()
            .take(THREAD_SHARDS)
        {
            // Acquire on success: pairs with the previous owner's Release store of 0 in `Drop`,
            // so its last sections' data are visible to our load+store increments.
            if owner
                .compare_exchange(0, tid, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                chosen = (i, true);
                break;
            }
        }
        // Relaxed: read by the next claimer after the slot state's Release/Acquire hand-over.
        record
            .header
            .used_shards
            .fetch_or(1 << chosen.0, Ordering::Relaxed);
        ShardWriter {
            shard: &record.shards[chosen.0],
            slot: &record.header,
            shard_index: chosen.0 as u8,
            exclusive: chosen.1,
            owner_pid: slot.owner_pid(),
            _not_send: PhantomData,
        }
    }
}

impl<'r> ShardWriter<'r> {
    /// Index of the shard this writer writes (`THREAD_SHARDS` = the overflow shard).
    pub fn shard_index(&self) -> usize {
        self.shard_index as usize
    }

    /// Whether this writer owns its shard (false: the shared overflow shard).
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// The record a call of `api` is written into (`None` for an id past the table): for a
    /// caller that prefetches its lines later, without this writer at hand.
    #[inline(always)]
    pub fn record_of(&self, api: ApiId) -> Option<&'r ApiRecord> {
        self.shard.apis.get(api.0 as usize)
    }

    /// Runs `write` inside a section of `api`'s record (nothing for an id past the table).
    #[inline(always)]
    fn section(&self, api: ApiId, write: impl FnOnce(&'r ApiRecord)) {
        let Some(record) = self.shard.apis.get(api.0 as usize) else {
            return;
        };
        let odd = if self.exclusive {
            seqlock::begin_exclusive(&record.seq)
        } else {
            match self.begin_shared(record) {
                Some(odd) => odd,
                None => return,
            }
        };
        write(record);
        seqlock::end(&record.seq, odd);
    }

    /// Opens a section on a record of the overflow shard (threads past [`THREAD_SHARDS`]), or
    /// counts a dropped record. Out of line: most threads own a shard.
    #[cold]
    #[inline(never)]
    fn begin_shared(&self, record: &ApiRecord) -> Option<u64> {
        let odd = seqlock::try_begin_shared(&record.seq);
        if odd.is_none() {
            // Relaxed: a statistic.
            self.slot.dropped_records.fetch_add(1, Ordering::Relaxed);
        }
        odd
    }

    /// Records one call of `api`, in one section: counts, latency and its histogram bucket,
    /// bytes, and the limiter's self-time, which `hook_ns` computes last, inside the section (so
    /// that a clock read there covers the recording too).
    #[inline]
    pub fn record(&self, api: ApiId, call: Call, hook_ns: impl FnOnce() -> u64) {
        self.section(api, |r| {
            bump(&r.calls, 1);
            bump(&r.errors, u64::from(!call.ok));
            bump(&r.latency_ns, call.latency_ns);
            bump(&r.bytes_allocated, call.bytes_allocated);
            bump(&r.bytes_freed, call.bytes_freed);
            bump(&r.hist[bucket_of(call.latency_ns)], 1);
            // Only copies touch the line of this word.
            if call.bytes_moved != 0 {
                bump(&r.bytes_moved, call.bytes_moved);
            }
            bump(&r.hook_ns, hook_ns());
        });
    }

    /// Records one call of `api` that took `latency_ns` (as the application saw it).
    #[inline]
    pub fn record_call(&self, api: ApiId, latency_ns: u64, ok: bool) {
        self.record_call_timed(api, latency_ns, 0, ok);
    }

    /// Records one call and the time spent inside the limiter's hook for it, in one section.
    #[inline]
    pub fn record_call_timed(&self, api: ApiId, latency_ns: u64, hook_ns: u64, ok: bool) {
        let call = Call {
            latency_ns,
            ok,
            ..Call::default()
        };
        self.record(api, call, || hook_ns);
    }

    /// Records `bytes` allocated through `api`.
    #[inline]
    pub fn record_alloc(&self, api: ApiId, bytes: u64) {
        self.section(api, |r| bump(&r.bytes_allocated, bytes));
    }

    /// Records `bytes` freed through `api`.
    #[inline]
    pub fn record_free(&self, api: ApiId, bytes: u64) {
        self.section(api, |r| bump(&r.bytes_freed, bytes));
    }

    /// Records an allocation of `bytes` through `api` denied by the limit.
    #[inline]
    pub fn record_denied(&self, api: ApiId, bytes: u64) {
        self.section(api, |r| {
            bump(&r.denied, 1);
            bump(&r.denied_bytes, bytes);
        });
    }

    /// Adds limiter self-time for `api` not covered by a recorded call.
    #[inline]
    pub fn add_hook_ns(&self, api: ApiId, ns: u64) {
        self.section(api, |r| bump(&r.hook_ns, ns));
    }

    /// Adds time the limiter held a call of `api` back (SM limit).
    #[inline]
    pub fn add_throttled_ns(&self, api: ApiId, ns: u64) {
        self.section(api, |r| bump(&r.throttled_ns, ns));
    }
}

impl Drop for ShardWriter<'_> {
    fn drop(&mut self) {
        // In a forked child the shard still belongs to the parent's thread: leave it alone.
        if self.exclusive && std::process::id() == self.owner_pid {
            // Release: pairs with the next owner's Acquire CAS in `shard_writer`.
            self.slot.shard_owner[self.shard_index as usize].store(0, Ordering::Release);
        }
    }
}
