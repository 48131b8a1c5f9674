//! Reading a slot's statistics shards from `pread` copies, for each layout.
//!
//! - Layouts 1 and 2: one seqlock per shard ([`seqlock::read_copied`]): the sequence, a copy of
//!   the shard, the sequence again; a shard that stays inconsistent is left out whole.
//! - Layout 3: one seqlock per API record, read by comparing copies. The shard is copied once
//!   (one `pread`). Every word of a record only grows (sums and counts; the claimer's reset runs
//!   inside a section, and a slot whose state word changed during the read is read again), so a
//!   record whose statistics words all read as zero was empty at the instant of the copy's first
//!   read, whatever its sequence said: it holds nothing and is skipped (unless the sequence is
//!   odd: a writer stuck in its first section is still reported). Each other record is
//!   copied again alone (512 bytes, an Acquire fence before the copy) and taken when the two
//!   copies are identical, word for word, with an even sequence: a word equal in both copies
//!   held that value throughout, at the fence in between in particular, and the sequence, equal
//!   and even, says no section was open then; so the copy is the record as it was at one
//!   instant with no writer inside. No order of a copy's words is assumed. A record that differs
//!   is copied again and compared with its previous copy, at most [`seqlock::READ_RETRIES`]
//!   copies in all; the loom model `loom_record_copies_that_agree_are_consistent` checks the
//!   argument. Each copy after the first takes one retry from the snapshot's budget
//!   ([`super::Spend`]); when it runs out the records still pending are left out and reported.
//!   The GPU time of layout 3.3 is read the same way: its records, and each 128-byte kernel
//!   entry, are units under a seqlock of their own, sequence first, like an API record.
use std::mem::offset_of;
use std::sync::atomic::{Ordering, fence};

use agent_common::MAX_DEVICES;
use agent_common::api::{API_SLOTS, ApiId};
use agent_common::hist::HIST_BUCKETS;

use super::budget::Spend;
use super::file::{ReadError, RegionReader};
use super::snapshot::{
    ApiStats, GpuTimeStats, KernelStats, ReadCounters, ShardProblem, ShardProblemKind,
};
use crate::layout::{
    API_RECORD_SIZE, API_RECORDS, ApiRecord, GPU_DEVICE_RECORDS, GPU_DEVICES_PER_RECORD,
    GpuTimeCounters, GpuTimeRecord, KERNEL_ENTRIES, KERNEL_NAME_BYTES, KernelEntry,
    OTHER_KERNELS_HASH, SHARD_SIZE, Shard,
};
use crate::layout_v2::{ApiCountersV2, SHARD_SIZE_V2, ShardV2};
use crate::seqlock::{self, SeqRead};

/// What a slot's shards add up to.
pub(super) struct Totals {
    /// Per API id.
    pub(super) merged: Vec<Option<ApiStats>>,
    pub(super) throttled_ns: u64,
    pub(super) problems: Vec<ShardProblem>,
    /// GPU time per device (layout 3.3).
    pub(super) gpu_time: [GpuTimeStats; MAX_DEVICES],
    pub(super) sample_errors: u64,
    pub(super) samples_skipped: u64,
    /// Kernel entries merged over the shards, by hash and name.
    pub(super) kernels: Vec<KernelStats>,
}

impl Totals {
    pub(super) fn new() -> Totals {
        Totals {
            merged: vec![None; API_SLOTS],
            throttled_ns: 0,
            problems: Vec::new(),
            gpu_time: [GpuTimeStats::default(); MAX_DEVICES],
            sample_errors: 0,
            samples_skipped: 0,
            kernels: Vec::new(),
        }
    }

    /// Adds a consistent copy of `GpuTimeRecord` `g` of a shard.
    fn add_gpu_time(&mut self, g: usize, words: &[u64]) {
        self.sample_errors = self.sample_errors.wrapping_add(words[G_ERRORS]);
        self.samples_skipped = self.samples_skipped.wrapping_add(words[G_SKIPPED]);
        for d in 0..GPU_DEVICES_PER_RECORD {
            let Some(t) = self.gpu_time.get_mut(g * GPU_DEVICES_PER_RECORD + d) else {
                break;
            };
            let at = G_DEVICES + d * G_DEVICE_WORDS;
            t.add(&words[at..at + G_DEVICE_WORDS]);
        }
    }

    /// Adds a consistent copy of a `KernelEntry` (a free one adds nothing).
    fn add_kernel(&mut self, words: &[u64]) {
        let hash = words[K_HASH];
        if hash == 0 {
            return;
        }
        let other = hash == OTHER_KERNELS_HASH;
        let mut name = Vec::with_capacity(KERNEL_NAME_BYTES);
        if !other {
            for w in &words[K_NAME..K_NAME + KERNEL_NAME_BYTES / 8] {
                name.extend_from_slice(&w.to_le_bytes());
            }
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            name.truncate(len);
        }
        let name_len = if other { 0 } else { words[K_NAME_LEN] };
        let found = self
            .kernels
            .iter_mut()
            .find(|k| k.name_hash == hash && k.name == name);
        let k = match found {
            Some(k) => k,
            None => {
                self.kernels.push(KernelStats {
                    name_hash: hash,
                    name,
                    name_len,
                    other,
                    time: GpuTimeStats::default(),
                });
                self.kernels.last_mut().expect("just pushed")
            }
        };
        k.time.add(&words[K_COUNTERS..K_COUNTERS + 4]);
    }

    /// Adds one API's counters (in [`ApiCountersV2`] field order) and histogram.
    fn add(&mut self, index: usize, fields: &[u64], hist: &[u64], moved: u64) {
        if moved == 0 && fields.iter().all(|&v| v == 0) && hist.iter().all(|&v| v == 0) {
            return;
        }
        let stats = self.merged[index].get_or_insert(ApiStats {
            api: ApiId(index as u16),
            calls: 0,
            errors: 0,
            latency_ns: 0,
            hook_ns: 0,
            bytes_allocated: 0,
            bytes_freed: 0,
            denied: 0,
            denied_bytes: 0,
            bytes_moved: 0,
            histogram: [0; HIST_BUCKETS],
        });
        stats.bytes_moved = stats.bytes_moved.wrapping_add(moved);
        let targets = [
            &mut stats.calls,
            &mut stats.errors,
            &mut stats.latency_ns,
            &mut stats.hook_ns,
            &mut stats.bytes_allocated,
            &mut stats.bytes_freed,
            &mut stats.denied,
            &mut stats.denied_bytes,
        ];
        for (t, &v) in targets.into_iter().zip(fields) {
            *t = t.wrapping_add(v);
        }
        for (t, &v) in stats.histogram.iter_mut().zip(hist) {
            *t = t.wrapping_add(v);
        }
    }
}

/// Words of a layout 3 shard, of one of its records and of a kernel entry.
pub(super) const SHARD_WORDS: usize = SHARD_SIZE / 8;
const RECORD_WORDS: usize = API_RECORD_SIZE / 8;
const KERNEL_WORDS: usize = size_of::<KernelEntry>() / 8;
const G_ERRORS: usize = offset_of!(GpuTimeRecord, event_errors) / 8;
const G_SKIPPED: usize = offset_of!(GpuTimeRecord, skipped) / 8;
const G_DEVICES: usize = offset_of!(GpuTimeRecord, devices) / 8;
const G_DEVICE_WORDS: usize = size_of::<GpuTimeCounters>() / 8;
const K_HASH: usize = offset_of!(KernelEntry, name_hash) / 8;
const K_COUNTERS: usize = offset_of!(KernelEntry, estimated_ns) / 8;
const K_NAME_LEN: usize = offset_of!(KernelEntry, name_len) / 8;
const K_NAME: usize = offset_of!(KernelEntry, name) / 8;
// estimated, sampled, samples, launches: contiguous, in `GpuTimeCounters` order, in both.
const _: () = assert!(G_DEVICE_WORDS == 4);
const _: () = assert!(offset_of!(KernelEntry, launches) / 8 == K_COUNTERS + 3);
const R_CALLS: usize = offset_of!(ApiRecord, calls) / 8;
const R_THROTTLED: usize = offset_of!(ApiRecord, throttled_ns) / 8;
const R_DENIED: usize = offset_of!(ApiRecord, denied) / 8;
const R_HIST: usize = offset_of!(ApiRecord, hist) / 8;
const R_MOVED: usize = offset_of!(ApiRecord, bytes_moved) / 8;
const _: () = assert!(SHARD_WORDS == API_SLOTS * RECORD_WORDS);
const _: () = assert!(offset_of!(ApiRecord, seq) == 0);
// calls, errors, latency, hook, allocated, freed: contiguous, in `ApiCountersV2` order.
const _: () = assert!(offset_of!(ApiRecord, bytes_freed) / 8 == R_CALLS + 5);
const _: () = assert!(offset_of!(ApiRecord, denied_bytes) / 8 == R_DENIED + 1);

/// Words of a layout 1/2 shard, and where its parts are.
pub(super) const SHARD_WORDS_V2: usize = SHARD_SIZE_V2 / 8;
const V2_SEQ: usize = offset_of!(ShardV2, seq) / 8;
const V2_THROTTLED: usize = offset_of!(ShardV2, throttled_ns) / 8;
const V2_APIS: usize = offset_of!(ShardV2, apis) / 8;
const V2_HIST: usize = offset_of!(ShardV2, hist) / 8;
const V2_API_WORDS: usize = size_of::<ApiCountersV2>() / 8;
const _: () = assert!(V2_API_WORDS == 8);
const _: () = assert!(V2_APIS + API_SLOTS * V2_API_WORDS <= V2_HIST);
const _: () = assert!(V2_HIST + API_SLOTS * HIST_BUCKETS == SHARD_WORDS_V2);

impl RegionReader {
    /// Layouts 1 and 2: shard `index` of slot owner `pid`, at `at`, under its one seqlock.
    pub(super) fn read_shard_v2(
        &self,
        at: u64,
        (index, pid): (usize, u32),
        buf: &mut [u64],
        totals: &mut Totals,
        counters: &mut ReadCounters,
    ) -> Result<(), ReadError> {
        let shard = &mut buf[..SHARD_WORDS_V2];
        let outcome = seqlock::read_copied(
            || self.read_u64(at),
            || {
                self.read_words(at, shard)?;
                Ok(shard[V2_SEQ])
            },
        )?;
        match outcome {
            SeqRead::Consistent { retries } => {
                counters.seqlock_retries += u64::from(retries);
                totals.throttled_ns = totals.throttled_ns.wrapping_add(shard[V2_THROTTLED]);
                let apis = shard[V2_APIS..V2_APIS + API_SLOTS * V2_API_WORDS].chunks(V2_API_WORDS);
                let hists = shard[V2_HIST..].chunks(HIST_BUCKETS);
                for (i, (fields, hist)) in apis.zip(hists).enumerate() {
                    totals.add(i, fields, hist, 0);
                }
            }
            SeqRead::Stuck { seq } | SeqRead::Busy { seq } => {
                counters.seqlock_retries += u64::from(seqlock::READ_RETRIES);
                counters.shards_skipped += 1;
                totals.problems.push(ShardProblem {
                    shard: index,
                    kind: if seq & 1 == 1 {
                        ShardProblemKind::Stuck
                    } else {
                        ShardProblemKind::Busy
                    },
                    pid,
                    tid: self.read_u64(at + offset_of!(ShardV2, owner_tid) as u64)?,
                    seq,
                });
            }
        }
        Ok(())
    }

    /// Layout 3: shard `index` of slot owner `pid` (its thread `tid`), at `at`, record by record
    /// (see the module documentation). Records that stay inconsistent (or are still pending
    /// when `spend` runs out) are left out, and the shard is reported once.
    pub(super) fn read_shard_v3(
        &self,
        at: u64,
        (index, pid, tid): (usize, u32, u64),
        (last, fresh): (&mut [u64], &mut [u64]),
        totals: &mut Totals,
        (counters, spend): (&mut ReadCounters, &mut Spend),
    ) -> Result<(), ReadError> {
        let (last, fresh) = (&mut last[..SHARD_WORDS], &mut fresh[..SHARD_WORDS]);
        self.read_words(at, last)?;
        // (unit, its sequence was odd in every copy so far). A unit whose statistics are all
        // zero in this copy holds nothing (see the module docs) and is not copied again unless
        // its sequence is odd (a writer stuck in its first section is still reported): a thread
        // records a handful of APIs, so the second copies are a few 512-byte reads.
        let mut pending: Vec<(Unit, bool)> = UNITS
            .iter()
            .copied()
            .filter(|u| {
                let words = &last[u.words()];
                words[0] & 1 == 1 || words[1..].iter().any(|&w| w != 0)
            })
            .map(|u| (u, last[u.start] & 1 == 1))
            .collect();
        // Each attempt copies the pending units once more and compares each with its previous
        // copy: at most READ_RETRIES copies in all, the whole-shard one included.
        let mut attempt = 1;
        while !pending.is_empty() && attempt < seqlock::READ_RETRIES {
            if attempt > 1 {
                if !spend.retry(pending.len() as u64) {
                    break;
                }
                seqlock::backoff(attempt);
                counters.seqlock_retries += pending.len() as u64;
            }
            let mut still = Vec::new();
            for (u, odd_always) in pending {
                let words = u.words();
                // Acquire: orders the previous copy's loads before this one's (module docs).
                fence(Ordering::Acquire);
                self.read_words(at + (u.start * 8) as u64, &mut fresh[words.clone()])?;
                let (a, b) = (&last[words.clone()], &fresh[words.clone()]);
                if seqlock::copies_agree(a, b, 0) {
                    add_unit(totals, u, b);
                } else {
                    still.push((u, odd_always && b[0] & 1 == 1));
                    last[words.clone()].copy_from_slice(&fresh[words]);
                }
            }
            pending = still;
            attempt += 1;
        }
        if let Some(&(u, _)) = pending.first() {
            counters.shards_skipped += 1;
            totals.problems.push(ShardProblem {
                shard: index,
                kind: if pending.iter().all(|&(_, odd)| odd) {
                    ShardProblemKind::Stuck
                } else {
                    ShardProblemKind::Busy
                },
                pid,
                tid,
                seq: last[u.start],
            });
        }
        Ok(())
    }
}

/// What a unit of a layout 3 shard holds: a unit is the words under one seqlock, its sequence
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnitKind {
    /// The record of an API id.
    Api(usize),
    /// A [`GpuTimeRecord`] (its index in the shard).
    GpuTime(usize),
    /// A [`KernelEntry`].
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unit {
    kind: UnitKind,
    /// First word in the shard.
    start: usize,
    len: usize,
}

impl Unit {
    fn words(self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// Every unit of a layout 3 shard, in order.
const UNITS: [Unit; API_RECORDS + GPU_DEVICE_RECORDS + KERNEL_ENTRIES] = {
    let mut units = [Unit {
        kind: UnitKind::Kernel,
        start: 0,
        len: 0,
    }; API_RECORDS + GPU_DEVICE_RECORDS + KERNEL_ENTRIES];
    let mut i = 0;
    while i < API_RECORDS {
        units[i] = Unit {
            kind: UnitKind::Api(i),
            start: i * RECORD_WORDS,
            len: RECORD_WORDS,
        };
        i += 1;
    }
    let mut g = 0;
    while g < GPU_DEVICE_RECORDS {
        units[API_RECORDS + g] = Unit {
            kind: UnitKind::GpuTime(g),
            start: offset_of!(Shard, gpu_time) / 8 + g * RECORD_WORDS,
            len: RECORD_WORDS,
        };
        g += 1;
    }
    let mut k = 0;
    while k < KERNEL_ENTRIES {
        units[API_RECORDS + GPU_DEVICE_RECORDS + k] = Unit {
            kind: UnitKind::Kernel,
            start: offset_of!(Shard, kernels) / 8 + k * KERNEL_WORDS,
            len: KERNEL_WORDS,
        };
        k += 1;
    }
    units
};

/// Adds a consistent copy of unit `u` (layout 3).
fn add_unit(totals: &mut Totals, u: Unit, words: &[u64]) {
    match u.kind {
        UnitKind::Api(k) => add_record(totals, k, words),
        UnitKind::GpuTime(g) => totals.add_gpu_time(g, words),
        UnitKind::Kernel => totals.add_kernel(words),
    }
}

/// Adds a consistent copy of record `k` (layout 3).
fn add_record(totals: &mut Totals, k: usize, record: &[u64]) {
    totals.throttled_ns = totals.throttled_ns.wrapping_add(record[R_THROTTLED]);
    let mut fields = [0u64; V2_API_WORDS];
    fields[..6].copy_from_slice(&record[R_CALLS..R_CALLS + 6]);
    fields[6..].copy_from_slice(&record[R_DENIED..R_DENIED + 2]);
    totals.add(
        k,
        &fields,
        &record[R_HIST..R_HIST + HIST_BUCKETS],
        record[R_MOVED],
    );
}
