//! The per-shard seqlock: one writer per shard, readers that never block it and never spin
//! without bound.
//!
//! Writer (a thread shard has exactly one writer thread; the overflow shard admits one writer at a
//! time through [`try_begin_shared`]):
//! 1. `seq` goes from even `s` to odd `s + 1`, then `fence(Release)`;
//! 2. data fields are updated with `Relaxed` loads and stores;
//! 3. `seq.store(s + 2, Release)`.
//!
//! Reader: `s1 = seq.load(Acquire)`; if odd, retry; copy the data with `Relaxed` loads;
//! `fence(Acquire)`; `s2 = seq.load(Relaxed)`; the copy is consistent iff `s1 == s2`. After
//! [`READ_RETRIES`] failed attempts the reader gives up and reports the shard as stuck (odd: a
//! writer died or stalled mid-update) or busy (it kept changing), so a dead writer can never
//! wedge a reader.
//!
//! Why it is correct: if the reader's copy observed any store of a write section that began
//! after `s1`, the writer's `fence(Release)` (after its odd store) synchronises with the reader's
//! `fence(Acquire)` (after that copy), so the reader's `s2` load sees the odd value or later and
//! the copy is discarded. `s1`'s `Acquire` pairs with the `Release` end store of the last complete
//! section, so every store of that section is visible to the copy.

use std::sync::atomic::Ordering;

use crate::sync::Atomic64;

/// Attempts a reader makes before reporting a shard as stuck or busy.
pub const READ_RETRIES: u32 = 64;

/// Opens a write section on a shard that has exactly one writer (its owning thread).
/// Returns the odd sequence value to pass to [`end`].
#[inline(always)]
pub(crate) fn begin_exclusive<A: Atomic64>(seq: &A) -> u64 {
    // Relaxed: only this thread writes `seq` (ownership was taken with an Acquire CAS that pairs
    // with the previous owner's Release store of `owner_tid`).
    let even = seq.load(Ordering::Relaxed) & !1;
    let odd = even.wrapping_add(1);
    seq.store(odd, Ordering::Relaxed);
    // What we want is a store(odd) that no later data store can move above. Release fences order
    // *earlier* stores before *later* ones, which is exactly that; it pairs with the reader's
    // fence(Acquire) before its second `seq` load.
    A::fence(Ordering::Release);
    odd
}

/// Tries to open a write section on a shard that several threads may write (the overflow shard).
/// The odd sequence is the writer-busy bit: it is taken by CAS and never waited for.
/// Returns `None` when another writer holds it (the caller counts a dropped record).
#[inline(always)]
pub(crate) fn try_begin_shared<A: Atomic64>(seq: &A) -> Option<u64> {
    let current = seq.load(Ordering::Relaxed);
    if current & 1 == 1 {
        return None;
    }
    // Acquire on success pairs with the previous writer's Release `end` store, so the data it
    // wrote is visible to our read-modify-write of the same fields.
    seq.compare_exchange(
        current,
        current.wrapping_add(1),
        Ordering::Acquire,
        Ordering::Relaxed,
    )
    .ok()?;
    // Same reason as in `begin_exclusive`: later data stores must not move above the odd value.
    A::fence(Ordering::Release);
    Some(current.wrapping_add(1))
}

/// Closes a write section opened with [`begin_exclusive`] or [`try_begin_shared`].
#[inline(always)]
pub(crate) fn end<A: Atomic64>(seq: &A, odd: u64) {
    // Release: publishes the section's data stores; pairs with the reader's Acquire load of
    // `seq` (and with the next shared writer's Acquire CAS).
    seq.store(odd.wrapping_add(1), Ordering::Release);
}

/// Outcome of a bounded seqlock read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqRead {
    /// The copy is consistent; `retries` attempts failed before it.
    Consistent { retries: u32 },
    /// The sequence stayed odd: a writer is stalled or died inside a write section.
    Stuck { seq: u64 },
    /// The sequence kept changing under the reader (a busy, live writer).
    Busy { seq: u64 },
}

/// Copies a shard with `copy` until the copy is consistent, at most [`READ_RETRIES`] times.
/// `copy` must only make `Relaxed` loads (it may run several times; only the last run counts
/// when the result is `Consistent`).
pub(crate) fn read<A: Atomic64>(seq: &A, mut copy: impl FnMut()) -> SeqRead {
    let mut last = 0;
    let mut odd_every_time = true;
    for attempt in 0..READ_RETRIES {
        // Acquire: pairs with the writer's Release `end` store.
        let s1 = seq.load(Ordering::Acquire);
        last = s1;
        if s1 & 1 == 1 {
            backoff(attempt);
            continue;
        }
        odd_every_time = false;
        copy();
        // Acquire fence: pairs with the writer's Release fence after its odd store (see the
        // module docs); orders the copy's loads before the check below.
        A::fence(Ordering::Acquire);
        let s2 = seq.load(Ordering::Relaxed);
        if s1 == s2 {
            return SeqRead::Consistent { retries: attempt };
        }
        last = s2;
        backoff(attempt);
    }
    if odd_every_time {
        SeqRead::Stuck { seq: last }
    } else {
        SeqRead::Busy { seq: last }
    }
}

#[inline]
fn backoff(attempt: u32) {
    #[cfg(not(loom))]
    {
        if attempt < 16 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    #[cfg(loom)]
    {
        let _ = attempt;
        loom::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn exclusive_sections_keep_the_sequence_even_between_them() {
        let seq = AtomicU64::new(0);
        let odd = begin_exclusive(&seq);
        assert_eq!(odd, 1);
        assert_eq!(seq.load(Ordering::Relaxed), 1);
        end(&seq, odd);
        assert_eq!(seq.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn shared_begin_is_try_only() {
        let seq = AtomicU64::new(4);
        let odd = try_begin_shared(&seq).expect("free");
        assert_eq!(
            try_begin_shared(&seq),
            None,
            "a second writer must not enter"
        );
        end(&seq, odd);
        assert_eq!(try_begin_shared(&seq), Some(7));
    }

    #[test]
    fn a_dead_writer_is_reported_not_spun_on() {
        let seq = AtomicU64::new(9);
        let mut copies = 0;
        assert_eq!(read(&seq, || copies += 1), SeqRead::Stuck { seq: 9 });
        assert_eq!(copies, 0);
        let seq = AtomicU64::new(10);
        assert_eq!(
            read(&seq, || copies += 1),
            SeqRead::Consistent { retries: 0 }
        );
        assert_eq!(copies, 1);
    }

    #[test]
    fn a_copy_that_overlaps_a_section_is_discarded() {
        let seq = AtomicU64::new(2);
        let mut attempt = 0;
        let outcome = read(&seq, || {
            attempt += 1;
            if attempt == 1 {
                // A writer runs a whole section during the first copy.
                let odd = begin_exclusive(&seq);
                end(&seq, odd);
            }
        });
        assert_eq!(outcome, SeqRead::Consistent { retries: 1 });
    }
}
