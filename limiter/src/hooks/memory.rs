//! Allocation and free hooks: exact enforcement.
//!
//! An allocation reserves its charge with the ledger *before* calling the driver, so concurrent
//! allocations (of any number of processes sharing the region) can never pass the limit together;
//! a driver failure returns the reservation, a denial returns `CUDA_ERROR_OUT_OF_MEMORY` without
//! calling the driver. A free always reaches the driver, tracked or not; its charge is taken out of
//! the table before the call (the driver cannot hand the address out again before it is freed) and
//! put back if the free fails.
//!
//! Each hook's common path reads as four steps: **reserve** the charge (an allocation) or take it
//! out of the table (a free), **call** the driver, **keep** the allocation in the table or
//! **return** its reservation (release a free's charge, or put it back if the free failed), and
//! **record** the call. What is charged is `limiter_core::charge`'s rule (the driver's
//! granularity, the context once per device, pools by their reserved size). The cache hints
//! between the steps are `hints`'; the rare branches are in [`unusual`], out of line.
//!
//! Devices: `cuMemCreate` charges `prop->location.id` for device locations and nothing for host
//! locations; every other allocation charges the current context's device (`cuCtxGetDevice`; 0
//! when the thread has no context, in which case the driver fails the call and the reservation is
//! returned).

use std::ffi::c_uint;

mod mapped;
mod unusual;

pub(crate) use self::mapped::*;
use self::mapped::{own_freeze, republish};

use limiter_core::{
    accounting::{Accounting as _, Denied},
    charge::{Charge, charged_size, pitch_estimate, pitched_size},
};

use self::unusual::{
    call_unaccounted, correct_pitch_charge, deny, out_of_device_memory, release_stale,
    reserve_after_pools, settle_free_unusual, settle_unusual,
};
use super::gate::{Gate, Hooked, enter, passthrough, shield};
use crate::{
    hints::{self, WakeLines},
    platform::{
        cuda::*,
        driver::{PfnMemAllocPitch, Symbol, sym},
    },
    runtime::{
        self,
        own_freeze::{MIN_BACKED, OwnFreeze, on_device, whole_prop},
        process::{Process, Space},
        state::State,
    },
};

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

/// An allocation: reserves its charge (if any), calls the driver, then keeps the allocation under
/// the key the driver wrote to `out` or returns the reservation, and records the call.
#[inline(always)]
fn allocate<S: Symbol>(
    out: *const u64,
    space: Space,
    plan: impl FnOnce(&State) -> Option<Charge>,
    call: impl Fn(S::Fn) -> CUresult,
) -> CUresult {
    hints::before_alloc();
    // Bound first, then passed on: matched into the call, the hook's frame grows (by 32 bytes
    // for a free, a stack line more after its driver call).
    let h = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    allocate_hooked::<S>(h, out, space, plan, call)
}

/// [`allocate`] once the hook's logic runs (its in-process tests start here). The driver call
/// may be made again: an allocation the GPU has no room for waits for memory under
/// `VGPU_OOM_WAIT` (see [`out_of_device_memory`]).
#[inline(always)]
fn allocate_hooked<S: Symbol>(
    h: Hooked<S::Fn>,
    out: *const u64,
    space: Space,
    plan: impl FnOnce(&State) -> Option<Charge>,
    call: impl Fn(S::Fn) -> CUresult,
) -> CUresult {
    let (state, process) = (h.state, h.process);
    // Reserve.
    let planned = shield(|| {
        state.debug_panic(S::SYM);
        let charge = plan(state)?;
        hints::reservation(&process.ledger, charge.device);
        Some(reserve(state, process, charge).map(|()| charge))
    });
    let charge = match planned {
        Some(None) => None,
        Some(Some(Ok(c))) => Some(c),
        None => return call_unaccounted(&h, S::SYM, call),
        Some(Some(Err(denied))) => return deny(&h, S::SYM, denied),
    };
    // Call.
    let wake = WakeLines::for_allocation(state, process, S::SYM.api());
    let (mut r, t0, mut t1) = call_driver(&h, &call, &wake);
    if r == CUDA_ERROR_OUT_OF_MEMORY && charge.is_some() {
        (r, t1) = out_of_device_memory(&h, S::SYM, charge, &call).unwrap_or((r, t1));
    }
    // Keep or return, record.
    shield(|| {
        let ok = r == CUDA_SUCCESS;
        let mut allocated = 0;
        if let Some(c) = charge {
            if ok && !out.is_null() {
                // SAFETY: the driver succeeded, so it wrote the new address/handle to `out`.
                hints::table_line(process, space, unsafe { out.read() });
            }
            settle_allocation(state, process, space, c, ok, out);
            if ok {
                allocated = c.bytes;
            }
        }
        h.record_bytes(S::SYM, t0, t1, ok, (allocated, 0));
    });
    r
}

/// Calls the driver, timed, and fetches the wake lines the moment it returns.
#[inline(always)]
fn call_driver<F: Copy>(
    h: &Hooked<F>,
    call: impl FnOnce(F) -> CUresult,
    wake: &WakeLines,
) -> (CUresult, u64, u64) {
    let clock = &h.state.clock;
    let t0 = clock.now();
    let r = call(h.real);
    let t1 = clock.now();
    wake.fetch(clock.get().ns_between(t0, t1));
    (r, t0, t1)
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
    // SAFETY: the driver succeeded, so it wrote the new address/handle to the caller's `out`.
    let key = unsafe { out.read() };
    if let Some(stale) = process.keep(space, key, c) {
        release_stale(process, stale);
    }
}

/// A free: takes the key's charge out of the table (the driver cannot hand the address out again
/// before it is freed), calls the driver, then returns the charge (or puts it back if the free
/// failed) and records the call.
#[inline(always)]
fn free<S: Symbol>(key: u64, space: Space, call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    if space == Space::Ptr {
        hints::before_free(key);
    }
    let h = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    free_hooked::<S>(h, key, space, call)
}

/// [`free`] once the hook's logic runs (its in-process tests start here).
#[inline(always)]
fn free_hooked<S: Symbol>(
    h: Hooked<S::Fn>,
    key: u64,
    space: Space,
    call: impl FnOnce(S::Fn) -> CUresult,
) -> CUresult {
    let (state, process) = (h.state, h.process);
    // Take the charge.
    let taken = shield(|| {
        state.debug_panic(S::SYM);
        process.take(space, key)
    });
    // Call.
    let releases = matches!(taken, Some(Some(c)) if c.device == 0 && c.pool == 0);
    let wake = WakeLines::for_free(state, process, S::SYM.api(), releases);
    let (r, t0, t1) = call_driver(&h, call, &wake);
    // Return (or put back), record.
    shield(|| {
        let freed = match taken.flatten() {
            Some(c) if r == CUDA_SUCCESS && c.pool == 0 => {
                process.ledger.release(c.device, c.bytes);
                c.bytes
            }
            Some(c) => settle_free_unusual(state, process, space, key, c, r),
            None => 0,
        };
        let ok = r == CUDA_SUCCESS && taken.is_some();
        h.record_bytes(S::SYM, t0, t1, ok, (0, freed));
    });
    r
}

fn on_current(bytes: usize) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        Some(Charge {
            device: state.current_device(),
            bytes: charged_size(bytes as u64),
            pool: 0,
        })
    }
}

/// A stream-ordered allocation from `pool`, or from the current device's pool when `None`.
fn from_pool(bytes: usize, pool: Option<CUmemoryPool>) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        let device = state.current_device();
        let pool = match pool {
            Some(p) => p as u64,
            None => state.driver.device_pool(device).unwrap_or(0),
        };
        Some(Charge {
            device,
            bytes: charged_size(bytes as u64),
            pool,
        })
    }
}

/// A `cuMemCreate` of `size` bytes at `prop`'s location: charged on a device location, free on
/// the host.
fn at_location(
    size: usize,
    prop: *const CUmemAllocationProp,
) -> impl FnOnce(&State) -> Option<Charge> {
    move |state| {
        if prop.is_null() {
            return None;
        }
        // SAFETY: the caller passes a valid `CUmemAllocationProp`; only its leading fields are read.
        let location = unsafe { (*prop).location };
        (location.kind == CU_MEM_LOCATION_TYPE_DEVICE).then(|| Charge {
            device: usize::try_from(location.id).unwrap_or_else(|_| state.current_device()),
            bytes: charged_size(size as u64),
            pool: 0,
        })
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.hot.vgpu")]
pub(crate) unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    allocate::<sym::MemAllocV2>(dptr, Space::Ptr, on_current(bytesize), |real| {
        if bytesize as u64 >= MIN_BACKED
            && let Some(own) = own_freeze()
        {
            return allocate_backed(own, dptr, bytesize);
        }
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { real(dptr, bytesize) }
    })
}

/// `cuMemAlloc_v2` backed by the in-process freeze (`runtime::own_freeze`): the same contract,
/// an address the application frees with `cuMemFree_v2`.
#[cold]
#[inline(never)]
fn allocate_backed(
    (own, state): (&'static OwnFreeze, &'static State),
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match own.backing.allocate(state.driver, bytesize as u64) {
        Ok(p) => {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { dptr.write(p) };
            if let Some(process) = runtime::get().process() {
                own.republish(process.region_slot());
            }
            CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemAllocManaged`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemAllocManaged(
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
        pub(crate) unsafe extern "C" fn $name(
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
        pub(crate) unsafe extern "C" fn $name(
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
pub(crate) unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    let call = |real: PfnMemAllocPitch| unsafe {
        real(dptr, pitch, width_in_bytes, height, element_size_bytes)
    };
    hints::before_alloc();
    let h = match enter::<sym::MemAllocPitchV2>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    allocate_pitched(h, dptr, pitch, width_in_bytes, height, call)
}

/// A pitched allocation: reserved as estimated before the driver chooses the pitch, then
/// corrected to `pitch * height` (freed and refused if that does not fit).
fn allocate_pitched(
    h: Hooked<PfnMemAllocPitch>,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    call: impl Fn(PfnMemAllocPitch) -> CUresult,
) -> CUresult {
    let (state, process) = (h.state, h.process);
    let estimate = pitch_estimate(width as u64, height as u64);
    let mut device = 0;
    let r = allocate_hooked::<sym::MemAllocPitchV2>(
        h,
        dptr,
        Space::Ptr,
        |state| {
            device = state.current_device();
            Some(Charge {
                device,
                bytes: estimate,
                pool: 0,
            })
        },
        call,
    );
    if r == CUDA_SUCCESS && !pitch.is_null() && !dptr.is_null() {
        // SAFETY: the driver succeeded, so both out-pointers hold its answer.
        let (actual_pitch, addr) = unsafe { (pitch.read() as u64, dptr.read()) };
        let actual = pitched_size(actual_pitch, height as u64);
        return shield(|| correct_pitch_charge(state, process, addr, actual, estimate, device))
            .unwrap_or(r);
    }
    r
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemCreate`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    allocate::<sym::MemCreate>(handle, Space::Handle, at_location(size, prop), |real| {
        if let Some((own, state)) = own_freeze()
            // SAFETY: the caller's property struct (or null), as `cuMemCreate` reads it.
            && unsafe { on_device(whole_prop(prop.cast())) }
        {
            // SAFETY: the caller's out-pointer and whole property struct; the driver's call
            // gets the caller's arguments but the out-pointer, which is the table's.
            return unsafe {
                own.created
                    .create(state.driver, handle, size, whole_prop(prop.cast()), |out| {
                        real(out, size, prop, flags)
                    })
            };
        }
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { real(handle, size, prop, flags) }
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemFree_v2`.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".text.hot.vgpu")]
pub(crate) unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    free::<sym::MemFreeV2>(dptr, Space::Ptr, |real| {
        if let Some((own, state)) = own_freeze()
            && let Some(r) = own.backing.free(state.driver, dptr)
        {
            if let Some(process) = runtime::get().process() {
                own.republish(process.region_slot());
            }
            return r.err().unwrap_or(CUDA_SUCCESS);
        }
        // SAFETY: forwards the caller's argument unchanged.
        unsafe { real(dptr) }
    })
}

macro_rules! free_async {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
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
pub(crate) unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    // A release of one of several references to memory the application created (a retained
    // handle) frees nothing: its charge stays.
    if let Some((own, _)) = own_freeze()
        && own.created.references(handle) > 1
    {
        return passthrough::<sym::MemRelease>(|real| {
            // SAFETY: the driver's handle behind the caller's.
            let r = own.created.release(handle, |h| unsafe { real(h) });
            r.unwrap_or(CUDA_ERROR_INVALID_VALUE)
        });
    }
    free::<sym::MemRelease>(handle, Space::Handle, |real| {
        if let Some((own, _)) = own_freeze()
            // SAFETY: the driver's handle behind the caller's.
            && let Some(r) = own.created.release(handle, |h| unsafe { real(h) })
        {
            republish(own);
            return r;
        }
        // SAFETY: forwards the caller's argument unchanged.
        unsafe { real(handle) }
    })
}

/// Maps memory already charged by `cuMemCreate`: counted and timed only.
///
/// # Safety
/// The caller follows the contract of the driver's `cuMemMap`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    passthrough::<sym::MemMap>(|real| {
        if let Some((own, _)) = own_freeze()
            // SAFETY: the caller's arguments with the driver's handle behind the caller's.
            && let Some(r) = own.created.map(ptr, size, offset, handle, |h| unsafe {
                real(ptr, size, offset, h, flags)
            })
        {
            return r;
        }
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { real(ptr, size, offset, handle, flags) }
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolCreate`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemPoolCreate(
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
    let h = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    pool_op_hooked::<S>(h, call, after)
}

/// [`pool_op`] once the hook's logic runs.
fn pool_op_hooked<S: Symbol>(
    h: Hooked<S::Fn>,
    call: impl FnOnce(S::Fn) -> CUresult,
    after: impl FnOnce(&State, &Process),
) -> CUresult {
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
fn destroyed(pool: CUmemoryPool) -> impl FnOnce(&State, &Process) {
    move |_, process| process.pools.destroyed(&process.ledger, pool as u64)
}

/// A trimmed pool is charged what it still holds.
fn trimmed(pool: CUmemoryPool) -> impl FnOnce(&State, &Process) {
    move |state, process| {
        if let Some(device) = process.pools.device_of(pool as u64) {
            process
                .pools
                .settle(state.driver, &process.ledger, pool as u64, device, 0, true);
        }
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolDestroy`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    // SAFETY: forwards the caller's argument unchanged.
    pool_op::<sym::MemPoolDestroy>(|real| unsafe { real(pool) }, destroyed(pool))
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemPoolTrimTo`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemPoolTrimTo(
    pool: CUmemoryPool,
    min_bytes_to_keep: usize,
) -> CUresult {
    pool_op::<sym::MemPoolTrimTo>(
        // SAFETY: forwards the caller's arguments unchanged.
        |real| unsafe { real(pool, min_bytes_to_keep) },
        trimmed(pool),
    )
}

#[cfg(test)]
mod tests {
    //! The allocation and free hooks in process, over the fake driver of `test_support`: what is
    //! reserved, kept, returned and recorded for each outcome of the driver call.

    use super::*;
    use crate::{
        runtime,
        test_support::{Cx, DEVICE_POOL, config, device},
    };

    const MIB: u64 = 1 << 20;

    fn alloc(cx: &Cx, bytes: u64) -> (CUresult, u64) {
        let mut addr = 0u64;
        let out: *mut u64 = &mut addr;
        let n = bytes as usize;
        let r = allocate_hooked::<sym::MemAllocV2>(
            cx.hooked::<sym::MemAllocV2>(),
            out,
            Space::Ptr,
            on_current(n),
            // SAFETY: the fake driver's function with a valid out-pointer.
            |real| unsafe { real(out, n) },
        );
        (r, addr)
    }

    fn free(cx: &Cx, addr: u64) -> CUresult {
        free_hooked::<sym::MemFreeV2>(
            cx.hooked::<sym::MemFreeV2>(),
            addr,
            Space::Ptr,
            // SAFETY: the fake driver's function.
            |real| unsafe { real(addr) },
        )
    }

    fn alloc_async(cx: &Cx, bytes: u64) -> (CUresult, u64) {
        let mut addr = 0u64;
        let out: *mut u64 = &mut addr;
        let n = bytes as usize;
        let r = allocate_hooked::<sym::MemAllocAsync>(
            cx.hooked::<sym::MemAllocAsync>(),
            out,
            Space::Ptr,
            from_pool(n, None),
            // SAFETY: the fake driver's function with a valid out-pointer.
            |real| unsafe { real(out, n, std::ptr::null_mut()) },
        );
        (r, addr)
    }

    fn free_async(cx: &Cx, addr: u64) -> CUresult {
        free_hooked::<sym::MemFreeAsync>(
            cx.hooked::<sym::MemFreeAsync>(),
            addr,
            Space::Ptr,
            // SAFETY: the fake driver's function.
            |real| unsafe { real(addr, std::ptr::null_mut()) },
        )
    }

    fn used(cx: &Cx) -> u64 {
        cx.process.ledger.used(0)
    }

    fn driver_calls() -> Vec<&'static str> {
        device(|d| d.calls.clone())
    }

    #[test]
    fn an_allocation_is_reserved_kept_and_returned_by_its_free() {
        let cx = Cx::new(config(64 * MIB), "mem1");
        let (r, addr) = alloc(&cx, 3 * MIB);
        assert_eq!(r, CUDA_SUCCESS);
        // 3 MiB rounds up to the 2 MiB granule.
        assert_eq!(used(&cx), 4 * MIB);
        assert_eq!(free(&cx, addr), CUDA_SUCCESS);
        assert_eq!(used(&cx), 0);
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 0, 4 * MIB, 0, 0]);
        assert_eq!(cx.recorded("cuMemFree_v2"), [1, 0, 0, 4 * MIB, 0]);
        assert_eq!(driver_calls(), ["cuMemAlloc_v2", "cuMemFree_v2"]);
    }

    #[test]
    fn an_allocation_past_the_limit_is_denied_without_calling_the_driver() {
        let cx = Cx::new(config(8 * MIB), "mem2");
        assert_eq!(alloc(&cx, 6 * MIB).0, CUDA_SUCCESS);
        assert_eq!(alloc(&cx, 4 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(driver_calls(), ["cuMemAlloc_v2"]);
        assert_eq!(used(&cx), 6 * MIB);
        let [calls, errors, _, _, denied] = cx.recorded("cuMemAlloc_v2");
        assert_eq!((calls, errors, denied), (2, 1, 1));
    }

    #[test]
    fn a_failed_allocation_returns_its_reservation() {
        let cx = Cx::new(config(64 * MIB), "mem3");
        device(|d| d.failing.push("cuMemAlloc_v2"));
        assert_eq!(alloc(&cx, 2 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(used(&cx), 0);
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 0]);
    }

    /// The time this process's slot records as held back by the limiter.
    fn held_back_ns(cx: &Cx) -> u64 {
        let (_, slot) = cx.process.region_slot().expect("a region");
        let snap = cx.snapshot();
        snap.slots
            .iter()
            .find(|s| s.index == slot.index())
            .expect("our slot")
            .throttled_ns
    }

    fn waiting(limit: u64, wait: std::time::Duration) -> limiter_core::config::Config {
        limiter_core::config::Config {
            oom_wait: Some(wait),
            ..config(limit)
        }
    }

    #[test]
    fn without_a_wait_the_gpu_running_out_fails_at_once() {
        let cx = Cx::new(config(64 * MIB), "oom1");
        device(|d| d.failing.push("cuMemAlloc_v2"));
        assert_eq!(alloc(&cx, 2 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(driver_calls(), ["cuMemAlloc_v2"], "asked once");
        assert_eq!(used(&cx), 0);
        assert_eq!(held_back_ns(&cx), 0);
    }

    #[test]
    fn a_waiting_allocation_gets_memory_that_frees_and_keeps_it() {
        let cx = Cx::new(
            waiting(64 * MIB, std::time::Duration::from_secs(30)),
            "oom2",
        );
        device(|d| {
            d.failing.push("cuMemAlloc_v2");
            d.failures_left = Some(3);
        });
        let (r, addr) = alloc(&cx, 2 * MIB);
        assert_eq!(r, CUDA_SUCCESS);
        assert_ne!(addr, 0);
        assert_eq!(driver_calls(), ["cuMemAlloc_v2"; 4]);
        assert_eq!(used(&cx), 2 * MIB);
        // One call, no error: the retries are the limiter's; the wait (1 + 2 + 4 ms of sleep at
        // least) is time held back.
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 0, 2 * MIB, 0, 0]);
        assert!(held_back_ns(&cx) >= 7_000_000, "{}", held_back_ns(&cx));
        assert_eq!(free(&cx, addr), CUDA_SUCCESS);
        assert_eq!(used(&cx), 0);
    }

    #[test]
    fn a_stream_ordered_allocation_waits_the_same_way() {
        let cx = Cx::new(
            waiting(64 * MIB, std::time::Duration::from_secs(30)),
            "oom5",
        );
        device(|d| {
            d.failing.push("cuMemAllocAsync");
            d.failures_left = Some(2);
        });
        let (r, addr) = alloc_async(&cx, 2 * MIB);
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(
            driver_calls()
                .iter()
                .filter(|c| **c == "cuMemAllocAsync")
                .count(),
            3
        );
        let [calls, errors, ..] = cx.recorded("cuMemAllocAsync");
        assert_eq!((calls, errors), (1, 0));
        assert!(held_back_ns(&cx) >= 3_000_000, "{}", held_back_ns(&cx));
        assert_eq!(free_async(&cx, addr), CUDA_SUCCESS);
    }

    #[test]
    fn a_wait_that_times_out_fails_and_returns_the_reservation() {
        let timeout = std::time::Duration::from_millis(40);
        let cx = Cx::new(waiting(64 * MIB, timeout), "oom3");
        device(|d| d.failing.push("cuMemAlloc_v2"));
        assert_eq!(alloc(&cx, 2 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        // 1, 2, 4, 8, 16 ms, then what is left of 40: at least 7 attempts, all of them failed.
        assert!(driver_calls().len() >= 7, "{:?}", driver_calls());
        assert_eq!(used(&cx), 0);
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 0]);
        assert!(held_back_ns(&cx) >= 40_000_000, "{}", held_back_ns(&cx));
    }

    #[test]
    fn a_denial_by_the_limit_is_not_waited_for() {
        let cx = Cx::new(waiting(4 * MIB, std::time::Duration::from_secs(30)), "oom4");
        assert_eq!(alloc(&cx, 6 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(driver_calls().is_empty());
        assert_eq!(held_back_ns(&cx), 0);
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 1]);
    }

    #[test]
    fn a_failed_free_keeps_the_charge_and_an_unknown_free_still_reaches_the_driver() {
        let cx = Cx::new(config(64 * MIB), "mem4");
        let (_, addr) = alloc(&cx, 2 * MIB);
        device(|d| d.failing.push("cuMemFree_v2"));
        assert_ne!(free(&cx, addr), CUDA_SUCCESS);
        assert_eq!(used(&cx), 2 * MIB, "the address is still allocated");
        device(|d| d.failing.clear());
        assert_eq!(free(&cx, addr), CUDA_SUCCESS);
        assert_eq!(used(&cx), 0);
        // Freed again: not ours any more, but the driver answers it.
        assert_ne!(free(&cx, addr), CUDA_SUCCESS);
        assert_eq!(
            driver_calls(),
            [
                "cuMemAlloc_v2",
                "cuMemFree_v2",
                "cuMemFree_v2",
                "cuMemFree_v2"
            ]
        );
        assert_eq!(cx.recorded("cuMemFree_v2"), [3, 2, 0, 2 * MIB, 0]);
    }

    #[test]
    fn the_context_is_charged_once_and_held_and_refuses_what_does_not_fit() {
        let mut c = config(64 * MIB);
        c.context_bytes = 16 * MIB;
        let cx = Cx::new(c, "mem5");
        let (_, a) = alloc(&cx, 2 * MIB);
        let (_, b) = alloc(&cx, 2 * MIB);
        assert_eq!(used(&cx), 20 * MIB);
        free(&cx, a);
        free(&cx, b);
        assert_eq!(used(&cx), 16 * MIB, "the context stays charged");
        // A context larger than the limit: the allocation is refused before the driver.
        let mut c = config(8 * MIB);
        c.context_bytes = 16 * MIB;
        let small = Cx::new(c, "mem6");
        device(|d| d.calls.clear());
        assert_eq!(alloc(&small, MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
        assert!(driver_calls().is_empty());
        assert_eq!(used(&small), 0);
    }

    #[test]
    fn a_panic_in_the_logic_falls_through_to_the_driver_and_is_counted() {
        let mut c = config(64 * MIB);
        c.debug_panic_in = Some("cuMemAlloc_v2".into());
        let cx = Cx::new(c, "mem7");
        let before = runtime::get().panics();
        let (r, _) = alloc(&cx, 2 * MIB);
        assert_eq!(r, CUDA_SUCCESS, "the call still reaches the driver, once");
        assert_eq!(driver_calls(), ["cuMemAlloc_v2"]);
        assert_eq!(used(&cx), 0, "unaccounted");
        assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 0]);
        assert!(runtime::get().panics() > before);
    }

    #[test]
    fn a_reused_address_returns_the_stale_charge() {
        let cx = Cx::new(config(64 * MIB), "mem8");
        let (_, addr) = alloc(&cx, 2 * MIB);
        // The driver freed it without the limiter seeing it, and hands it out again.
        device(|d| {
            d.live.clear();
            d.failing.clear();
        });
        let mut again = 0;
        let out: *mut u64 = &mut again;
        let r = allocate_hooked::<sym::MemAllocV2>(
            cx.hooked::<sym::MemAllocV2>(),
            out,
            Space::Ptr,
            on_current(2 << 20),
            // SAFETY: writes the reused address to the valid out-pointer.
            |_| unsafe {
                out.write(addr);
                CUDA_SUCCESS
            },
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(used(&cx), 2 * MIB, "one charge for one live address");
    }

    #[test]
    fn a_pool_is_charged_what_it_holds_until_trimmed() {
        let cx = Cx::new(config(64 * MIB), "mem9");
        let (r, addr) = alloc_async(&cx, MIB);
        assert_eq!(r, CUDA_SUCCESS);
        // The pool grew by its 2 MiB granule, not the 1 MiB asked.
        assert_eq!(used(&cx), 2 * MIB);
        assert_eq!(free_async(&cx, addr), CUDA_SUCCESS);
        assert_eq!(used(&cx), 2 * MIB, "freed memory stays in the pool");
        let pool = DEVICE_POOL as CUmemoryPool;
        let r = pool_op_hooked::<sym::MemPoolTrimTo>(
            cx.hooked::<sym::MemPoolTrimTo>(),
            // SAFETY: the fake driver's function.
            |real| unsafe { real(pool, 0) },
            trimmed(pool),
        );
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(used(&cx), 0);
        // Grown again, then destroyed: its charge goes.
        alloc_async(&cx, 3 * MIB);
        assert_eq!(used(&cx), 4 * MIB);
        pool_op_hooked::<sym::MemPoolDestroy>(
            cx.hooked::<sym::MemPoolDestroy>(),
            // SAFETY: the fake driver's function.
            |real| unsafe { real(pool) },
            destroyed(pool),
        );
        assert_eq!(used(&cx), 0);
    }

    #[test]
    fn a_denial_settles_the_pools_and_retries_once() {
        let cx = Cx::new(config(8 * MIB), "mem10");
        let (_, addr) = alloc_async(&cx, 6 * MIB);
        free_async(&cx, addr);
        assert_eq!(used(&cx), 6 * MIB);
        // A synchronisation trimmed the pool: the limiter does not know yet.
        device(|d| d.pools.insert(DEVICE_POOL, 0));
        let (r, _) = alloc(&cx, 4 * MIB);
        assert_eq!(
            r, CUDA_SUCCESS,
            "the pool's cached memory does not block it"
        );
        assert_eq!(used(&cx), 4 * MIB);
    }

    fn alloc_pitched(cx: &Cx, width: usize, height: usize) -> (CUresult, u64, usize) {
        let (mut addr, mut pitch) = (0u64, 0usize);
        let (out, p): (*mut u64, *mut usize) = (&mut addr, &mut pitch);
        let r = allocate_pitched(
            cx.hooked::<sym::MemAllocPitchV2>(),
            out,
            p,
            width,
            height,
            // SAFETY: the fake driver's function with valid out-pointers.
            |real| unsafe { real(out, p, width, height, 4) },
        );
        (r, addr, pitch)
    }

    #[test]
    fn a_pitched_allocation_is_corrected_to_its_pitch_or_refused() {
        let cx = Cx::new(config(64 * MIB), "mem11");
        device(|d| d.pitch_align = 2048);
        // Estimated as 1536-byte rows (153,600), the driver chose 2048 (204,800).
        let (r, addr, pitch) = alloc_pitched(&cx, 1100, 100);
        assert_eq!((r, pitch), (CUDA_SUCCESS, 2048));
        assert_eq!(used(&cx), 204_800);
        free(&cx, addr);
        assert_eq!(used(&cx), 0);
        // Room for the estimate, not for the pitch the driver chose: freed and refused.
        let tight = Cx::new(config(160_000), "mem12");
        device(|d| d.calls.clear());
        let (r, _, _) = alloc_pitched(&tight, 1100, 100);
        assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(driver_calls(), ["cuMemAllocPitch_v2", "cuMemFree_v2"]);
        assert!(device(|d| d.live.is_empty()));
        assert_eq!(used(&tight), 0);
    }

    fn create(cx: &Cx, size: usize, kind: i32) -> (CUresult, u64) {
        let prop = CUmemAllocationProp {
            kind: 1,
            requested_handle_types: 0,
            location: CUmemLocation { kind, id: 0 },
        };
        let mut handle = 0u64;
        let out: *mut u64 = &mut handle;
        let r = allocate_hooked::<sym::MemCreate>(
            cx.hooked::<sym::MemCreate>(),
            out,
            Space::Handle,
            at_location(size, &prop),
            // SAFETY: the fake driver's function with valid pointers.
            |real| unsafe { real(out, size, &prop, 0) },
        );
        (r, handle)
    }

    #[test]
    fn created_memory_is_charged_on_devices_and_released_by_its_handle() {
        let cx = Cx::new(config(64 * MIB), "mem13");
        let (r, on_device) = create(&cx, 4 << 20, CU_MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(used(&cx), 4 * MIB);
        // A host location is not the device's memory.
        let (_, on_host) = create(&cx, 4 << 20, 2);
        assert_eq!(used(&cx), 4 * MIB);
        for handle in [on_device, on_host] {
            let r = free_hooked::<sym::MemRelease>(
                cx.hooked::<sym::MemRelease>(),
                handle,
                Space::Handle,
                // SAFETY: the fake driver's function.
                |real| unsafe { real(handle) },
            );
            assert_eq!(r, CUDA_SUCCESS);
        }
        assert_eq!(used(&cx), 0);
        // A handle is not an address: freeing it as one releases nothing.
        let (_, h) = create(&cx, 2 << 20, CU_MEM_LOCATION_TYPE_DEVICE);
        free(&cx, h);
        assert_eq!(used(&cx), 2 * MIB);
    }
}
