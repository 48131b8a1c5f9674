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

use crate::handle::Region;
use crate::layout::{
    ApiRecord, GPU_DEVICES_PER_RECORD, KERNEL_ENTRIES, KERNEL_NAME_BYTES, KernelEntry,
    OTHER_KERNELS_HASH, OVERFLOW_SHARD, Shard, SlotHeader, THREAD_SHARDS,
};
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

/// One sampled launch's GPU time, as the limiter read it back from its event pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// GPU time between the events before and after the launch, ns.
    pub elapsed_ns: u64,
    /// Launches the sample stands for (the launches since the previous sample, itself included).
    pub launches: u64,
}

impl GpuSample {
    /// The GPU time of the launches the sample stands for, estimated.
    pub fn estimated_ns(self) -> u64 {
        self.elapsed_ns.saturating_mul(self.launches)
    }
}

/// What went wrong with a sample (counted in the shard's first [`crate::layout::GpuTimeRecord`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleProblem {
    /// An event call failed; the sample is dropped.
    EventError,
    /// A sample was not taken (too many pending, or the stream was being captured).
    Skipped,
}

/// The name hash a kernel entry is found by: FNV-1a of the whole name, never 0 (a free entry)
/// or [`OTHER_KERNELS_HASH`].
pub fn kernel_name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    match h {
        0 => 1,
        OTHER_KERNELS_HASH => OTHER_KERNELS_HASH - 1,
        h => h,
    }
}

/// A kernel's name as an entry keeps it: the hash of the whole name, its length and its first
/// [`KERNEL_NAME_BYTES`] bytes (taken when the launch is sampled: no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelName {
    hash: u64,
    len: u64,
    prefix: [u8; KERNEL_NAME_BYTES],
}

impl KernelName {
    /// The entry name of `name` (the driver's bytes, without the NUL).
    pub fn new(name: &[u8]) -> KernelName {
        let mut prefix = [0u8; KERNEL_NAME_BYTES];
        let kept = name.len().min(KERNEL_NAME_BYTES);
        prefix[..kept].copy_from_slice(&name[..kept]);
        KernelName {
            hash: kernel_name_hash(name),
            len: name.len() as u64,
            prefix,
        }
    }
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
        self.section_of(&record.seq, || write(record));
    }

    /// Runs `write` inside a section of the record whose sequence is `seq`; returns whether it
    /// ran (not when the overflow shard's record was busy: counted as dropped).
    #[inline(always)]
    fn section_of(&self, seq: &AtomicU64, write: impl FnOnce()) -> bool {
        let odd = if self.exclusive {
            seqlock::begin_exclusive(seq)
        } else {
            match self.begin_shared(seq) {
                Some(odd) => odd,
                None => return false,
            }
        };
        write();
        seqlock::end(seq, odd);
        true
    }

    /// Opens a section on a record of the overflow shard (threads past [`THREAD_SHARDS`]), or
    /// counts a dropped record. Out of line: most threads own a shard.
    #[cold]
    #[inline(never)]
    fn begin_shared(&self, seq: &AtomicU64) -> Option<u64> {
        let odd = seqlock::try_begin_shared(seq);
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

    /// Adds time the limiter held a call of `api` back (SM limit, or waiting for device memory).
    #[inline]
    pub fn add_throttled_ns(&self, api: ApiId, ns: u64) {
        self.section(api, |r| bump(&r.throttled_ns, ns));
    }
}

/// GPU time (layout 3.3): written by the thread that read a sampled event pair back, at the
/// sample rate (a few hundred per second), never on a launch's own path.
impl ShardWriter<'_> {
    /// Adds a sample of `device` (nothing for a device past [`agent_common::MAX_DEVICES`]).
    pub fn record_gpu_sample(&self, device: usize, sample: GpuSample) {
        let Some(record) = self.shard.gpu_time.get(device / GPU_DEVICES_PER_RECORD) else {
            return;
        };
        let c = &record.devices[device % GPU_DEVICES_PER_RECORD];
        self.section_of(&record.seq, || {
            bump(&c.estimated_ns, sample.estimated_ns());
            bump(&c.sampled_ns, sample.elapsed_ns);
            bump(&c.samples, 1);
            bump(&c.launches, sample.launches);
        });
    }

    /// Counts a sample that went wrong.
    pub fn count_sample_problem(&self, problem: SampleProblem) {
        let record = &self.shard.gpu_time[0];
        self.section_of(&record.seq, || match problem {
            SampleProblem::EventError => bump(&record.event_errors, 1),
            SampleProblem::Skipped => bump(&record.skipped, 1),
        });
    }

    /// Adds a sample of the kernel (or graph) named `name`: to its entry, taking a free one the
    /// first time, else to the last entry, which sums the kernels that found none.
    pub fn record_kernel_sample(&self, name: &KernelName, sample: GpuSample) {
        let hash = name.hash;
        let add = |e: &KernelEntry| {
            bump(&e.estimated_ns, sample.estimated_ns());
            bump(&e.sampled_ns, sample.elapsed_ns);
            bump(&e.samples, 1);
            bump(&e.launches, sample.launches);
        };
        let (named, other) = self.shard.kernels.split_at(KERNEL_ENTRIES - 1);
        for e in named {
            // Relaxed: a hint; the entry's hash is checked again inside its section.
            let seen = e.name_hash.load(Ordering::Relaxed);
            if seen != hash && seen != 0 {
                continue;
            }
            let mut mine = false;
            let ran = self.section_of(&e.seq, || {
                let current = e.name_hash.load(Ordering::Relaxed);
                if current == 0 {
                    write_name(e, hash, name);
                    mine = true;
                } else {
                    mine = current == hash;
                }
                if mine {
                    add(e);
                }
            });
            if !ran || mine {
                return;
            }
        }
        let e = &other[0];
        self.section_of(&e.seq, || {
            e.name_hash.store(OTHER_KERNELS_HASH, Ordering::Relaxed);
            add(e);
        });
    }
}

/// Writes a free entry's name and hash (inside its section).
fn write_name(e: &KernelEntry, hash: u64, name: &KernelName) {
    // Relaxed: inside the entry's write section.
    e.name_hash.store(hash, Ordering::Relaxed);
    e.name_len.store(name.len, Ordering::Relaxed);
    let (chunks, _) = name.prefix.as_chunks::<8>();
    for (w, chunk) in e.name.iter().zip(chunks) {
        w.store(u64::from_le_bytes(*chunk), Ordering::Relaxed);
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
