//! Memory information: a limited device reports its limit as its total and what is left of the
//! limit as free, so frameworks size their caches to the limit (`limiter_core::info` has the
//! rule). Free is what can still be allocated: a successful `cuMemGetInfo` means a context is
//! current, so its charge is reserved first if it is not yet (a context made through a path
//! without a hook), and a charge the limit has no room for is not free either.

use limiter_core::{
    accounting::Accounting as _,
    info::{limited_info, limited_total},
};

use super::gate::{Gate, enter, shield};
use crate::platform::{
    cuda::*,
    driver::{PfnDeviceTotalMem, PfnMemGetInfo, Sym, sym},
};

/// # Safety
/// The caller follows the contract of the driver's `cuMemGetInfo_v2`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    let call = |real: PfnMemGetInfo| unsafe { real(free, total) };
    let h = match enter::<sym::MemGetInfoV2>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    // Pools may have returned memory at a synchronisation: charge what they hold now.
    shield(|| {
        h.process
            .pools
            .settle_all(h.state.driver, &h.process.ledger)
    });
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
            let dev = h.state.current_device();
            h.process.context_exists(dev);
            // SAFETY: the driver succeeded and wrote both values; the pointers are the caller's.
            unsafe {
                let (f, t) = limited_info(
                    &h.process.ledger,
                    dev,
                    h.process.context_pending(dev),
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
pub(crate) unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
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
            && let limit @ Some(_) = h.process.ledger.limit(device)
        {
            // SAFETY: the driver succeeded and wrote the total; the pointer is the caller's.
            unsafe { bytes.write(limited_total(limit, bytes.read() as u64) as usize) };
        }
        h.record(Sym::DeviceTotalMemV2, t0, t1, r == CUDA_SUCCESS);
    });
    r
}
