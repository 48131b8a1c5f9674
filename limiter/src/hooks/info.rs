//! Memory information: a limited device reports its limit as its total and what is left of the
//! limit as free, so frameworks size their caches to the limit.
//!
//! Both figures are also capped by what the driver reports: a limit larger than the device does not
//! make the device look larger, and memory that other processes hold outside the limit is not shown
//! as free. Subtractions saturate at zero (HAMi-core #200 wrapped them).

use std::time::Instant;

use super::{Gate, enter, memory::current_device, since};
use crate::{
    accounting::Accounting as _,
    cuda::*,
    guard::shield,
    real_driver::{PfnDeviceTotalMem, PfnMemGetInfo, sym},
    state::State,
};

/// `(free, total)` as seen under the limit of `device`, from the driver's `(free, total)`.
pub fn limited_info(state: &State, device: usize, free: u64, total: u64) -> (u64, u64) {
    match state.ledger.limit(device) {
        Some(limit) => {
            let left = limit.saturating_sub(state.ledger.used(device));
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
    let t0 = Instant::now();
    let r = call(h.real);
    let dt = since(t0);
    shield(|| {
        if r == CUDA_SUCCESS && !free.is_null() && !total.is_null() {
            let dev = current_device(h.state);
            // SAFETY: the driver succeeded and wrote both values; the pointers are the caller's.
            unsafe {
                let (f, t) = limited_info(h.state, dev, free.read() as u64, total.read() as u64);
                free.write(f as usize);
                total.write(t as usize);
            }
        }
        h.state.ledger.record_call(
            h.state.api(crate::real_driver::Sym::MemGetInfoV2),
            dt,
            r == CUDA_SUCCESS,
        );
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
    let t0 = Instant::now();
    let r = call(h.real);
    let dt = since(t0);
    shield(|| {
        if r == CUDA_SUCCESS
            && !bytes.is_null()
            && let Ok(device) = usize::try_from(dev)
            && let Some(limit) = h.state.ledger.limit(device)
        {
            // SAFETY: the driver succeeded and wrote the total; the pointer is the caller's.
            unsafe { bytes.write((bytes.read() as u64).min(limit) as usize) };
        }
        h.state.ledger.record_call(
            h.state.api(crate::real_driver::Sym::DeviceTotalMemV2),
            dt,
            r == CUDA_SUCCESS,
        );
    });
    r
}
