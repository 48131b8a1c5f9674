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
//!    reads the pool's reserved size and moves the pool's charge to it: releasing what the pool
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

use crate::{accounting::Accounting, cuda::*, real_driver::sym, state::State};

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: std::ffi::c_int = 5;

/// What one pool is charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCharge {
    pub device: usize,
    /// Bytes this process holds in the ledger for the pool.
    pub charged: u64,
}

/// Charges per pool handle. Locked only on stream-ordered allocation paths, never on a launch.
#[derive(Debug, Default)]
pub struct PoolTable {
    pools: Mutex<HashMap<u64, PoolCharge>>,
}

/// The pool's reserved size as the driver reports it.
pub fn reserved_current(state: &State, pool: u64) -> Option<u64> {
    let get = state.driver.get::<sym::MemPoolGetAttribute>()?;
    let mut value: u64 = 0;
    // SAFETY: the attribute is a `cuuint64_t`, written to a valid out-pointer.
    let r = unsafe {
        get(
            pool as CUmemoryPool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&raw mut value).cast(),
        )
    };
    (r == CUDA_SUCCESS).then_some(value)
}

/// The current pool of `device` (what `cuMemAllocAsync` allocates from).
pub fn device_pool(state: &State, device: usize) -> Option<u64> {
    let get = state.driver.get::<sym::DeviceGetMemPool>()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let dev = CUdevice::try_from(device).ok()?;
    // SAFETY: a valid out-pointer and a device ordinal.
    let r = unsafe { get(&mut pool, dev) };
    (r == CUDA_SUCCESS && !pool.is_null()).then_some(pool as u64)
}

impl PoolTable {
    /// Moves `pool`'s charge to what the driver holds. `pending` bytes were reserved for the
    /// pool by the call just made (0 for frees and trims); `succeeded` says whether that call
    /// succeeded. Returns the new charge.
    pub fn settle(
        &self,
        state: &State,
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
        let target = match reserved_current(state, pool) {
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
    pub fn settle_all(&self, state: &State, ledger: &impl Accounting) -> u64 {
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
                let after = self.settle(state, ledger, pool, c.device, 0, true);
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
