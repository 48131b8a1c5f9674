//! Allocation and free hooks: exact enforcement.
//!
//! An allocation reserves its charge with the ledger *before* calling the driver, so concurrent
//! allocations (of any number of processes sharing the region) can never pass the limit together;
//! a driver failure returns the reservation, a denial returns `CUDA_ERROR_OUT_OF_MEMORY` without
//! calling the driver. A free always reaches the driver, tracked or not; its charge is taken out of
//! the table before the call (the driver cannot hand the address out again before it is freed) and
//! put back if the free fails.
//!
//! What is charged (design principle 6, "a limit means what nvidia-smi shows"):
//! - each allocation's size rounded up to the driver's granularity, [`charged_size`]: 2 MiB
//!   multiples from 2 MiB on, 512-byte multiples below (the driver packs small allocations into
//!   shared 2 MiB pages, so rounding those to 2 MiB would over-charge many small buffers);
//! - once per process and device, before its first allocation there, the context's memory
//!   (`VGPU_CONTEXT_BYTES`, default 544 MiB), held until the process exits (see `process.rs`);
//! - stream-ordered pools: their reserved size, not their live allocations (see `pools.rs`).
//!
//! Devices: `cuMemCreate` charges `prop->location.id` for device locations and nothing for host
//! locations; every other allocation charges the current context's device (`cuCtxGetDevice`; 0
//! when the thread has no context, in which case the driver fails the call and the reservation is
//! returned).

use std::ffi::c_uint;

mod unusual;

use self::unusual::{
    call_unaccounted, context_device, correct_pitch_charge, deny, release_stale,
    reserve_after_pools, settle_free_unusual, settle_unusual,
};
use super::{Gate, Hooked, enter, passthrough};
use crate::{
    accounting::{Accounting as _, AllocTable, Charge, Denied},
    cuda::*,
    entry_lines,
    guard::shield,
    pools,
    process::Process,
    real_driver::{Symbol, sym},
    state::State,
    wake_lines::WakeLines,
};

/// Pitch alignment assumed when reserving for `cuMemAllocPitch_v2` before the driver chooses the
/// pitch: the reservation is then corrected to `pitch * height`.
const PITCH_ALIGN: u64 = 512;

/// The driver's allocation granularity for sizes from 2 MiB on.
pub const GRANULE: u64 = 2 << 20;
/// Alignment of smaller allocations.
pub const SMALL_ALIGN: u64 = 512;

/// What an allocation of `bytes` is charged: see the module documentation.
pub fn charged_size(bytes: u64) -> u64 {
    let align = if bytes >= GRANULE {
        GRANULE
    } else {
        SMALL_ALIGN
    };
    bytes.div_ceil(align).saturating_mul(align)
}

/// The current context's device, 0 without one. With a single device that is 0 without asking
/// the driver (a call into it per allocation, with its own cold cache lines).
pub fn current_device(state: &State) -> usize {
    if state.single_device() {
        return 0;
    }
    context_device(state)
}

/// Which table a key lives in.
#[derive(Clone, Copy)]
enum Space {
    Ptr,
    Handle,
}

fn table(process: &Process, space: Space) -> &AllocTable {
    match space {
        Space::Ptr => &process.ptrs,
        Space::Handle => &process.handles,
    }
}

/// Reserves `charge` (and, the first time on its device, the context) in the process's ledger.
/// A denial first settles the process's pools (memory they returned at a synchronisation) and
/// retries once.
#[unsafe(link_section = ".text.hot.vgpu")]
fn reserve(state: &State, process: &Process, charge: Charge) -> Result<(), Denied> {
    process.ensure_context(charge.device)?;
    match process.ledger.try_reserve(charge.device, charge.bytes) {
        Ok(()) => Ok(()),
        Err(denied) => reserve_after_pools(state, process, charge, denied),
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
    entry_lines::before_alloc();
    let h: Hooked<S::Fn> = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let (state, process) = (h.state, h.process);
    let api = state.api(S::SYM);
    let clock = &state.clock;
    let reserved = shield(|| {
        state.debug_panic(S::SYM);
        let charge = plan(state)?;
        process.ledger.prefetch_reserve(charge.device);
        Some(reserve(state, process, charge).map(|()| charge))
    });
    let charge = match reserved {
        Some(None) => None,
        Some(Some(Ok(c))) => Some(c),
        None => return call_unaccounted(&h, S::SYM, call),
        Some(Some(Err(denied))) => return deny(&h, S::SYM, denied),
    };
    let wake = WakeLines::for_allocation(state, process, api);
    let t0 = clock.now();
    let r = call(h.real);
    let t1 = clock.now();
    let latency = clock.get().ns_between(t0, t1);
    wake.fetch(latency);
    shield(|| {
        let ok = r == CUDA_SUCCESS;
        if ok && charge.is_some() && !out.is_null() {
            // SAFETY: the driver succeeded, so it wrote the new address/handle to `out`.
            table(process, space).prefetch(unsafe { out.read() });
        }
        let mut allocated = 0;
        if let Some(c) = charge {
            settle_allocation(state, process, space, c, ok, out);
            if ok {
                allocated = c.bytes;
            }
        }
        h.record_bytes(S::SYM, t0, t1, ok, (allocated, 0));
    });
    r
}

/// After the driver call: keeps, corrects or returns an allocation's reservation. The common
/// case (a plain allocation that succeeded) is a table insert; the rest is out of line.
#[unsafe(link_section = ".text.hot.vgpu")]
fn settle_allocation(
    state: &State,
    process: &Process,
    space: Space,
    c: Charge,
    ok: bool,
    out: *const u64,
) {
    if c.pool != 0 || !ok || out.is_null() {
        return settle_unusual(state, process, space, c, ok, out);
    }
    keep(process, space, c, out);
}

/// Records a successful allocation's charge under the key the driver wrote to `out` (non-null).
#[inline(always)]
fn keep(process: &Process, space: Space, c: Charge, out: *const u64) {
    // SAFETY: the driver succeeded, so it wrote the new address/handle to the caller's `out`.
    let key = unsafe { out.read() };
    if let Some(stale) = table(process, space).insert(key, c) {
        release_stale(process, stale);
    }
}

/// Calls the driver's free for `key`, releasing the key's charge if it succeeds.
fn free<S: Symbol>(key: u64, space: Space, call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    if matches!(space, Space::Ptr) {
        entry_lines::before_free(key);
    }
    let h: Hooked<S::Fn> = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let (state, process) = (h.state, h.process);
    let taken = shield(|| {
        state.debug_panic(S::SYM);
        table(process, space).remove(key)
    });
    let releases = matches!(taken, Some(Some(c)) if c.device == 0 && c.pool == 0);
    let wake = WakeLines::for_free(state, process, state.api(S::SYM), releases);
    let t0 = state.clock.now();
    let r = call(h.real);
    let t1 = state.clock.now();
    let latency = state.clock.get().ns_between(t0, t1);
    wake.fetch(latency);
    shield(|| {
        let mut freed = 0;
        match taken.flatten() {
            Some(c) if r == CUDA_SUCCESS && c.pool == 0 => {
                process.ledger.release(c.device, c.bytes);
                freed = c.bytes;
            }
            Some(c) => freed = settle_free_unusual(state, process, space, key, c, r),
            None => {}
        }
        let ok = r == CUDA_SUCCESS && taken.is_some();
        h.record_bytes(S::SYM, t0, t1, ok, (0, freed));
    });
    r
}

fn on_current(bytes: usize) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        Some(Charge {
            device: current_device(state),
            bytes: charged_size(bytes as u64),
            pool: 0,
        })
    }
}

/// A stream-ordered allocation from `pool`, or from the current device's pool when `None`.
fn from_pool(bytes: usize, pool: Option<CUmemoryPool>) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        let device = current_device(state);
        let pool = match pool {
            Some(p) => p as u64,
            None => pools::device_pool(state, device).unwrap_or(0),
        };
        Some(Charge {
            device,
            bytes: charged_size(bytes as u64),
            pool,
        })
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.hot.vgpu")]
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
            allocate::<$sym>(dptr, Space::Ptr, from_pool(bytesize, None), |real| unsafe {
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
            allocate::<$sym>(
                dptr,
                Space::Ptr,
                from_pool(bytesize, Some(pool)),
                // SAFETY: forwards the caller's arguments unchanged to the same variant.
                |real| unsafe { real(dptr, bytesize, pool, stream) },
            )
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
    let estimate = charged_size(
        (width_in_bytes as u64)
            .div_ceil(PITCH_ALIGN)
            .saturating_mul(PITCH_ALIGN)
            .saturating_mul(height as u64),
    );
    let mut device = 0;
    let r = allocate::<sym::MemAllocPitchV2>(
        dptr,
        Space::Ptr,
        |state| {
            device = current_device(state);
            Some(Charge {
                device,
                bytes: estimate,
                pool: 0,
            })
        },
        // SAFETY: forwards the caller's arguments unchanged.
        |real| unsafe { real(dptr, pitch, width_in_bytes, height, element_size_bytes) },
    );
    if r == CUDA_SUCCESS && !pitch.is_null() && !dptr.is_null() {
        // SAFETY: the driver succeeded, so both out-pointers hold its answer.
        let (actual_pitch, addr) = unsafe { (pitch.read() as u64, dptr.read()) };
        let actual = charged_size(actual_pitch.saturating_mul(height as u64));
        return shield(|| correct_pitch_charge(addr, actual, estimate, device)).unwrap_or(r);
    }
    r
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
            bytes: charged_size(size as u64),
            pool: 0,
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
#[unsafe(link_section = ".text.hot.vgpu")]
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

/// Calls a pool operation, then lets `after` adjust the pool's charge if it succeeded.
fn pool_op<S: Symbol>(
    call: impl FnOnce(S::Fn) -> CUresult,
    after: impl FnOnce(&State, &Process),
) -> CUresult {
    let h: Hooked<S::Fn> = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS {
            after(h.state, h.process);
        }
        h.record(S::SYM, t0, t1, r == CUDA_SUCCESS);
    });
    r
}

/// A destroyed pool's charge is released.
///
/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    pool_op::<sym::MemPoolDestroy>(
        // SAFETY: forwards the caller's argument unchanged.
        |real| unsafe { real(pool) },
        |_, process| process.pools.destroyed(&process.ledger, pool as u64),
    )
}

/// A trimmed pool is charged what it still holds.
///
/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolTrimTo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    pool_op::<sym::MemPoolTrimTo>(
        // SAFETY: forwards the caller's arguments unchanged.
        |real| unsafe { real(pool, min_bytes_to_keep) },
        |state, process| {
            if let Some(device) = process.pools.device_of(pool as u64) {
                process
                    .pools
                    .settle(state, &process.ledger, pool as u64, device, 0, true);
            }
        },
    )
}
