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
//! wedge a reader. Readers of untrusted files run the same algorithm over `pread` copies
//! ([`read_copied`]): they never map the file.
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
/// when the result is `Consistent`). The atomic form of [`read_copied`] (the same algorithm,
/// [`read_with`]), model-checked by loom.
#[cfg(any(test, loom))]
pub(crate) fn read<A: Atomic64>(seq: &A, mut copy: impl FnMut()) -> SeqRead {
    let outcome: Result<SeqRead, std::convert::Infallible> = read_with(
        // Acquire: pairs with the writer's Release `end` store.
        || Ok(seq.load(Ordering::Acquire)),
        || {
            copy();
            Ok(None)
        },
        A::fence,
    );
    match outcome {
        Ok(read) => read,
        Err(never) => match never {},
    }
}

/// The bounded read over copies made by system calls (`pread` of a file the reader does not
/// map), for readers of untrusted files. `load_seq` reads the sequence word; `copy` copies the
/// protected bytes and returns the sequence word found inside its copy. The copy is consistent iff
/// the sequence was even and equal before, inside and after it. Errors of either closure end the
/// read.
///
/// Ordering: each closure's loads are made by the kernel in this thread, before the closure
/// returns; the `Acquire` fences after them keep the next closure's loads after them (a thread
/// that migrates between CPUs passes a full barrier). So the argument in the module docs carries
/// over: a copy that saw any store of a section begun after `s1` is followed by an `s2` that sees
/// the odd value or later. The kernel's copy does not promise single-copy atomicity per word, so
/// a torn sequence value is conceivable; it could only make one inconsistent copy of statistics
/// count as consistent if three separately read copies of the sequence agreed, and values from
/// the file are untrusted numbers anyway, never indices or sizes.
pub(crate) fn read_copied<E>(
    load_seq: impl FnMut() -> Result<u64, E>,
    mut copy: impl FnMut() -> Result<u64, E>,
) -> Result<SeqRead, E> {
    read_with(load_seq, || copy().map(Some), std::sync::atomic::fence)
}

/// The algorithm of [`read`] and [`read_copied`]: `s1 = load_seq()`; `fence(Acquire)`; retry if
/// odd; `copy()` (which may return the sequence found inside its copy); `fence(Acquire)` (pairs
/// with the writer's Release fence after its odd store); `s2 = load_seq()`; consistent iff
/// `s1 == s2` (and the inner sequence, if any, equals them too).
fn read_with<E>(
    mut load_seq: impl FnMut() -> Result<u64, E>,
    mut copy: impl FnMut() -> Result<Option<u64>, E>,
    fence: impl Fn(Ordering),
) -> Result<SeqRead, E> {
    let mut last = 0;
    let mut odd_every_time = true;
    for attempt in 0..READ_RETRIES {
        let s1 = load_seq()?;
        // Keeps the copy's loads after `s1` when `load_seq` is not itself an Acquire load.
        fence(Ordering::Acquire);
        last = s1;
        if s1 & 1 == 1 {
            backoff(attempt);
            continue;
        }
        odd_every_time = false;
        let inside = copy()?;
        // Acquire fence: pairs with the writer's Release fence after its odd store (see the
        // module docs); orders the copy's loads before the check below.
        fence(Ordering::Acquire);
        let s2 = load_seq()?;
        if s1 == s2 && inside.is_none_or(|s| s == s1) {
            return Ok(SeqRead::Consistent { retries: attempt });
        }
        last = s2;
        backoff(attempt);
    }
    Ok(if odd_every_time {
        SeqRead::Stuck { seq: last }
    } else {
        SeqRead::Busy { seq: last }
    })
}

/// Layout 3's test of two copies of a record, made in that order with an Acquire fence between
/// them, whose words only grow (see `reader::shards`): the copy is consistent iff the two are
/// identical and the sequence (word `seq`) is even.
pub(crate) fn copies_agree(first: &[u64], second: &[u64], seq: usize) -> bool {
    first == second && first.get(seq).is_some_and(|s| s & 1 == 0)
}

#[inline]
pub(crate) fn backoff(attempt: u32) {
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
    fn copied_reads_check_the_sequence_before_inside_and_after() {
        // Stuck: odd every time, never copied.
        let mut copies = 0;
        let out = read_copied::<()>(
            || Ok(5),
            || {
                copies += 1;
                Ok(5)
            },
        );
        assert_eq!((out, copies), (Ok(SeqRead::Stuck { seq: 5 }), 0));
        // A copy whose own sequence differs (a section ran during it) is retried.
        let mut attempt = 0;
        let out = read_copied::<()>(
            || Ok(8),
            || {
                attempt += 1;
                Ok(if attempt == 1 { 9 } else { 8 })
            },
        );
        assert_eq!(out, Ok(SeqRead::Consistent { retries: 1 }));
        // Errors end the read.
        assert_eq!(read_copied(|| Err("short"), || Ok(0)), Err("short"));
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
