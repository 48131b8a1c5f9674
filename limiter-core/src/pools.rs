//! Stream-ordered pools: charge what the driver actually holds.
//!
//! Memory of `cuMemAllocAsync`/`cuMemAllocFromPoolAsync` stays in its pool after `cuMemFreeAsync`
//! until the pool is trimmed (`cuMemPoolTrimTo`, or a synchronisation that trims to the release
//! threshold). So a pool is charged its `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, not the sum of
//! its live allocations:
//!
//! 1. before an async allocation the requested size is reserved like any allocation (a denial
//!    returns `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver, so growth never passes the
//!    limit by more than the pool's rounding);
//! 2. after the call (and after async frees, trims, and `cuMemGetInfo_v2`), [`PoolTable::settle`]
//!    reads the pool's reserved size ([`PoolSizes`]) and moves the pool's charge to it: releasing what the pool
//!    does not hold, or reserving the pool's rounding above the request (if that is denied, the
//!    charge stays at what was reserved and the difference is the remaining window);
//! 3. `cuMemPoolDestroy` releases the pool's charge.
//!
//! Remaining window: memory the driver returns at a synchronisation stays charged until the next
//! settle of that pool (an over-count: it can deny, never admit past the limit); a denied
//! allocation settles every pool and retries once, so cached memory never blocks an allocation.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::accounting::Accounting;

/// What the pools need from the driver.
pub trait PoolSizes {
    /// `pool`'s reserved size as the driver reports it (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`),
    /// `None` if it does not answer.
    fn reserved(&self, pool: u64) -> Option<u64>;
}

/// What one pool is charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolCharge {
    pub(crate) device: usize,
    /// Bytes this process holds in the ledger for the pool.
    pub(crate) charged: u64,
}

/// Charges per pool handle. Locked only on stream-ordered allocation paths, never on a launch.
#[derive(Debug, Default)]
pub struct PoolTable {
    pools: Mutex<HashMap<u64, PoolCharge>>,
}

impl PoolTable {
    /// Moves `pool`'s charge to what the driver holds. `pending` bytes were reserved for the
    /// pool by the call just made (0 for frees and trims); `succeeded` says whether that call
    /// succeeded. Returns the new charge.
    pub fn settle(
        &self,
        sizes: &impl PoolSizes,
        ledger: &impl Accounting,
        pool: u64,
        device: usize,
        pending: u64,
        succeeded: bool,
    ) -> u64 {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = pools
            .entry(pool)
            .or_insert(PoolCharge { device, charged: 0 });
        let held = entry.charged.saturating_add(pending);
        let target = match sizes.reserved(pool) {
            Some(t) => t,
            // Unknown: keep what a successful call reserved, drop what a failed one did.
            None if succeeded => held,
            None => entry.charged,
        };
        entry.charged = if target <= held {
            ledger.release(entry.device, held - target);
            target
        } else if ledger.try_reserve(entry.device, target - held).is_ok() {
            target
        } else {
            held
        };
        entry.charged
    }

    /// Settles every known pool (after a denial, before retrying; on `cuMemGetInfo_v2`).
    /// Returns the bytes released.
    pub fn settle_all(&self, sizes: &impl PoolSizes, ledger: &impl Accounting) -> u64 {
        let known: Vec<(u64, PoolCharge)> = self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(&p, &c)| (p, c))
            .collect();
        known
            .into_iter()
            .map(|(pool, c)| {
                let after = self.settle(sizes, ledger, pool, c.device, 0, true);
                c.charged.saturating_sub(after)
            })
            .sum()
    }

    /// Whether any pool is charged.
    pub fn any_charged(&self) -> bool {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .any(|c| c.charged > 0)
    }

    /// The device `pool` was charged on, if known.
    pub fn device_of(&self, pool: u64) -> Option<usize> {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&pool)
            .map(|c| c.device)
    }

    /// Forgets a destroyed pool, releasing its charge.
    pub fn destroyed(&self, ledger: &impl Accounting, pool: u64) {
        let gone = self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&pool);
        if let Some(c) = gone {
            ledger.release(c.device, c.charged);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, collections::HashMap};

    use super::*;
    use crate::{accounting::InProcess, config::Config};

    /// The driver's reserved size per pool, as a test sets it (absent: the driver does not
    /// answer).
    #[derive(Default)]
    struct Sizes(RefCell<HashMap<u64, u64>>);

    impl Sizes {
        fn set(&self, pool: u64, bytes: u64) {
            self.0.borrow_mut().insert(pool, bytes);
        }
    }

    impl PoolSizes for Sizes {
        fn reserved(&self, pool: u64) -> Option<u64> {
            self.0.borrow().get(&pool).copied()
        }
    }

    fn ledger(limit: u64) -> InProcess {
        let mut c = Config::default();
        c.memory_limit[0] = Some(limit);
        InProcess::new(&c)
    }

    #[test]
    fn a_pool_is_charged_what_the_driver_says_it_holds() {
        let (sizes, l, pools) = (Sizes::default(), ledger(100), PoolTable::default());
        // An allocation of 10 reserved before the call; the pool grew to 16 (its rounding).
        l.try_reserve(0, 10).unwrap();
        sizes.set(7, 16);
        assert_eq!(pools.settle(&sizes, &l, 7, 0, 10, true), 16);
        assert_eq!(l.used(0), 16);
        assert!(pools.any_charged());
        assert_eq!(pools.device_of(7), Some(0));
        // A free leaves the memory in the pool: still charged. A trim returns it.
        assert_eq!(pools.settle(&sizes, &l, 7, 0, 0, true), 16);
        sizes.set(7, 4);
        assert_eq!(pools.settle(&sizes, &l, 7, 0, 0, true), 4);
        assert_eq!(l.used(0), 4);
        pools.destroyed(&l, 7);
        assert_eq!(l.used(0), 0);
        assert!(!pools.any_charged());
        assert_eq!(pools.device_of(7), None);
    }

    #[test]
    fn growth_past_the_limit_keeps_what_was_reserved() {
        let (sizes, l, pools) = (Sizes::default(), ledger(100), PoolTable::default());
        l.try_reserve(0, 90).unwrap();
        sizes.set(1, 120);
        // The pool's rounding above the request does not fit: the charge stays at the request.
        assert_eq!(pools.settle(&sizes, &l, 1, 0, 90, true), 90);
        assert_eq!(l.used(0), 90);
    }

    #[test]
    fn without_an_answer_a_success_keeps_and_a_failure_returns_the_reservation() {
        let (sizes, l, pools) = (Sizes::default(), ledger(100), PoolTable::default());
        l.try_reserve(0, 30).unwrap();
        assert_eq!(pools.settle(&sizes, &l, 2, 0, 30, true), 30);
        l.try_reserve(0, 20).unwrap();
        assert_eq!(pools.settle(&sizes, &l, 2, 0, 20, false), 30);
        assert_eq!(l.used(0), 30);
    }

    #[test]
    fn settling_every_pool_returns_what_they_gave_back() {
        let (sizes, l, pools) = (Sizes::default(), ledger(1000), PoolTable::default());
        for (pool, bytes) in [(1, 100), (2, 200)] {
            l.try_reserve(0, bytes).unwrap();
            sizes.set(pool, bytes);
            pools.settle(&sizes, &l, pool, 0, bytes, true);
        }
        sizes.set(1, 40);
        sizes.set(2, 0);
        assert_eq!(pools.settle_all(&sizes, &l), 60 + 200);
        assert_eq!(l.used(0), 40);
        assert!(pools.any_charged());
    }
}
