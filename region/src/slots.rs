//! Process slots: claimed by compare-and-swap, never moved or compacted, reclaimed exactly once
//! when their owner died.
//!
//! The slot `state` word is `generation << 40 | phase << 32 | pid`:
//! - `FREE(gen)`: claimable.
//! - `CLAIMING(gen, pid)`: `pid` won the CAS from `FREE` and is resetting the slot.
//! - `LIVE(gen, pid)`: owned by `pid`; published with `Release` after the identity is stored.
//! - `RECLAIMING(gen, reclaimer)`: a reclaimer is returning a dead owner's holdings.
//!
//! A reclaimer moves `LIVE`/`CLAIMING` of a dead owner to `RECLAIMING(gen, me)` by CAS from the
//! exact observed word (one winner), resolves the owner's reservation in flight and returns its
//! holdings through the reservation protocol (`reserve::reclaim::return_holdings`: exactly once
//! per byte even if two reclaimers overlap after a takeover, or one is killed), then CASes to
//! `FREE(gen + 1)`. The generation makes a stale handle or a slow reclaimer's CAS fail instead of
//! hitting a new owner. A slot's held words keep their tickets across owners (never zeroed).
//!
//! Death = the pid is gone or a zombie, or its start time differs (pid reused). Liveness is only
//! judged for owners in the caller's pid namespace (the slot records the owner's namespace inode).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::RegionError;
use agent_common::MAX_DEVICES;

use crate::handle::Region;
use crate::layout::{SHARDS_PER_SLOT, Shard, SlotRecord};
use crate::procfs::{self, Liveness, ProcessIdentity};
use crate::reserve::{self, Stop};
use crate::seqlock;
use crate::words::{
    PHASE_CLAIMING, PHASE_FREE, PHASE_LIVE, PHASE_RECLAIMING, slot_generation, slot_phase,
    slot_pid, slot_word,
};

/// A reclaim that has not finished within this long may be taken over.
pub const RECLAIM_STALL_MS: u64 = 1000;

/// A claimed slot. Owned by the process that claimed it: after `fork()` the child must claim its
/// own slot and must not use (or retire) the parent's handle; [`Slot::owner_pid`] tells them
/// apart.
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    index: u32,
    word: u64,
}

impl Slot {
    /// Index of the slot in the region.
    pub fn index(&self) -> u32 {
        self.index
    }
    /// Pid of the process that claimed it.
    pub fn owner_pid(&self) -> u32 {
        slot_pid(self.word)
    }
    /// Generation of the slot at claim (distinguishes successive owners of one index).
    pub fn generation(&self) -> u32 {
        slot_generation(self.word) as u32
    }
    /// Whether the calling process is the one that claimed the slot (false in a forked child).
    pub fn owned_by_current_process(&self) -> bool {
        self.owner_pid() == std::process::id()
    }
    pub(crate) fn state_word(&self) -> u64 {
        self.word
    }
    /// A second handle of the same claim, for a [`crate::Reserver`] (not public: a process keeps
    /// one handle, which retiring consumes; a reserver's operations check the claim is current).
    pub(crate) fn duplicate(&self) -> Slot {
        Slot {
            index: self.index,
            word: self.word,
        }
    }
}

/// What a sweep of dead slots returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Slots moved back to `FREE`.
    pub slots_reclaimed: u32,
    /// Bytes returned to the container-wide counters, per device.
    pub bytes_returned: [u64; MAX_DEVICES],
    /// Reservations or releases a dead owner had committed but not applied to its slot (it
    /// was killed in between): applied by the reclaim.
    pub pending_applied: u32,
    /// Reservations or releases a dead owner had in flight that the container word no longer
    /// named: never committed, or committed and already applied by another process's commit
    /// (help). Marked done without applying.
    pub pending_discarded: u32,
}

impl Region {
    /// Claims a slot for the calling process (call it again in a forked child). Free slots are
    /// tried first, starting at a pid-dependent index to spread contention; when none is free,
    /// slots of dead owners are reclaimed and taken.
    pub fn claim_slot(&self) -> Result<Slot, RegionError> {
        let me = ProcessIdentity::current();
        let n = self.slot_count;
        let start = me.pid % n;
        for sweep in [false, true] {
            for k in 0..n {
                let index = (start + k) % n;
                let record = self.slot_record(index).expect("index < slot_count");
                // Acquire: pairs with the Release CAS/store that last freed the slot, so the
                // reset it did is visible before we reuse the slot.
                let mut word = record.header.state.load(Ordering::Acquire);
                if sweep && slot_phase(word) != PHASE_FREE {
                    if self
                        .reclaim(index, word, &me, &mut ReclaimReport::default())
                        .is_none()
                    {
                        continue;
                    }
                    word = record.header.state.load(Ordering::Acquire);
                }
                if slot_phase(word) != PHASE_FREE {
                    continue;
                }
                let generation = slot_generation(word);
                let claiming = slot_word(generation, PHASE_CLAIMING, me.pid);
                // AcqRel: Acquire as above; Release is not needed for data but keeps every
                // transition of the word a release-sequence member.
                if record
                    .header
                    .state
                    .compare_exchange(word, claiming, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(self.finish_claim(index, record, generation, &me));
                }
            }
        }
        Err(RegionError::SlotsFull {
            path: self.path.clone(),
            slots: n,
        })
    }

    fn finish_claim(
        &self,
        index: u32,
        record: &SlotRecord,
        generation: u64,
        me: &ProcessIdentity,
    ) -> Slot {
        let h = &record.header;
        let r = Ordering::Relaxed;
        // Relaxed stores: published by the Release store of LIVE below.
        h.start_time.store(me.start_time, r);
        h.pid_ns.store(me.pid_ns, r);
        h.claimed_at_unix_ns.store(procfs::unix_ns(), r);
        h.reclaim_started_ms.store(0, r);
        h.dropped_records.store(0, r);
        h.name[0].store(
            u64::from_le_bytes(me.name[..8].try_into().expect("8 bytes")),
            r,
        );
        h.name[1].store(
            u64::from_le_bytes(me.name[8..].try_into().expect("8 bytes")),
            r,
        );
        // `held` and the intent are left alone: the last reclaim returned the holdings through
        // the protocol, and the tickets in them must keep counting (see `reserve`).
        h.context_bytes.iter().for_each(|w| w.store(0, r));
        // A dead owner's wait for memory ended with it.
        h.oom_wait_bytes.store(0, r);
        // A dead owner's in-process freeze ended with it (its host memory went with it).
        h.own_freeze.store(0, r);
        h.own_freeze_bytes.store(0, r);
        // A dead owner's threads never dropped their writers.
        h.shard_owner.iter().for_each(|w| w.store(0, r));
        let used = h.used_shards.load(r);
        for (i, shard) in record.shards.iter().enumerate().take(SHARDS_PER_SLOT) {
            if used & (1 << i) != 0 {
                reset_shard(shard);
            }
        }
        h.used_shards.store(0, r);
        let live = slot_word(generation, PHASE_LIVE, me.pid);
        // Release: publishes the identity and the reset above; pairs with the Acquire loads of
        // readers and reclaimers.
        h.state.store(live, Ordering::Release);
        Slot { index, word: live }
    }

    /// Gives the slot back: returns what it still holds and frees it. For a process that exits
    /// cleanly (a killed one is reclaimed by others). Ignored if the handle no longer owns it.
    pub fn retire_slot(&self, slot: Slot) -> ReclaimReport {
        let mut report = ReclaimReport::default();
        if let Some(record) = self.slot_record(slot.index) {
            let reclaiming = slot_word(
                slot_generation(slot.word),
                PHASE_RECLAIMING,
                slot.owner_pid(),
            );
            // AcqRel: as in `reclaim`.
            if record
                .header
                .state
                .compare_exchange(slot.word, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // The owner is this live process: its other threads' reservations in flight
                // are waited for, never discarded.
                self.finish_reclaim(slot.index, reclaiming, false, &mut report);
            }
        }
        report
    }

    /// Reclaims every slot whose owner died, returning its holdings. Run by writers (the
    /// limiter) when a reservation is denied and when slots run out; readers never reclaim.
    pub fn reclaim_dead_slots(&self) -> ReclaimReport {
        let me = ProcessIdentity::current();
        let mut report = ReclaimReport::default();
        for index in 0..self.slot_count {
            let record = self.slot_record(index).expect("index < slot_count");
            // Acquire: pairs with the Release publication of LIVE (identity fields).
            let word = record.header.state.load(Ordering::Acquire);
            if slot_phase(word) != PHASE_FREE {
                self.reclaim(index, word, &me, &mut report);
            }
        }
        report
    }

    /// Reclaims one slot observed as `word` if its owner (or its stalled reclaimer) is dead.
    /// Returns `Some(())` when this call moved it to `FREE`.
    fn reclaim(
        &self,
        index: u32,
        word: u64,
        me: &ProcessIdentity,
        report: &mut ReclaimReport,
    ) -> Option<()> {
        let record = self.slot_record(index)?;
        let h = &record.header;
        let r = Ordering::Relaxed;
        let pid = slot_pid(word);
        // Relaxed: ordered after the Acquire load of `word` by the caller.
        let slot_ns = h.pid_ns.load(r);
        let same_ns = if slot_ns != 0 {
            slot_ns == me.pid_ns
        } else {
            // Identity not written yet (a claimer died right after its CAS): judge only if we run
            // in the namespace that created the region, like every limiter of the container.
            me.pid_ns != 0 && self.header().creator_pid_ns.load(r) == me.pid_ns
        };
        // `owner_dead`: no thread can still commit the owner's reservation in flight. A stalled
        // (alive) reclaimer may be the owner itself retiring its slot, so then it is not.
        let (dead, owner_dead) = match slot_phase(word) {
            PHASE_CLAIMING | PHASE_LIVE => {
                let dead = same_ns && procfs::liveness(pid, h.start_time.load(r)) == Liveness::Dead;
                (dead, dead)
            }
            PHASE_RECLAIMING => {
                let since = h.reclaim_started_ms.load(r);
                let now = procfs::boottime_ms();
                let gone = same_ns && procfs::liveness(pid, 0) == Liveness::Dead;
                let stalled = now.saturating_sub(since) > RECLAIM_STALL_MS || now < since;
                (gone || stalled, gone)
            }
            _ => (false, false),
        };
        if !dead || pid == me.pid && slot_phase(word) != PHASE_RECLAIMING {
            return None;
        }
        let reclaiming = slot_word(slot_generation(word), PHASE_RECLAIMING, me.pid);
        // AcqRel: Acquire pairs with the owner's Release publication (its `held` updates are
        // Release too); exactly one CAS from this exact word succeeds.
        h.state
            .compare_exchange(word, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        self.finish_reclaim(index, reclaiming, owner_dead, report)
    }

    fn finish_reclaim(
        &self,
        index: u32,
        reclaiming: u64,
        owner_dead: bool,
        report: &mut ReclaimReport,
    ) -> Option<()> {
        let h = &self.slot_record(index)?.header;
        let r = Ordering::Relaxed;
        h.reclaim_started_ms.store(procfs::boottime_ms(), r);
        // Acquire: pairs with the AcqRel CAS of a reclaimer that took over (then we stop).
        let still_mine = || h.state.load(Ordering::Acquire) == reclaiming;
        let returned =
            reserve::reclaim::return_holdings(self, index, owner_dead, still_mine, Stop::Never)?;
        for (device, &bytes) in returned.bytes.iter().enumerate() {
            if bytes > 0
                && let Some(dev) = self.device(device as u32)
            {
                dev.reclaimed_bytes.fetch_add(bytes, r);
                report.bytes_returned[device] += bytes;
            }
        }
        report.pending_applied += returned.applied;
        report.pending_discarded += returned.discarded;
        // Forget the identity so a later claimer's CLAIMING state is never judged by it.
        h.start_time.store(0, r);
        h.pid_ns.store(0, r);
        let free = slot_word(slot_generation(reclaiming) + 1, PHASE_FREE, 0);
        // Release: publishes the reset above to the next claimer's Acquire. Fails if another
        // reclaimer took over meanwhile (it finishes the job).
        h.state
            .compare_exchange(reclaiming, free, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        report.slots_reclaimed += 1;
        Some(())
    }
}

/// Zeroes a shard's records, each inside its own write section so readers never see a
/// half-reset record. Only the claimer of the slot (in `CLAIMING`) calls this, so it is the only
/// writer; a sequence left odd by a dead writer is closed here. Records never written (sequence
/// 0) hold zeroes already.
fn reset_shard(shard: &Shard) {
    let r = Ordering::Relaxed;
    for record in &shard.apis {
        if record.seq.load(r) == 0 {
            continue;
        }
        let odd = seqlock::begin_exclusive(&record.seq);
        for w in [
            &record.calls,
            &record.errors,
            &record.latency_ns,
            &record.hook_ns,
            &record.bytes_allocated,
            &record.bytes_freed,
            &record.throttled_ns,
            &record.denied,
            &record.denied_bytes,
            &record.bytes_moved,
        ]
        .into_iter()
        .chain(&record.hist)
        .chain(&record.spare)
        {
            w.store(0, r);
        }
        seqlock::end(&record.seq, odd);
    }
    for record in &shard.gpu_time {
        reset_words(&record.seq, || {
            [&record.event_errors, &record.skipped, &record.zero]
                .into_iter()
                .chain(&record.spare_head)
                .chain(
                    record
                        .devices
                        .iter()
                        .flat_map(|d| [&d.estimated_ns, &d.sampled_ns, &d.samples, &d.launches]),
                )
                .chain(&record.spare)
                .for_each(|w| w.store(0, r));
        });
    }
    for entry in &shard.kernels {
        reset_words(&entry.seq, || {
            [
                &entry.name_hash,
                &entry.estimated_ns,
                &entry.sampled_ns,
                &entry.samples,
                &entry.launches,
                &entry.name_len,
                &entry.zero,
            ]
            .into_iter()
            .chain(&entry.name)
            .for_each(|w| w.store(0, r));
        });
    }
}

/// Runs `zero` (which stores zeroes) in a section of `seq`, unless the record was never written.
fn reset_words(seq: &AtomicU64, zero: impl FnOnce()) {
    // Relaxed: the claimer is the only writer (see `reset_shard`).
    if seq.load(Ordering::Relaxed) == 0 {
        return;
    }
    let odd = seqlock::begin_exclusive(seq);
    zero();
    seqlock::end(seq, odd);
}
