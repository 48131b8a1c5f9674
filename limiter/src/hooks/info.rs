//! Memory information: a limited device reports its limit as its total and what is left of the
//! limit as free, so frameworks size their caches to the limit.
//!
//! Both figures are also capped by what the driver reports: a limit larger than the device does not
//! make the device look larger, and memory that other processes hold outside the limit is not shown
//! as free. Subtractions saturate at zero (HAMi-core #200 wrapped them).

use super::{Gate, enter, memory::current_device};
use crate::{
    accounting::Accounting,
    cuda::*,
    guard::shield,
    real_driver::{PfnDeviceTotalMem, PfnMemGetInfo, Sym, sym},
};

/// `(free, total)` as seen under the limit of `device`, from the driver's `(free, total)`. `used`
/// is the container's reservation (the region's) or this process's (in-process accounting).
pub fn limited_info(ledger: &impl Accounting, device: usize, free: u64, total: u64) -> (u64, u64) {
    match ledger.limit(device) {
        Some(limit) => {
            let left = limit.saturating_sub(ledger.used(device));
            (left.min(free), limit.min(total))
        }
        None => (free, total),
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemGetInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    let call = |real: PfnMemGetInfo| unsafe { real(free, total) };
    let h = match enter::<sym::MemGetInfoV2>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    // Pools may have returned memory at a synchronisation: charge what they hold now.
    shield(|| h.process.pools.settle_all(h.state, &h.process.ledger));
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
            let dev = current_device(h.state);
            // SAFETY: the driver succeeded and wrote both values; the pointers are the caller's.
            unsafe {
                let (f, t) = limited_info(
                    &h.process.ledger,
                    dev,
                    free.read() as u64,
                    total.read() as u64,
                );
                free.write(f as usize);
                total.write(t as usize);
            }
        }
        h.record(Sym::MemGetInfoV2, t0, t1, r == CUDA_SUCCESS);
    });
    r
}

/// # Safety
/// The caller follows the contract of the driver's `cuDeviceTotalMem_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    let call = |real: PfnDeviceTotalMem| unsafe { real(bytes, dev) };
    let h = match enter::<sym::DeviceTotalMemV2>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS
            && !bytes.is_null()
            && let Ok(device) = usize::try_from(dev)
            && let Some(limit) = h.process.ledger.limit(device)
        {
            // SAFETY: the driver succeeded and wrote the total; the pointer is the caller's.
            unsafe { bytes.write((bytes.read() as u64).min(limit) as usize) };
        }
        h.record(Sym::DeviceTotalMemV2, t0, t1, r == CUDA_SUCCESS);
    });
    r
}
