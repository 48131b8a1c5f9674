//! The allocation and free hooks off their common path: several devices, a denial and the pools'
//! retry, a panic before the driver call, pool allocations, failed driver calls, a key found
//! live, a pitched allocation's corrected charge. All out of line and out of `.text.hot`, so that
//! the common path's code stays in few cache lines (limiter/README.md, "Cold calls").

use super::{Space, keep, table};
use crate::{
    accounting::{Accounting as _, Charge, Denied},
    cuda::*,
    guard::shield,
    hooks::Hooked,
    log,
    process::{self, Process},
    real_driver::{self, Sym, sym},
    state::State,
};

/// [`current_device`] with several devices: asks the driver. Out of line (a single device is the
/// common case on a shared GPU).
#[cold]
#[inline(never)]
pub(super) fn context_device(state: &State) -> usize {
    let Some(get) = state.driver.get::<real_driver::sym::CtxGetDevice>() else {
        return 0;
    };
    let mut dev: CUdevice = 0;
    // SAFETY: `dev` is a valid out-pointer for the duration of the call.
    let r = unsafe { get(&mut dev) };
    if r == CUDA_SUCCESS {
        usize::try_from(dev).unwrap_or(0)
    } else {
        0
    }
}

/// [`reserve`] after a denial: settles the pools and retries once if that returned anything.
#[cold]
#[inline(never)]
pub(super) fn reserve_after_pools(
    state: &State,
    process: &Process,
    charge: Charge,
    denied: Denied,
) -> Result<(), Denied> {
    if process.pools.any_charged() && process.pools.settle_all(state, &process.ledger) > 0 {
        process.ledger.try_reserve(charge.device, charge.bytes)
    } else {
        Err(denied)
    }
}

/// A panic before the driver call: the call goes through unaccounted, and is counted as an error
/// of the API (the limiter failed it) besides the process-wide panic counter.
#[cold]
#[inline(never)]
pub(super) fn call_unaccounted<F: Copy>(
    h: &Hooked<F>,
    sym: Sym,
    call: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let clock = &h.state.clock;
    let t0 = clock.now();
    let r = call(h.real);
    let t1 = clock.now();
    shield(|| h.record(sym, t0, t1, false));
    r
}

/// An allocation refused at the limit: counted, and the caller gets
/// `CUDA_ERROR_OUT_OF_MEMORY` without the driver being called.
#[cold]
#[inline(never)]
pub(super) fn deny<F>(h: &Hooked<F>, sym: Sym, denied: Denied) -> CUresult {
    shield(|| {
        h.process.ledger.record_denied(sym.api(), denied.requested);
        let now = h.state.clock.now();
        h.record(sym, now, now, false);
        log::debug!("{}: denied: {denied}", sym.name().to_string_lossy());
    });
    CUDA_ERROR_OUT_OF_MEMORY
}

/// [`settle_allocation`] of a pool allocation (its pool is settled), or of a plain one that
/// failed or has no address (its reservation is returned).
#[cold]
#[inline(never)]
pub(super) fn settle_unusual(
    state: &State,
    process: &Process,
    space: Space,
    c: Charge,
    ok: bool,
    out: *const u64,
) {
    if c.pool == 0 {
        process.ledger.release(c.device, c.bytes);
        return;
    }
    process
        .pools
        .settle(state, &process.ledger, c.pool, c.device, c.bytes, ok);
    if ok && !out.is_null() {
        keep(process, space, c, out);
    }
}

/// The driver reused a key we still held: the earlier free was not seen. Its bytes are gone.
#[cold]
#[inline(never)]
pub(super) fn release_stale(process: &Process, stale: Charge) {
    if stale.pool == 0 {
        process.ledger.release(stale.device, stale.bytes);
    }
}

/// After a free of a pool allocation (its pool is settled), or one the driver refused (the key
/// stays live: its charge goes back into the table). Returns the bytes freed.
#[cold]
#[inline(never)]
pub(super) fn settle_free_unusual(
    state: &State,
    process: &Process,
    space: Space,
    key: u64,
    c: Charge,
    r: CUresult,
) -> u64 {
    if r != CUDA_SUCCESS {
        table(process, space).insert(key, c);
        return 0;
    }
    process
        .pools
        .settle(state, &process.ledger, c.pool, c.device, 0, true);
    c.bytes
}

/// Replaces the estimated charge of a pitched allocation by its real size; if the real size does not
/// fit, the allocation is freed and the caller gets `CUDA_ERROR_OUT_OF_MEMORY`.
pub(super) fn correct_pitch_charge(
    addr: CUdeviceptr,
    actual: u64,
    estimate: u64,
    device: usize,
) -> CUresult {
    let (Some(state), Some(process)) = (crate::state::ready(), process::ready()) else {
        return CUDA_SUCCESS;
    };
    if actual == estimate || process.ptrs.remove(addr).is_none() {
        return CUDA_SUCCESS;
    }
    let fits = if actual > estimate {
        process
            .ledger
            .try_reserve(device, actual - estimate)
            .is_ok()
    } else {
        process.ledger.release(device, estimate - actual);
        true
    };
    if fits {
        process.ptrs.insert(
            addr,
            Charge {
                device,
                bytes: actual,
                pool: 0,
            },
        );
        return CUDA_SUCCESS;
    }
    process.ledger.release(device, estimate);
    if let Some(free) = state.driver.get::<sym::MemFreeV2>() {
        // SAFETY: `addr` was just allocated by the driver and is not known to the caller yet.
        unsafe { free(addr) };
    }
    process
        .ledger
        .record_denied(state.api(Sym::MemAllocPitchV2), actual);
    CUDA_ERROR_OUT_OF_MEMORY
}
