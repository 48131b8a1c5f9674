//! Allocation and free hooks: exact enforcement.
//!
//! An allocation reserves its bytes with the accounting backend *before* calling the driver, so
//! concurrent allocations can never pass the limit together; a driver failure returns the
//! reservation, a denial returns `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver. A free
//! always reaches the driver, tracked or not; its charge is taken out of the table before the call
//! (the driver cannot hand the address out again before it is freed) and put back if the free fails.
//!
//! Devices: `cuMemCreate` charges `prop->location.id` for device locations and nothing for host
//! locations; every other allocation charges the current context's device (`cuCtxGetDevice`; 0
//! when the thread has no context, in which case the driver fails the call and the reservation is
//! returned). Stream-ordered allocations charge the requested bytes until `cuMemFreeAsync`;
//! memory a pool keeps cached after the free is not charged (pool growth accounting comes with the
//! region).

use std::{ffi::c_uint, time::Instant};

use super::{Gate, Hooked, enter, passthrough, since};
use crate::{
    accounting::{Accounting as _, AllocTable, Charge},
    cuda::*,
    guard::shield,
    log,
    real_driver::{self, Symbol, sym},
    state::State,
};

/// Pitch alignment assumed when reserving for `cuMemAllocPitch_v2` before the driver chooses the
/// pitch: the reservation is then corrected to `pitch * height`.
const PITCH_ALIGN: u64 = 512;

/// The current context's device, 0 without one.
pub fn current_device(state: &State) -> usize {
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

/// Which table a key lives in.
#[derive(Clone, Copy)]
enum Space {
    Ptr,
    Handle,
}

fn table(state: &State, space: Space) -> &AllocTable {
    match space {
        Space::Ptr => &state.ptrs,
        Space::Handle => &state.handles,
    }
}

/// Reserves `charge` (if any), calls the driver, then records the allocation under the key the
/// driver wrote to `out` or returns the reservation.
fn allocate<S: Symbol>(
    out: *const u64,
    space: Space,
    plan: impl FnOnce(&State) -> Option<Charge>,
    call: impl FnOnce(S::Fn) -> CUresult,
) -> CUresult {
    let h: Hooked<S::Fn> = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let state = h.state;
    let api = state.api(S::SYM);
    let reserved = shield(|| {
        let charge = plan(state)?;
        Some(
            state
                .ledger
                .try_reserve(charge.device, charge.bytes)
                .map(|()| charge),
        )
    });
    let charge = match reserved {
        // A panic before the driver call: the call goes through unaccounted (counted by `shield`).
        None => return call(h.real),
        Some(None) => None,
        Some(Some(Ok(c))) => Some(c),
        Some(Some(Err(denied))) => {
            shield(|| {
                state.ledger.record_denied(api, denied.requested);
                state.ledger.record_call(api, 0, false);
                log::debug!("{}: denied: {denied}", S::SYM.name().to_string_lossy());
            });
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    };
    let t0 = Instant::now();
    let r = call(h.real);
    let dt = since(t0);
    shield(|| {
        state.ledger.record_call(api, dt, r == CUDA_SUCCESS);
        let Some(c) = charge else { return };
        if r != CUDA_SUCCESS || out.is_null() {
            state.ledger.release(c.device, c.bytes);
            return;
        }
        // SAFETY: the driver succeeded, so it wrote the new address/handle to the caller's `out`.
        let key = unsafe { out.read() };
        if let Some(stale) = table(state, space).insert(key, c) {
            // The driver reused a key we still held: the earlier free was not seen. Its bytes are gone.
            state.ledger.release(stale.device, stale.bytes);
        }
        state.ledger.record_alloc(api, c.bytes);
    });
    r
}

/// Calls the driver's free for `key`, releasing the key's charge if it succeeds.
fn free<S: Symbol>(key: u64, space: Space, call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    let h: Hooked<S::Fn> = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let state = h.state;
    let charge = shield(|| table(state, space).remove(key)).flatten();
    let t0 = Instant::now();
    let r = call(h.real);
    let dt = since(t0);
    shield(|| {
        let api = state.api(S::SYM);
        state.ledger.record_call(api, dt, r == CUDA_SUCCESS);
        match charge {
            Some(c) if r == CUDA_SUCCESS => {
                state.ledger.release(c.device, c.bytes);
                state.ledger.record_free(api, c.bytes);
            }
            Some(c) => {
                table(state, space).insert(key, c);
            }
            None => {}
        }
    });
    r
}

fn on_current(bytes: usize) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        Some(Charge {
            device: current_device(state),
            bytes: bytes as u64,
        })
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    allocate::<sym::MemAllocV2>(dptr, Space::Ptr, on_current(bytesize), |real| unsafe {
        real(dptr, bytesize)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemAllocManaged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    allocate::<sym::MemAllocManaged>(dptr, Space::Ptr, on_current(bytesize), |real| unsafe {
        real(dptr, bytesize, flags)
    })
}

macro_rules! alloc_async {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            stream: CUstream,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            allocate::<$sym>(dptr, Space::Ptr, on_current(bytesize), |real| unsafe {
                real(dptr, bytesize, stream)
            })
        }
    };
}

alloc_async!(cuMemAllocAsync, sym::MemAllocAsync);
alloc_async!(cuMemAllocAsync_ptsz, sym::MemAllocAsyncPtsz);

macro_rules! alloc_from_pool_async {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            stream: CUstream,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            allocate::<$sym>(dptr, Space::Ptr, on_current(bytesize), |real| unsafe {
                real(dptr, bytesize, pool, stream)
            })
        }
    };
}

alloc_from_pool_async!(cuMemAllocFromPoolAsync, sym::MemAllocFromPoolAsync);
alloc_from_pool_async!(cuMemAllocFromPoolAsync_ptsz, sym::MemAllocFromPoolAsyncPtsz);

/// # Safety
/// The caller follows the contract of the driver's `cuMemAllocPitch_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    let estimate = (width_in_bytes as u64)
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height as u64);
    let mut device = 0;
    let r = allocate::<sym::MemAllocPitchV2>(
        dptr,
        Space::Ptr,
        |state| {
            device = current_device(state);
            Some(Charge {
                device,
                bytes: estimate,
            })
        },
        // SAFETY: forwards the caller's arguments unchanged.
        |real| unsafe { real(dptr, pitch, width_in_bytes, height, element_size_bytes) },
    );
    if r == CUDA_SUCCESS && !pitch.is_null() && !dptr.is_null() {
        // SAFETY: the driver succeeded, so both out-pointers hold its answer.
        let (actual_pitch, addr) = unsafe { (pitch.read() as u64, dptr.read()) };
        let actual = actual_pitch.saturating_mul(height as u64);
        return shield(|| correct_pitch_charge(addr, actual, estimate, device)).unwrap_or(r);
    }
    r
}

/// Replaces the estimated charge of a pitched allocation by its real size; if the real size does not
/// fit, the allocation is freed and the caller gets `CUDA_ERROR_OUT_OF_MEMORY`.
fn correct_pitch_charge(addr: CUdeviceptr, actual: u64, estimate: u64, device: usize) -> CUresult {
    let Some(state) = crate::state::ready() else {
        return CUDA_SUCCESS;
    };
    if actual == estimate || state.ptrs.remove(addr).is_none() {
        return CUDA_SUCCESS;
    }
    let fits = if actual > estimate {
        state.ledger.try_reserve(device, actual - estimate).is_ok()
    } else {
        state.ledger.release(device, estimate - actual);
        true
    };
    if fits {
        state.ptrs.insert(
            addr,
            Charge {
                device,
                bytes: actual,
            },
        );
        return CUDA_SUCCESS;
    }
    state.ledger.release(device, estimate);
    if let Some(free) = state.driver.get::<sym::MemFreeV2>() {
        // SAFETY: `addr` was just allocated by the driver and is not known to the caller yet.
        unsafe { free(addr) };
    }
    state
        .ledger
        .record_denied(state.api(real_driver::Sym::MemAllocPitchV2), actual);
    CUDA_ERROR_OUT_OF_MEMORY
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let plan = |state: &State| {
        if prop.is_null() {
            return None;
        }
        // SAFETY: the caller passes a valid `CUmemAllocationProp`; only its leading fields are read.
        let location = unsafe { (*prop).location };
        (location.kind == CU_MEM_LOCATION_TYPE_DEVICE).then(|| Charge {
            device: usize::try_from(location.id).unwrap_or_else(|_| current_device(state)),
            bytes: size as u64,
        })
    };
    // SAFETY: forwards the caller's arguments unchanged.
    allocate::<sym::MemCreate>(handle, Space::Handle, plan, |real| unsafe {
        real(handle, size, prop, flags)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemFree_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    // SAFETY: forwards the caller's argument unchanged.
    free::<sym::MemFreeV2>(dptr, Space::Ptr, |real| unsafe { real(dptr) })
}

macro_rules! free_async {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            free::<$sym>(dptr, Space::Ptr, |real| unsafe { real(dptr, stream) })
        }
    };
}

free_async!(cuMemFreeAsync, sym::MemFreeAsync);
free_async!(cuMemFreeAsync_ptsz, sym::MemFreeAsyncPtsz);

/// # Safety
/// The caller follows the contract of the driver's `cuMemRelease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: forwards the caller's argument unchanged.
    free::<sym::MemRelease>(handle, Space::Handle, |real| unsafe { real(handle) })
}

/// Maps memory already charged by `cuMemCreate`: counted and timed only.
///
/// # Safety
/// The caller follows the contract of the driver's `cuMemMap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    passthrough::<sym::MemMap>(|real| unsafe { real(ptr, size, offset, handle, flags) })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    passthrough::<sym::MemPoolCreate>(|real| unsafe { real(pool, props) })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    // SAFETY: forwards the caller's argument unchanged.
    passthrough::<sym::MemPoolDestroy>(|real| unsafe { real(pool) })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolTrimTo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    passthrough::<sym::MemPoolTrimTo>(|real| unsafe { real(pool, min_bytes_to_keep) })
}
