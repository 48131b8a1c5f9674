//! Exact, lock-free memory reservations that stay exact when any process is SIGKILLed at any
//! instruction, using 64-bit compare-and-swap only.
//!
//! # Words
//! - Container word (`DeviceState::reserved`, one per device): `bytes` (bits 0..48), a 15-bit
//!   tag naming the **last operation** committed on it (bits 48..63): the slot index in the low
//!   [`slot_bits`]`(slot_count)` bits of the tag (10 at 1024 slots, 7 at the default 128), the
//!   low bits of that operation's ticket above them; and bit 63, `APPLIED`, which the owner
//!   sets (CAS from the exact committed word) once it has applied the operation.
//! - Held word (`SlotHeader::held[d]`): `bytes` (bits 0..48) and a 16-bit tag = the ticket of the
//!   last operation applied to it. Tickets of `(slot, device)` are consecutive: the next
//!   operation's ticket is the held tag + 1, so a ticket is consumed only by a commit, and
//!   applying ticket `t` is the CAS `{x, t-1} -> {x ± b, t}`, which can succeed at most once.
//! - Intent (`SlotHeader::intent`, `intent_bytes`): the slot's one operation in flight:
//!   `state` (done / busy / pending), `kind` (reserve / release / return-all), `device`,
//!   `ticket`, and a 40-bit `seq` bumped by every new intent (so a reader that sees the same
//!   word twice saw the same intent). `intent_bytes` holds a reserve's or release's byte count;
//!   a return-all returns whatever the held word holds at ticket - 1. The intent is also the
//!   per-slot lock serialising the threads of one process (`DONE -> BUSY` by CAS). Only the
//!   owner, or a reclaimer of a dead owner (or of a `DONE` intent), writes it: helpers never do.
//!
//! # Protocol
//! Operation `(s, d, t, ±b)` by slot `s`: (1) lock and write the intent `PENDING`; (2) *help*:
//! make sure the operation the container word names is applied to its slot's held word
//! ([`help`]); (3) commit: CAS the container word `{B, last} -> {B ± b, (s, t)}` (a reserve is
//! refused instead if `B + b` would pass the limit); (4) apply: CAS `held {x, t-1} -> {x ± b, t}`;
//! (4a) CAS the container word `{B ± b, (s, t)} -> {B ± b, (s, t), APPLIED}` (fails harmlessly if
//! another commit replaced it); (5) mark the intent `DONE` (a plain store). A committer that
//! reads a word with `APPLIED` skips (2): the bit is set only after the apply (Release/Acquire),
//! so invariant I below holds without reading the named slot's intent. That keeps the other
//! slot's intent line, and our own (which such reads would take from us), out of the common
//! path when processes of one container allocate at the same time.
//!
//! # Why it is exact
//! Invariant I: whenever the container word moves away from naming `(s, t)`, operation `(s, t)`
//! is already applied, because every CAS on the container word is made from a value its maker
//! has helped. Hence, for a pending intent `(s, d, t)`: if the container word of `d` names
//! `(s, t)`, the operation is committed (the latest commit of `s` on `d` is `t - 1` while `t` is
//! pending, and `t - 1 ≢ t`); if it does not, the operation was either never committed or is
//! already applied. A reclaimer of a dead slot therefore applies a pending intent iff the
//! container word names it and discards it otherwise: each commit is applied exactly once and
//! nothing uncommitted is ever applied, so once every slot is quiescent or reclaimed,
//! `reserved == sum(held)` exactly. Returns of a dead slot's holdings go through the same
//! protocol (kind return-all, made by the reclaimer for the slot with the slot's next ticket);
//! their intents are never discarded but driven to completion by whichever reclaimer finds them,
//! so a reclaimer killed at any point is finished by the next one, and the return happens once.
//!
//! A helper validates before it applies: it reads the container word `C`, the intent, the
//! intent's bytes, the intent again and `C` again; the operation is proven committed only if both
//! pairs match (the seq rules out a changed intent; a container word still naming `(s, t)` after
//! the intent was seen pending means `t` committed). A maker whose second read of `C` differs
//! starts over, so it never CASes from a value it has not helped.
//!
//! Limits of the argument (stalls, never kills): tags are finite. A thread *stalled* (not
//! killed) between validating and its CAS while one slot commits 2^(15 - slot_bits) further
//! operations on the same device and the counter returns to the same byte value could make a
//! stale CAS succeed (and 65,536 operations for a held word). Every ordering below pairs a
//! Release (or AcqRel) write with the Acquire read that observes it; the argument's "before"
//! is happens-before along those pairs, and a process's death observed through `/proc` is taken
//! to happen after everything it executed (the kernel's exit path and the `/proc` read
//! synchronise; the loom models use a join). docs/region.md has the full argument.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use crate::sync::Atomic64;

#[cfg(test)]
pub(crate) mod model;
pub(crate) mod reclaim;

/// Bits of the byte count in a container or held word.
const BYTES_BITS: u32 = 48;
/// The largest byte count a container or held word holds. Limits above it are refused when a
/// region is configured; "unlimited" means up to this many bytes.
pub const MAX_RESERVABLE: u64 = (1 << BYTES_BITS) - 1;
const TAG_MASK: u64 = 0xffff;
/// Set in a container word once the operation its tag names is applied (by its owner, right
/// after applying): a committer that sees it need not read that slot's intent to help. It saves
/// two contended cache lines per operation when processes of a container allocate at once (the
/// other slot's intent, and our own intent line which those reads took away from us).
const APPLIED: u64 = 1 << 63;
/// The tag bits of a container word (the top bit is [`APPLIED`]).
const CONTAINER_TAG_MASK: u64 = 0x7fff;

/// Bytes of a container or held word.
#[inline(always)]
pub(crate) fn word_bytes(word: u64) -> u64 {
    word & MAX_RESERVABLE
}

#[inline(always)]
fn word_tag(word: u64) -> u64 {
    word >> BYTES_BITS
}

/// The tag of a container word: slot and ticket, without [`APPLIED`].
#[inline(always)]
fn container_tag(word: u64) -> u64 {
    word_tag(word) & CONTAINER_TAG_MASK
}

#[inline(always)]
fn pack(bytes: u64, tag: u64) -> u64 {
    (bytes & MAX_RESERVABLE) | (tag & TAG_MASK) << BYTES_BITS
}

/// Bits of the slot index in a container tag of a region with `slot_count` slots.
#[inline(always)]
pub(crate) fn slot_bits(slot_count: u32) -> u32 {
    (32 - slot_count.saturating_sub(1).leading_zeros()).min(16)
}

/// The container tag naming ticket `ticket` of `slot`.
#[inline(always)]
fn last_tag(slot: u32, ticket: u64, slot_bits: u32) -> u64 {
    (u64::from(slot) | ticket << slot_bits) & CONTAINER_TAG_MASK
}

const STATE_DONE: u64 = 0;
const STATE_BUSY: u64 = 1;
const STATE_PENDING: u64 = 2;
const SEQ_MASK: u64 = (1 << 40) - 1;

/// What an intent does to the held word and the container word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `+b` (refused past the limit).
    Reserve = 0,
    /// `-b` (clamped to what the slot holds).
    Release = 1,
    /// A reclaimer returns everything the slot holds on the device.
    ReturnAll = 2,
}

/// A decoded intent word: `state | kind << 2 | device << 4 | ticket << 8 | seq << 24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Intent {
    state: u64,
    kind: u64,
    device: u32,
    ticket: u64,
    seq: u64,
}

impl Intent {
    #[inline(always)]
    fn decode(word: u64) -> Intent {
        Intent {
            state: word & 3,
            kind: (word >> 2) & 3,
            device: ((word >> 4) & 0xf) as u32,
            ticket: (word >> 8) & TAG_MASK,
            seq: word >> 24,
        }
    }
    #[inline(always)]
    fn encode(self) -> u64 {
        self.state
            | self.kind << 2
            | u64::from(self.device & 0xf) << 4
            | (self.ticket & TAG_MASK) << 8
            | (self.seq & SEQ_MASK) << 24
    }
    /// The intent of a slot whose lock a thread holds, before it states its operation.
    fn busy(seq: u64) -> u64 {
        Intent {
            state: STATE_BUSY,
            kind: 0,
            device: 0,
            ticket: 0,
            seq,
        }
        .encode()
    }
    fn pending(kind: Kind, device: u32, ticket: u64, seq: u64) -> u64 {
        Intent {
            state: STATE_PENDING,
            kind: kind as u64,
            device,
            ticket,
            seq,
        }
        .encode()
    }
    /// The same intent, finished (its seq kept, so a stale CAS from the pending word fails).
    fn done(word: u64) -> u64 {
        Intent {
            state: STATE_DONE,
            kind: 0,
            device: 0,
            ticket: 0,
            seq: Intent::decode(word).seq,
        }
        .encode()
    }
    fn kind(self) -> Option<Kind> {
        match self.kind {
            0 => Some(Kind::Reserve),
            1 => Some(Kind::Release),
            2 => Some(Kind::ReturnAll),
            _ => None,
        }
    }
}

/// The shared cells the protocol works on: a region, or a loom model of one.
pub(crate) trait Cells {
    type A: Atomic64;
    /// The container word of `device` (`None` past the device count).
    fn container(&self, device: u32) -> Option<&Self::A>;
    /// The intent word of `slot` (`None` past the slot count).
    fn intent(&self, slot: u32) -> Option<&Self::A>;
    /// The intent's byte count of `slot`.
    fn intent_bytes(&self, slot: u32) -> Option<&Self::A>;
    /// The held word of `slot` on `device`.
    fn held(&self, slot: u32, device: u32) -> Option<&Self::A>;
    /// Bits of the slot index in a container tag.
    fn slot_bits(&self) -> u32;
    /// Devices in use.
    fn device_count(&self) -> u32;
    /// Waits before round `round` of a wait for another thread; false once the wait is over
    /// its bound.
    fn pause(&self, round: u32) -> bool;
}

/// Why a reservation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The device's limit in bytes.
    pub limit: u64,
    /// Bytes reserved container-wide when the reservation was refused.
    pub reserved: u64,
    /// Bytes requested.
    pub requested: u64,
}

/// Why an owner's operation did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpError {
    /// Past the limit.
    Denied(Denied),
    /// The slot is no longer owned by the caller, or the indices are out of range.
    Lost,
    /// Another thread of the process held the slot's intent past the wait bound.
    Busy,
    /// A modelled crash stopped the operation ([`Stop`]).
    Stopped,
}

/// Where a modelled crash stops an operation: the loom models and unit tests use it to leave
/// the shared state exactly as a SIGKILL at that point would. Production passes `Never`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Never,
    /// After the intent is published, before the commit.
    AfterIntent,
    /// After the container CAS, before the held word is updated.
    AfterCommit,
}

/// A completed operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Applied {
    /// Bytes reserved container-wide after the commit.
    pub(crate) total: u64,
    /// Bytes moved (a release is clamped to what the slot holds).
    pub(crate) moved: u64,
}

/// Takes the slot's intent (`DONE -> BUSY`): the lock that serialises the threads of one
/// process. Returns the new intent's seq.
#[unsafe(link_section = ".text.hot.vgpu")]
#[inline(always)]
fn lock<C: Cells>(cells: &C, word: &C::A) -> Result<u64, OpError> {
    match try_lock(word) {
        Ok(seq) => Ok(seq),
        Err(_) => lock_contended(cells, word),
    }
}

/// One attempt at `DONE -> BUSY`: the new intent's seq, or `Err(true)` when the intent was DONE
/// but another thread took it first (try again at once), `Err(false)` when it is held.
#[inline(always)]
fn try_lock<A: Atomic64>(word: &A) -> Result<u64, bool> {
    // Relaxed: a guess for the CAS, which re-validates it.
    let w = word.load(Relaxed);
    if Intent::decode(w).state != STATE_DONE {
        return Err(false);
    }
    let seq = (Intent::decode(w).seq + 1) & SEQ_MASK;
    let busy = Intent::busy(seq);
    // AcqRel: Acquire pairs with the Release/AcqRel write of DONE (the previous operation's held
    // update, or a reclaimer's seal after its state change, become visible); Release orders
    // nothing before it but keeps the word's RMW chain whole.
    match word.compare_exchange(w, busy, AcqRel, Relaxed) {
        Ok(_) => Ok(seq),
        Err(_) => Err(true),
    }
}

/// [`lock`] when another thread of the process holds the intent (or took it first): spins, then
/// waits. Out of line, so the uncontended path has no call into the waiting code (whose address
/// would otherwise be loaded from the GOT on every reservation).
#[cold]
#[inline(never)]
fn lock_contended<C: Cells>(cells: &C, word: &C::A) -> Result<u64, OpError> {
    let mut round = 0;
    loop {
        match try_lock(word) {
            Ok(seq) => return Ok(seq),
            Err(true) => continue,
            Err(false) => {}
        }
        if !cells.pause(round) {
            return Err(OpError::Busy);
        }
        round += 1;
    }
}

/// The cells an owner's operations on one device touch, looked up once: a writer keeps them for
/// the device it allocates on, so an operation does no bounds checks or address arithmetic.
#[derive(Debug)]
pub(crate) struct OwnerCells<'a, A> {
    pub(crate) slot: u32,
    pub(crate) device: u32,
    /// Bits of the slot index in a container tag.
    pub(crate) slot_bits: u32,
    pub(crate) intent: &'a A,
    pub(crate) intent_bytes: &'a A,
    pub(crate) held: &'a A,
    pub(crate) container: &'a A,
}

impl<'a, A: Atomic64> OwnerCells<'a, A> {
    /// The cells of `slot` on `device` (`None` past the slot or device count).
    #[inline]
    pub(crate) fn resolve<C: Cells<A = A>>(cells: &'a C, slot: u32, device: u32) -> Option<Self> {
        Some(OwnerCells {
            slot,
            device,
            slot_bits: cells.slot_bits(),
            intent: cells.intent(slot)?,
            intent_bytes: cells.intent_bytes(slot)?,
            held: cells.held(slot, device)?,
            container: cells.container(device)?,
        })
    }
}

/// Reserves (`Kind::Reserve`, refused past `limit`, 0 = unlimited) or releases (clamped to what
/// the slot holds) `bytes` on `device` for the owner of `slot`. `still_owned` is checked after
/// the slot's intent is taken (a reclaimer seals the intent after changing the slot state).
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn owner_op<C: Cells>(
    cells: &C,
    slot: u32,
    device: u32,
    kind: Kind,
    bytes: u64,
    limit: u64,
    still_owned: impl Fn() -> bool,
    stop: Stop,
) -> Result<Applied, OpError> {
    let Some(own) = OwnerCells::resolve(cells, slot, device) else {
        return Err(OpError::Lost);
    };
    owner_op_on(cells, &own, kind, bytes, limit, still_owned, stop)
}

/// [`owner_op`] on cells looked up before.
#[inline]
#[unsafe(link_section = ".text.hot.vgpu")]
pub(crate) fn owner_op_on<C: Cells>(
    cells: &C,
    own: &OwnerCells<'_, C::A>,
    kind: Kind,
    bytes: u64,
    limit: u64,
    still_owned: impl Fn() -> bool,
    stop: Stop,
) -> Result<Applied, OpError> {
    let (slot, device) = (own.slot, own.device);
    let (word, amount_cell, held, container) =
        (own.intent, own.intent_bytes, own.held, own.container);
    let seq = lock(cells, word)?;
    let busy = Intent::busy(seq);
    // A plain store: while the owner holds the intent (busy or pending) nobody else writes it
    // (helpers only apply; a reclaimer writes it only when the owner is dead, or when it is
    // DONE). Release: publishes this operation's apply to the next locker's Acquire CAS.
    let unlock = |w: u64| word.store(Intent::done(w), Release);
    if !still_owned() {
        unlock(busy);
        return Err(OpError::Lost);
    }
    // Acquire: pairs with the AcqRel CAS that applied the previous operation (ours, a helper's).
    let h = held.load(Acquire);
    let ticket = (word_tag(h) + 1) & TAG_MASK;
    let amount = match kind {
        Kind::Release => bytes.min(word_bytes(h)),
        _ => bytes,
    };
    if amount == 0 {
        unlock(busy);
        // Acquire: pairs with the AcqRel commits (a momentary value).
        let total = word_bytes(container.load(Acquire));
        return Ok(Applied { total, moved: 0 });
    }
    let cap = if limit == 0 || limit > MAX_RESERVABLE {
        MAX_RESERVABLE
    } else {
        limit
    };
    // Release: a helper's Acquire load of the bytes that sees this value also sees BUSY(seq)
    // (stored before), so its re-read of the intent word cannot return an older PENDING.
    amount_cell.store(amount, Release);
    let pending = Intent::pending(kind, device, ticket, seq);
    // Release: publishes the bytes and everything this process did before (its earlier commits
    // and applies) to helpers and reclaimers that Acquire-load the intent.
    word.store(pending, Release);
    if stop == Stop::AfterIntent {
        return Err(OpError::Stopped);
    }
    let tag = last_tag(slot, ticket, own.slot_bits);
    let total = loop {
        // Acquire: pairs with the AcqRel commit that wrote it, so the help below sees the
        // committer's intent.
        let c = container.load(Acquire);
        if help(cells, device, c) == Helped::Retry {
            continue;
        }
        let reserved = word_bytes(c);
        let new = match kind {
            Kind::Reserve => match reserved.checked_add(amount) {
                Some(new) if new <= cap => new,
                _ => {
                    // Never committed, so no helper acts on it: cancel.
                    unlock(pending);
                    return Err(OpError::Denied(Denied {
                        limit,
                        reserved,
                        requested: bytes,
                    }));
                }
            },
            _ => reserved.saturating_sub(amount),
        };
        // AcqRel: Release publishes the intent (stored before) to whoever Acquire-loads this
        // value and helps; Acquire pairs with the previous committer. The check against the
        // limit and the publish are one atomic step: the limit is exact.
        if container
            .compare_exchange(c, pack(new, tag), AcqRel, Relaxed)
            .is_ok()
        {
            break new;
        }
    };
    if stop == Stop::AfterCommit {
        return Err(OpError::Stopped);
    }
    apply(held, kind, ticket, amount);
    // Release: pairs with the Acquire load of a committer that sees APPLIED and skips helping:
    // the apply above happens before. A failed CAS means another committer replaced the word
    // (after helping, which found the apply done).
    let committed = pack(total, tag);
    let _ = container.compare_exchange(committed, committed | APPLIED, Release, Relaxed);
    unlock(pending);
    Ok(Applied {
        total,
        moved: amount,
    })
}

/// Applies ticket `ticket` to a held word: `{x, t-1} -> {x ± amount, t}` (return-all: `{0, t}`).
/// Does nothing if the word's tag is not `t - 1` (already applied).
#[inline]
#[unsafe(link_section = ".text.hot.vgpu")]
fn apply<A: Atomic64>(held: &A, kind: Kind, ticket: u64, amount: u64) {
    // Acquire: pairs with the AcqRel CAS of the previous apply.
    let h = held.load(Acquire);
    if word_tag(h) != ticket.wrapping_sub(1) & TAG_MASK {
        return;
    }
    let bytes = match kind {
        Kind::Reserve => word_bytes(h).saturating_add(amount).min(MAX_RESERVABLE),
        Kind::Release => word_bytes(h).saturating_sub(amount),
        Kind::ReturnAll => 0,
    };
    // AcqRel: Release publishes the new holdings to the next operation of the slot and to
    // reclaimers (Acquire loads); a failure means another thread applied it.
    let _ = held.compare_exchange(h, pack(bytes, ticket), AcqRel, Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Helped {
    /// The operation the container word names is applied (or was never committed): the word
    /// may be replaced.
    Clear,
    /// The container word changed while we looked: read it again.
    Retry,
}

/// Makes sure the operation that container word `c` of `device` names is applied, so that a
/// CAS from `c` keeps invariant I.
#[inline(always)]
fn help<C: Cells>(cells: &C, device: u32, c: u64) -> Helped {
    if c & APPLIED != 0 {
        // Its owner applied it and said so (Release CAS of APPLIED, acquired with `c`).
        return Helped::Clear;
    }
    help_named(cells, device, c)
}

/// [`help`] when the word does not say its operation is applied: reads the named slot's intent.
/// Out of line (only when another process is between its commit and its `APPLIED`): the owner's
/// path keeps one copy of it instead of one per inlined operation.
#[inline(never)]
#[unsafe(link_section = ".text.hot.vgpu")]
fn help_named<C: Cells>(cells: &C, device: u32, c: u64) -> Helped {
    let bits = cells.slot_bits();
    let tag = container_tag(c);
    let slot = (tag & ((1 << bits) - 1)) as u32;
    let Some(word) = cells.intent(slot) else {
        return Helped::Clear;
    };
    // Acquire: pairs with the Release store of PENDING (and with the DONE written after an
    // apply): the named operation's earlier commits and applies happen before what follows.
    let i1 = word.load(Acquire);
    let it = Intent::decode(i1);
    if it.state != STATE_PENDING || it.device != device || last_tag(slot, it.ticket, bits) != tag {
        // Not pending under this name: the named operation finished before its slot wrote a
        // newer intent (or is this slot's cancelled one, never committed).
        return Helped::Clear;
    }
    let (Some(kind), Some(held), Some(container)) =
        (it.kind(), cells.held(slot, device), cells.container(device))
    else {
        return Helped::Clear;
    };
    let amount = match kind {
        // Acquire: pairs with the Release store of the bytes (see `owner_op`).
        Kind::Reserve | Kind::Release => cells.intent_bytes(slot).map_or(0, |b| b.load(Acquire)),
        Kind::ReturnAll => 0,
    };
    // Acquire (both): keep the re-reads after the reads they validate.
    let i2 = word.load(Acquire);
    let c2 = container.load(Acquire);
    if c2 != c {
        return Helped::Retry;
    }
    if i2 != i1 {
        return Helped::Clear;
    }
    // Applied: the intent stays PENDING until its owner (or, if the owner is dead, a
    // reclaimer) marks it done; a later helper's apply is a no-op.
    apply(held, kind, it.ticket, amount);
    Helped::Clear
}

#[cfg(test)]
mod tests {
    //! Unit and property tests of the reservation protocol (sequential; the concurrent cases are the
    //! loom models in `loom_tests` (lib.rs) and the multi-process stress test).

    use std::sync::atomic::{AtomicU64, Ordering};

    use proptest::prelude::*;

    use super::model::Model;
    use super::reclaim::{Returned, return_holdings};
    use super::*;
    use crate::words::{PHASE_LIVE, slot_generation, slot_word};
    use crate::{Region, RegionConfig};

    fn model(slots: u32, devices: u32) -> Model<AtomicU64> {
        Model::new(slots, devices, || AtomicU64::new(0), |round| round < 4)
    }

    #[test]
    fn words_round_trip() {
        assert_eq!(
            [1, 2, 3, 128, 129, 1024].map(slot_bits),
            [0, 1, 2, 7, 8, 10]
        );
        let it = Intent {
            state: STATE_PENDING,
            kind: Kind::ReturnAll as u64,
            device: 15,
            ticket: TAG_MASK,
            seq: SEQ_MASK,
        };
        assert_eq!(Intent::decode(it.encode()), it);
        assert_eq!(Intent::decode(Intent::done(it.encode())).seq, SEQ_MASK);
        assert_eq!(
            Intent::decode(0).state,
            STATE_DONE,
            "a zeroed slot has no intent"
        );
        // At 1024 slots a container tag has 10 slot bits and 5 ticket bits (the top bit is APPLIED).
        let w = pack(MAX_RESERVABLE, last_tag(1023, 31, 10));
        assert_eq!(word_bytes(w), MAX_RESERVABLE);
        assert_eq!(container_tag(w), CONTAINER_TAG_MASK);
        assert_eq!(w & APPLIED, 0, "a commit is not applied yet");
        assert_eq!(container_tag(w | APPLIED), container_tag(w));
        assert_eq!(word_bytes(w | APPLIED), MAX_RESERVABLE);
        assert_eq!(
            last_tag(1023, 32, 10),
            last_tag(1023, 0, 10),
            "tickets wrap"
        );
    }

    #[test]
    fn the_limit_is_exact_and_releases_clamp() {
        let m = model(2, 1);
        assert_eq!(m.op(0, Kind::Reserve, 60, 100, Stop::Never), Ok(60));
        assert_eq!(m.op(1, Kind::Reserve, 40, 100, Stop::Never), Ok(40));
        assert_eq!(
            m.op(0, Kind::Reserve, 1, 100, Stop::Never),
            Err(OpError::Denied(Denied {
                limit: 100,
                reserved: 100,
                requested: 1
            }))
        );
        assert_eq!(
            m.op(1, Kind::Release, 1000, 0, Stop::Never),
            Ok(40),
            "clamped"
        );
        assert_eq!(m.op(1, Kind::Release, 5, 0, Stop::Never), Ok(0));
        assert_eq!((m.reserved(0), m.sum_held(0)), (60, 60));
        // Unlimited still stops at what a word holds.
        assert_eq!(
            m.op(1, Kind::Reserve, MAX_RESERVABLE - 60, 0, Stop::Never),
            Ok(MAX_RESERVABLE - 60)
        );
        assert!(matches!(
            m.op(0, Kind::Reserve, 1, 0, Stop::Never),
            Err(OpError::Denied(_))
        ));
    }

    #[test]
    fn tickets_wrap_without_losing_exactness() {
        let m = model(1, 1);
        for i in 0..70_000u64 {
            m.op(0, Kind::Reserve, 1 + i % 7, 0, Stop::Never).unwrap();
            if i % 2 == 1 {
                m.op(0, Kind::Release, 3, 0, Stop::Never).unwrap();
            }
        }
        assert_eq!(m.reserved(0), m.sum_held(0));
    }

    /// Killed after its commit: a reclaim applies the operation when the container word still names
    /// it, and finds it applied when another process's commit helped it first.
    #[test]
    fn a_commit_without_its_apply_is_applied_once() {
        for helped in [false, true] {
            let m = model(2, 1);
            m.op(0, Kind::Reserve, 10, 100, Stop::Never).unwrap();
            assert_eq!(
                m.op(0, Kind::Reserve, 20, 100, Stop::AfterCommit),
                Err(OpError::Stopped)
            );
            assert_eq!((m.reserved(0), m.held_bytes(0, 0)), (30, 10));
            if helped {
                m.op(1, Kind::Reserve, 5, 100, Stop::Never).unwrap();
                assert_eq!(m.held_bytes(0, 0), 30, "the next commit helped first");
            }
            let r = m.reclaim(0, Stop::Never).unwrap();
            assert_eq!(r.applied, u32::from(!helped));
            assert_eq!(r.bytes[0], 30);
            assert_eq!(
                (m.reserved(0), m.sum_held(0)),
                (m.held_bytes(1, 0), m.held_bytes(1, 0))
            );
            assert_eq!(
                m.reclaim(0, Stop::Never).unwrap(),
                Returned::default(),
                "once"
            );
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Op {
            slot: u32,
            release: bool,
            bytes: u64,
            stop: u8,
        },
        Reclaim {
            slot: u32,
            stop: bool,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..3, any::<bool>(), 1u64..80, 0u8..8).prop_map(|(slot, release, bytes, stop)| {
                Step::Op {
                    slot,
                    release,
                    bytes,
                    stop,
                }
            }),
            (0u32..3, any::<bool>()).prop_map(|(slot, stop)| Step::Reclaim { slot, stop }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random operations of three slots, some "killed" before or after their commit, dead slots
        /// reclaimed (reclaimers themselves sometimes killed after a commit, then reclaimed again):
        /// never above the limit, and once every dead slot is reclaimed, reserved == sum(held).
        #[test]
        fn kills_anywhere_leave_the_counters_exact(steps in proptest::collection::vec(step(), 1..60)) {
            const LIMIT: u64 = 150;
            let m = model(3, 2);
            let mut dead = [false; 3];
            for s in steps {
                match s {
                    Step::Op { slot, release, bytes, stop } if !dead[slot as usize] => {
                        let stop = match stop { 0 => Stop::AfterIntent, 1 => Stop::AfterCommit, _ => Stop::Never };
                        let kind = if release { Kind::Release } else { Kind::Reserve };
                        let device = (bytes % 2) as u32;
                        let r = owner_op(&m, slot, device, kind, bytes, LIMIT, || true, stop);
                        dead[slot as usize] = r == Err(OpError::Stopped);
                    }
                    Step::Reclaim { slot, stop } if dead[slot as usize] => {
                        let stop = if stop { Stop::AfterCommit } else { Stop::Never };
                        dead[slot as usize] = m.reclaim(slot, stop).is_none();
                    }
                    _ => {}
                }
                for d in 0..2 {
                    prop_assert!(m.reserved(d) <= LIMIT);
                }
            }
            for slot in 0..3 {
                if dead[slot as usize] {
                    prop_assert!(m.reclaim(slot, Stop::Never).is_some());
                    for d in 0..2 {
                        prop_assert_eq!(m.held_bytes(slot, d), 0);
                    }
                }
            }
            for d in 0..2 {
                prop_assert_eq!(m.reserved(d), m.sum_held(d));
            }
        }

        /// Garbage in every word of the protocol (a container can write anything into its own
        /// region): operations and reclaims return (typed errors or clamped values), never panic or
        /// hang, and byte counts stay within a word.
        #[test]
        fn garbage_words_never_panic_or_hang(words in proptest::collection::vec(any::<u64>(), 12)) {
            let m = model(2, 2);
            let cells = m.containers.iter().chain(&m.intents).chain(&m.intent_bytes)
                .chain(m.held.iter().flatten());
            for (w, v) in cells.zip(&words) {
                w.store(*v, Ordering::Relaxed);
            }
            for slot in 0..2 {
                let _ = owner_op(&m, slot, words[0] as u32 % 3, Kind::Reserve, 5, 0, || true, Stop::Never);
                let _ = owner_op(&m, slot, 1, Kind::Release, words[1], 0, || true, Stop::Never);
                let _ = m.reclaim(slot, Stop::Never);
                let _ = return_holdings(&m, slot, false, || true, Stop::Never);
            }
            for d in 0..2 {
                prop_assert!(m.reserved(d) <= MAX_RESERVABLE);
            }
        }
    }

    /// The same on a real region: the owner "dies" right after its container CAS (its slot is then
    /// marked as owned by a process that has exited), and `reclaim_dead_slots` applies the commit and
    /// returns everything.
    #[test]
    fn a_region_reclaims_an_owner_killed_after_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RegionConfig::unlimited(1);
        config.memory_limit[0] = 1000;
        config.slots = 4;
        let (region, _) = Region::open_or_create(&dir.path().join("r"), &config).unwrap();
        let survivor = region.claim_slot().unwrap();
        let victim = region.claim_slot().unwrap();
        region.try_reserve(&survivor, 0, 100).unwrap();
        region.try_reserve(&victim, 0, 300).unwrap();
        assert_eq!(
            region.owner_op_until(&victim, 0, Kind::Reserve, 200, 1000, Stop::AfterCommit),
            Err(OpError::Stopped)
        );
        assert_eq!((region.reserved(0), region.held(&victim, 0)), (600, 300));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let record = region.slot_record(victim.index()).unwrap();
        let word = slot_word(slot_generation(victim.state_word()), PHASE_LIVE, dead_pid);
        record.header.state.store(word, Ordering::Release);
        let report = region.reclaim_dead_slots();
        assert_eq!(report.slots_reclaimed, 1);
        assert_eq!(report.pending_applied, 1);
        assert_eq!(report.bytes_returned[0], 500);
        assert_eq!(region.reserved(0), 100);
        assert_eq!(region.held(&survivor, 0), 100);
    }
}
