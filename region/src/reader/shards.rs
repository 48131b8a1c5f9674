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
use std::mem::offset_of;
use std::sync::atomic::{Ordering, fence};

use agent_common::api::{API_SLOTS, ApiId};
use agent_common::hist::HIST_BUCKETS;

use super::{
    ApiStats, ReadCounters, ReadError, RegionReader, ShardProblem, ShardProblemKind, Spend,
};
use crate::layout::{API_RECORD_SIZE, ApiRecord, SHARD_SIZE};
use crate::layout_v2::{ApiCountersV2, SHARD_SIZE_V2, ShardV2};
use crate::seqlock::{self, SeqRead};

/// What a slot's shards add up to.
pub(super) struct Totals {
    /// Per API id.
    pub(super) merged: Vec<Option<ApiStats>>,
    pub(super) throttled_ns: u64,
    pub(super) problems: Vec<ShardProblem>,
}

impl Totals {
    pub(super) fn new() -> Totals {
        Totals {
            merged: vec![None; API_SLOTS],
            throttled_ns: 0,
            problems: Vec::new(),
        }
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

/// Words of a layout 3 shard and of one of its records.
pub(super) const SHARD_WORDS: usize = SHARD_SIZE / 8;
const RECORD_WORDS: usize = API_RECORD_SIZE / 8;
const R_SEQ: usize = offset_of!(ApiRecord, seq) / 8;
const R_CALLS: usize = offset_of!(ApiRecord, calls) / 8;
const R_THROTTLED: usize = offset_of!(ApiRecord, throttled_ns) / 8;
const R_DENIED: usize = offset_of!(ApiRecord, denied) / 8;
const R_HIST: usize = offset_of!(ApiRecord, hist) / 8;
const R_MOVED: usize = offset_of!(ApiRecord, bytes_moved) / 8;
const _: () = assert!(SHARD_WORDS == API_SLOTS * RECORD_WORDS);
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
    fn read_words(&self, offset: u64, words: &mut [u64]) -> Result<(), ReadError> {
        crate::pread::read_words(&self.file, offset, words).map_err(|e| self.pread_error(e))
    }

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
        // (record, its sequence was odd in every copy so far). A record whose statistics are all
        // zero in this copy holds nothing (see the module docs) and is not copied again unless
        // its sequence is odd (a writer stuck in its first section is still reported): a thread
        // records a handful of APIs, so the second copies are a few 512-byte reads.
        let mut pending: Vec<(usize, bool)> = (0..API_SLOTS)
            .filter(|&k| {
                let record = &last[k * RECORD_WORDS..(k + 1) * RECORD_WORDS];
                record[R_SEQ] & 1 == 1
                    || record
                        .iter()
                        .enumerate()
                        .any(|(i, &w)| i != R_SEQ && w != 0)
            })
            .map(|k| (k, last[k * RECORD_WORDS + R_SEQ] & 1 == 1))
            .collect();
        // Each attempt copies the pending records once more and compares each with its previous
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
            for (k, odd_always) in pending {
                let words = k * RECORD_WORDS..(k + 1) * RECORD_WORDS;
                // Acquire: orders the previous copy's loads before this one's (module docs).
                fence(Ordering::Acquire);
                self.read_words(at + (k * API_RECORD_SIZE) as u64, &mut fresh[words.clone()])?;
                let (a, b) = (&last[words.clone()], &fresh[words.clone()]);
                if seqlock::copies_agree(a, b, R_SEQ) {
                    add_record(totals, k, b);
                } else {
                    still.push((k, odd_always && b[R_SEQ] & 1 == 1));
                    last[words.clone()].copy_from_slice(&fresh[words]);
                }
            }
            pending = still;
            attempt += 1;
        }
        if let Some(&(k, _)) = pending.first() {
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
                seq: last[k * RECORD_WORDS + R_SEQ],
            });
        }
        Ok(())
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
