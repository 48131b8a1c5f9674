//! Lock-free statistics: a per-thread writer handle over a single-writer seqlocked shard.
//!
//! A thread claims one of the slot's [`THREAD_SHARDS`] once (CAS of `owner_tid` from 0 to its
//! tid) and is then its only writer. When all are taken, threads share the overflow shard, whose
//! odd sequence doubles as a try-only writer bit: a contended record is counted in the slot's
//! `dropped_records` instead of waiting. Recording is a handful of `Relaxed` loads and stores
//! between two sequence stores: no locks, no allocation, no system calls.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_common::api::ApiId;
use agent_common::hist::bucket_of;

use crate::layout::{ApiCounters, OVERFLOW_SHARD, Shard, SlotHeader, THREAD_SHARDS};
use crate::region::Region;
use crate::seqlock;
use crate::slots::Slot;

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

impl Region {
    /// A statistics writer for the calling thread in `slot`: claims a free thread shard, or
    /// falls back to the shared overflow shard.
    pub fn shard_writer(&self, slot: &Slot) -> ShardWriter<'_> {
        let record = self
            .slot_record(slot.index())
            .expect("a Slot always indexes its region");
        let tid = crate::procfs::current_tid();
        let mut chosen = (OVERFLOW_SHARD, false);
        for (i, shard) in record.shards.iter().enumerate().take(THREAD_SHARDS) {
            // Acquire on success: pairs with the previous owner's Release store of 0 in `Drop`,
            // so its last section's data is visible to our load+store increments.
            if shard
                .owner_tid
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

    #[inline(always)]
    fn section(&self, write: impl FnOnce(&'r Shard)) {
        let odd = if self.exclusive {
            seqlock::begin_exclusive(&self.shard.seq)
        } else {
            match seqlock::try_begin_shared(&self.shard.seq) {
                Some(odd) => odd,
                None => {
                    // Relaxed: a statistic.
                    self.slot.dropped_records.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        };
        write(self.shard);
        bump(&self.shard.write_sections, 1);
        seqlock::end(&self.shard.seq, odd);
    }

    #[inline(always)]
    fn api(shard: &Shard, api: ApiId) -> Option<(&ApiCounters, usize)> {
        let index = api.0 as usize;
        shard.apis.get(index).map(|counters| (counters, index))
    }

    /// Records one call of `api` that took `latency_ns` (as the application saw it).
    #[inline]
    pub fn record_call(&self, api: ApiId, latency_ns: u64, ok: bool) {
        self.record_call_timed(api, latency_ns, 0, ok);
    }

    /// Records one call and the time spent inside the limiter's hook for it, in one section.
    #[inline]
    pub fn record_call_timed(&self, api: ApiId, latency_ns: u64, hook_ns: u64, ok: bool) {
        self.section(|shard| {
            let Some((counters, index)) = Self::api(shard, api) else {
                return;
            };
            bump(&counters.calls, 1);
            bump(&counters.errors, u64::from(!ok));
            bump(&counters.latency_ns, latency_ns);
            bump(&counters.hook_ns, hook_ns);
            bump(&shard.hist[index][bucket_of(latency_ns)], 1);
        });
    }

    /// Records `bytes` allocated through `api`.
    #[inline]
    pub fn record_alloc(&self, api: ApiId, bytes: u64) {
        self.section(|shard| {
            if let Some((counters, _)) = Self::api(shard, api) {
                bump(&counters.bytes_allocated, bytes);
            }
        });
    }

    /// Records `bytes` freed through `api`.
    #[inline]
    pub fn record_free(&self, api: ApiId, bytes: u64) {
        self.section(|shard| {
            if let Some((counters, _)) = Self::api(shard, api) {
                bump(&counters.bytes_freed, bytes);
            }
        });
    }

    /// Records an allocation of `bytes` through `api` denied by the limit.
    #[inline]
    pub fn record_denied(&self, api: ApiId, bytes: u64) {
        self.section(|shard| {
            if let Some((counters, _)) = Self::api(shard, api) {
                bump(&counters.denied, 1);
                bump(&counters.denied_bytes, bytes);
            }
        });
    }

    /// Adds limiter self-time for `api` not covered by `record_call_timed`.
    #[inline]
    pub fn add_hook_ns(&self, api: ApiId, ns: u64) {
        self.section(|shard| {
            if let Some((counters, _)) = Self::api(shard, api) {
                bump(&counters.hook_ns, ns);
            }
        });
    }

    /// Adds time the limiter throttled this thread (SM limit).
    #[inline]
    pub fn add_throttled_ns(&self, ns: u64) {
        self.section(|shard| bump(&shard.throttled_ns, ns));
    }
}

impl Drop for ShardWriter<'_> {
    fn drop(&mut self) {
        // In a forked child the shard still belongs to the parent's thread: leave it alone.
        if self.exclusive && std::process::id() == self.owner_pid {
            // Release: pairs with the next owner's Acquire CAS in `shard_writer`.
            self.shard.owner_tid.store(0, Ordering::Release);
        }
    }
}
