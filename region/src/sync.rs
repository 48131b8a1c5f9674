//! The atomic operations the lock-free algorithms need, as a trait so the same code runs on the
//! `std` atomics of a shared mapping and, under `--cfg loom`, on loom's model-checked atomics.
//!
//! Production code is monomorphised for [`std::sync::atomic::AtomicU64`] only, so the trait
//! costs nothing at run time.

use std::sync::atomic::{AtomicU64, Ordering};

/// A 64-bit atomic cell plus the fence of the same memory model.
pub(crate) trait Atomic64 {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    /// A fence in the memory model these atomics live in.
    fn fence(order: Ordering);
}

impl Atomic64 for AtomicU64 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline(always)]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
    #[inline(always)]
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    #[inline(always)]
    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }
}

#[cfg(all(test, loom))]
impl Atomic64 for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        loom::sync::atomic::AtomicU64::store(self, value, order)
    }
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        loom::sync::atomic::AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    fn fence(order: Ordering) {
        loom::sync::atomic::fence(order)
    }
}
