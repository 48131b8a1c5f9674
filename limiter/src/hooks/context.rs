//! Context creation: `cuDevicePrimaryCtxRetain` (the runtime API's, at its initialisation) and
//! `cuCtxCreate_v2`/`_v3`/`_v4`. Once the driver has created or retained a context, the
//! process's context charge on its device is reserved (`Process::ensure_context`), so that free
//! memory (`cuMemGetInfo`, NVML) reports what can still be allocated from then on, not only
//! after the first allocation. A charge the limit has no room for never fails the call: the
//! context exists, the refusal is logged once and flagged in the region, and the allocations are
//! refused as before.

use std::ffi::{c_int, c_uint, c_void};

use super::gate::{Gate, enter, shield};
use crate::platform::{
    cuda::*,
    driver::{
        PfnCtxCreateV2, PfnCtxCreateV3, PfnCtxCreateV4, PfnDevicePrimaryCtxRetain, Symbol, sym,
    },
};

/// Calls the driver; if it made a context on `dev`, charges it.
fn created<S: Symbol>(dev: CUdevice, call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    let h = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS
            && let Ok(device) = usize::try_from(dev)
        {
            h.process.context_exists(device);
        }
        h.record(S::SYM, t0, t1, r == CUDA_SUCCESS);
    });
    r
}

/// # Safety
/// The caller follows the contract of the driver's `cuDevicePrimaryCtxRetain`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: *mut *mut c_void,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    created::<sym::DevicePrimaryCtxRetain>(dev, |real: PfnDevicePrimaryCtxRetain| unsafe {
        real(pctx, dev)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuCtxCreate_v2`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    created::<sym::CtxCreateV2>(dev, |real: PfnCtxCreateV2| unsafe {
        real(pctx, flags, dev)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuCtxCreate_v3`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut *mut c_void,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    created::<sym::CtxCreateV3>(dev, |real: PfnCtxCreateV3| unsafe {
        real(pctx, params, num_params, flags, dev)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuCtxCreate_v4`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut *mut c_void,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    created::<sym::CtxCreateV4>(dev, |real: PfnCtxCreateV4| unsafe {
        real(pctx, params, flags, dev)
    })
}
