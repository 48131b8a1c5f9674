//! Exact, lock-free memory reservations on the container-wide per-device counter.
//!
//! `try_reserve` is a CAS loop that only ever publishes `reserved + bytes <= limit`, so under any
//! interleaving of any number of processes the counter never exceeds the limit. Each process also
//! keeps what it holds in its slot (`held`), so the holdings of a process that died can be
//! returned by whoever reclaims its slot.
//!
//! Order of the two updates, chosen so a crash between them can only *over*-count (which is safe:
//! it can deny an allocation, never let usage pass the limit):
//! - reserve: container `reserved` first, then the slot's `held`. A crash in between leaves the
//!   bytes in `reserved` with no slot holding them: leaked until the container restarts.
//! - release: the slot's `held` first, then `reserved`. A crash in between leaves the bytes in
//!   `reserved` only: the same leak.
//! - reclaim: `held.swap(0)` then subtract from `reserved`. `swap` hands each device's holdings to
//!   exactly one reclaimer; a reclaimer dying in between leaks them the same way.
//!
//! The opposite orders would let a crash return bytes twice (under-counting, unsafe). The window
//! is two atomic instructions wide; docs/region.md quantifies it.

use std::sync::atomic::Ordering;

use crate::sync::Atomic64;

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

/// Adds `bytes` to `reserved` unless that would pass `limit` (0 = unlimited).
/// Returns the new value of `reserved`.
#[inline]
pub(crate) fn reserve<A: Atomic64>(reserved: &A, limit: u64, bytes: u64) -> Result<u64, Denied> {
    // Relaxed: the value is only a guess for the first CAS; the CAS re-validates it.
    let mut current = reserved.load(Ordering::Relaxed);
    loop {
        let new = match current.checked_add(bytes) {
            Some(new) if limit == 0 || new <= limit => new,
            _ => {
                return Err(Denied {
                    limit,
                    reserved: current,
                    requested: bytes,
                });
            }
        };
        // AcqRel: the counter is the only shared datum of the protocol; Acquire/Release keep
        // the slot's `held` update (which follows in program order) after this CAS for any
        // reclaimer that acquires the counter. The check above and the publish are one atomic
        // step, which is what makes the limit exact.
        match reserved.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Ok(new),
            Err(actual) => current = actual,
        }
    }
}

/// Subtracts up to `bytes` from `counter`, never wrapping below zero.
/// Returns how much was subtracted.
#[inline]
pub(crate) fn release_saturating<A: Atomic64>(counter: &A, bytes: u64) -> u64 {
    let mut current = counter.load(Ordering::Relaxed);
    loop {
        let take = current.min(bytes);
        // AcqRel: pairs with the AcqRel of `reserve` and of other releases (one total order of
        // updates on the counter).
        match counter.compare_exchange_weak(
            current,
            current - take,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return take,
            Err(actual) => current = actual,
        }
    }
}

/// Adds `bytes` to a slot's `held` (written by the threads of one process).
#[inline]
pub(crate) fn add_held<A: Atomic64>(held: &A, bytes: u64) {
    // Release: a reclaimer's `swap(AcqRel)` of `held` sees the reservation that precedes it.
    let previous = held.fetch_add(bytes, Ordering::Release);
    debug_assert!(previous.checked_add(bytes).is_some(), "held overflow");
}

/// Returns a dead process's holdings on one device: takes them from its slot with `swap` (so
/// exactly one caller gets them) and subtracts them from the container-wide counter.
/// Returns the bytes returned.
pub(crate) fn return_holdings<A: Atomic64>(held: &A, reserved: &A) -> u64 {
    // AcqRel: Acquire pairs with the owner's Release `fetch_add` in `add_held`.
    let bytes = held.swap(0, Ordering::AcqRel);
    if bytes == 0 {
        return 0;
    }
    release_saturating(reserved, bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn reserve_respects_the_limit_exactly() {
        let reserved = AtomicU64::new(0);
        assert_eq!(reserve(&reserved, 100, 60), Ok(60));
        assert_eq!(reserve(&reserved, 100, 40), Ok(100));
        assert_eq!(
            reserve(&reserved, 100, 1),
            Err(Denied {
                limit: 100,
                reserved: 100,
                requested: 1
            })
        );
        assert_eq!(release_saturating(&reserved, 30), 30);
        assert_eq!(reserve(&reserved, 100, 30), Ok(100));
    }

    #[test]
    fn unlimited_still_refuses_overflow() {
        let reserved = AtomicU64::new(u64::MAX - 1);
        assert!(reserve(&reserved, 0, 1).is_ok());
        assert!(reserve(&reserved, 0, 1).is_err());
    }

    #[test]
    fn release_never_wraps() {
        let reserved = AtomicU64::new(10);
        assert_eq!(release_saturating(&reserved, 25), 10);
        assert_eq!(reserved.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn holdings_are_returned_once() {
        let reserved = AtomicU64::new(0);
        let held = AtomicU64::new(0);
        reserve(&reserved, 0, 70).unwrap();
        add_held(&held, 70);
        assert_eq!(return_holdings(&held, &reserved), 70);
        assert_eq!(return_holdings(&held, &reserved), 0);
        assert_eq!(reserved.load(Ordering::Relaxed), 0);
    }
}
