//! The reclaim side of the reservation protocol: a dead (or retiring) slot's operation in
//! flight is resolved and its holdings are returned through the same commit/apply steps, exactly
//! once even when reclaimers overlap or are killed. See the parent module for the argument.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

use super::{
    Cells, Helped, Intent, Kind, SEQ_MASK, STATE_DONE, STATE_PENDING, Stop, TAG_MASK, apply,
    container_tag, help, last_tag, pack, word_bytes, word_tag,
};
use crate::sync::Atomic64;
use agent_common::MAX_DEVICES;

/// What [`return_holdings`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Returned {
    /// Bytes this call returned to the container words (commits it made), per device.
    pub(crate) bytes: [u64; MAX_DEVICES],
    /// Pending operations of the dead owner that were committed and applied here.
    pub(crate) applied: u32,
    /// Pending operations of the dead owner that the container word no longer named (never
    /// committed, or already applied by a helper), marked done here without applying.
    pub(crate) discarded: u32,
}

/// Returns everything `slot` holds to the container words, exactly once, for a reclaimer that
/// owns the slot's `RECLAIMING` state. `owner_dead`: the owner's own in-flight operation (if
/// any) may be resolved (else it is waited for: a live process retiring its slot).
/// `still_mine` re-checks the slot state after each read of the intent. Returns `None` if the
/// slot changed hands or the wait ran out (the slot stays for a later reclaim).
pub(crate) fn return_holdings<C: Cells>(
    cells: &C,
    slot: u32,
    owner_dead: bool,
    still_mine: impl Fn() -> bool,
    stop: Stop,
) -> Option<Returned> {
    let word = cells.intent(slot)?;
    let mut out = Returned::default();
    let mut round = 0;
    loop {
        // Acquire: pairs with the Release/AcqRel writes of the intent (an owner's PENDING, a
        // helper's DONE after applying, another reclaimer's return-all).
        let i = word.load(Acquire);
        if !still_mine() {
            return None;
        }
        let it = Intent::decode(i);
        match (it.state, it.kind()) {
            (STATE_DONE, _) => {
                let found = (0..cells.device_count()).find_map(|d| {
                    // Acquire: pairs with the AcqRel apply that wrote it.
                    let h = cells.held(slot, d)?.load(Acquire);
                    (word_bytes(h) != 0).then_some((d, h))
                });
                let next = match found {
                    Some((d, h)) => Intent::pending(
                        Kind::ReturnAll,
                        d,
                        (word_tag(h) + 1) & TAG_MASK,
                        (it.seq + 1) & SEQ_MASK,
                    ),
                    // Seal: an owner thread that took the intent before this CAS makes it fail
                    // (and we look again); one that takes it after sees our state change.
                    None => Intent::done(Intent::pending(Kind::Reserve, 0, 0, it.seq + 1)),
                };
                // AcqRel: Acquire pairs with the last writer of the intent; Release publishes
                // the slot state change (made before) to the next locker.
                if word.compare_exchange(i, next, AcqRel, Relaxed).is_ok() && found.is_none() {
                    return Some(out);
                }
            }
            (STATE_PENDING, Some(Kind::ReturnAll)) => {
                if drive_return(cells, slot, i, &mut out, stop) {
                    return None;
                }
            }
            _ if owner_dead => resolve_owner(cells, slot, i, &mut out),
            _ => {
                if !cells.pause(round) {
                    return None;
                }
                round += 1;
            }
        }
    }
}

/// Resolves a dead owner's intent `i` (busy, pending reserve/release, or garbage): a pending
/// operation that the container word names is committed and is applied; anything else is
/// discarded. The owner is dead, so nothing can commit it later.
fn resolve_owner<C: Cells>(cells: &C, slot: u32, i: u64, out: &mut Returned) {
    let Some(word) = cells.intent(slot) else {
        return;
    };
    let it = Intent::decode(i);
    let mut applied = false;
    if let (
        STATE_PENDING,
        Some(kind @ (Kind::Reserve | Kind::Release)),
        Some(container),
        Some(held),
    ) = (
        it.state,
        it.kind(),
        cells.container(it.device),
        cells.held(slot, it.device),
    ) {
        // Acquire (all three): the death of the owner happens before this; the re-read of the
        // intent after the container word rejects a decision about an intent that another
        // reclaimer finished and replaced meanwhile.
        let c = container.load(Acquire);
        let amount = cells.intent_bytes(slot).map_or(0, |b| b.load(Acquire));
        if word.load(Acquire) != i {
            return;
        }
        if container_tag(c) == last_tag(slot, it.ticket, cells.slot_bits()) {
            apply(held, kind, it.ticket, amount);
            applied = true;
        }
    }
    // AcqRel: as in `help`.
    if word
        .compare_exchange(i, Intent::done(i), AcqRel, Relaxed)
        .is_ok()
    {
        if applied {
            out.applied += 1;
        } else if it.state == STATE_PENDING {
            out.discarded += 1;
        }
    }
}

/// Drives the return-all intent `i` to completion: commit it unless some reclaimer already did,
/// apply it, mark it done. Returns true if a modelled crash stopped it.
fn drive_return<C: Cells>(cells: &C, slot: u32, i: u64, out: &mut Returned, stop: Stop) -> bool {
    let it = Intent::decode(i);
    let (Some(word), Some(container), Some(held)) = (
        cells.intent(slot),
        cells.container(it.device),
        cells.held(slot, it.device),
    ) else {
        if let Some(word) = cells.intent(slot) {
            // AcqRel: as in `help`. A return-all naming no device of the region is garbage.
            let _ = word.compare_exchange(i, Intent::done(i), AcqRel, Relaxed);
        }
        return false;
    };
    let tag = last_tag(slot, it.ticket, cells.slot_bits());
    let before = it.ticket.wrapping_sub(1) & TAG_MASK;
    loop {
        // Acquire: pairs with the AcqRel commits; a value that no longer names us was made by
        // someone who applied us first (invariant I), which the held load below then sees.
        let c = container.load(Acquire);
        if container_tag(c) == tag {
            break;
        }
        if help(cells, it.device, c) == Helped::Retry {
            continue;
        }
        // Acquire: pairs with the AcqRel apply.
        let h = held.load(Acquire);
        // Acquire: pairs with the AcqRel DONE of another reclaimer.
        if word_tag(h) != before || word.load(Acquire) != i {
            break;
        }
        let amount = word_bytes(h);
        let new = pack(word_bytes(c).saturating_sub(amount), tag);
        // AcqRel: as the owner's commit. Fails if anyone (another reclaimer of this intent
        // included) committed meanwhile.
        if container.compare_exchange(c, new, AcqRel, Relaxed).is_ok() {
            out.bytes[it.device as usize % MAX_DEVICES] += amount;
            if stop == Stop::AfterCommit {
                return true;
            }
            break;
        }
    }
    apply(held, Kind::ReturnAll, it.ticket, 0);
    // AcqRel: as in `help`.
    let _ = word.compare_exchange(i, Intent::done(i), AcqRel, Relaxed);
    false
}
