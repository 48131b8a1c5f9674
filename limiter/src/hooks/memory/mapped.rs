//! The virtual memory API's calls on the memory the application creates (`cuMemUnmap`,
//! `cuMemSetAccess`, `cuMemRetainAllocationHandle`, `cuMemGetAllocationPropertiesFromHandle`,
//! `cuMemExportToShareableHandle`, `cuMemMapArrayAsync`): counted and timed. With the in-process freeze on, the
//! application's handles are translated to the driver's and the mappings and access recorded
//! (`runtime::own_freeze::created`); off, each is one branch and the driver's call unchanged.

use std::ffi::{c_int, c_void};

use crate::{
    hooks::gate::passthrough,
    platform::{cuda::*, driver::sym},
    runtime::{self, own_freeze::OwnFreeze, state::State},
};

/// The in-process freeze's state and the bound driver, when the path is on.
#[inline]
pub(super) fn own_freeze() -> Option<(&'static OwnFreeze, &'static State)> {
    let state = runtime::get().state()?;
    Some((state.own_freeze?, state))
}

/// Republishes the in-process freeze's answer with the bytes that can move now (after a change
/// of the created memory's mappings, access or handles).
pub(super) fn republish(own: &OwnFreeze) {
    if let Some(process) = runtime::get().process() {
        own.republish(process.region_slot());
    }
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemUnmap`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    passthrough::<sym::MemUnmap>(|real| {
        // SAFETY: forwards the caller's arguments unchanged.
        let r = unsafe { real(ptr, size) };
        if r == CUDA_SUCCESS
            && let Some((own, _)) = own_freeze()
        {
            own.created.unmapped(ptr, size);
            republish(own);
        }
        r
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemSetAccess`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    passthrough::<sym::MemSetAccess>(|real| {
        // SAFETY: forwards the caller's arguments unchanged.
        let r = unsafe { real(ptr, size, desc, count) };
        if r == CUDA_SUCCESS
            && !desc.is_null()
            && count > 0
            && let Some((own, _)) = own_freeze()
        {
            // SAFETY: the driver read `count` descriptors at `desc` and accepted them.
            let descs = unsafe { std::slice::from_raw_parts(desc, count) };
            own.created.access_set(ptr, size, descs);
            republish(own);
        }
        r
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemRetainAllocationHandle`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    passthrough::<sym::MemRetainAllocationHandle>(|real| {
        if !handle.is_null()
            && let Some((own, _)) = own_freeze()
            && let Some(h) = own.created.retain(addr as CUdeviceptr)
        {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { handle.write(h) };
            return CUDA_SUCCESS;
        }
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { real(handle, addr) }
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemGetAllocationPropertiesFromHandle`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    passthrough::<sym::MemGetAllocationPropertiesFromHandle>(|real| {
        let handle = own_freeze()
            .and_then(|(own, _)| own.created.real(handle, false))
            .unwrap_or(handle);
        // SAFETY: the caller's out-pointer, with the driver's handle behind the caller's.
        unsafe { real(prop, handle) }
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuMemExportToShareableHandle`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_int,
    flags: u64,
) -> CUresult {
    passthrough::<sym::MemExportToShareableHandle>(|real| {
        let translated = own_freeze().and_then(|(own, _)| {
            // Marked shared before the export: another process may map it from now on.
            let h = own.created.real(handle, true)?;
            republish(own);
            Some(h)
        });
        // SAFETY: the caller's arguments, with the driver's handle behind the caller's.
        unsafe { real(shareable, translated.unwrap_or(handle), handle_type, flags) }
    })
}

/// Maps memory into sparse arrays' tiles. With the path on, a tile mapped to memory the
/// application created names the limiter's handle: the list goes to the driver as a copy with
/// the driver's handles, and that memory stays on the GPU from then on (arrays are not followed).
///
/// # Safety
/// The caller follows the contract of the driver's `cuMemMapArrayAsync`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemMapArrayAsync(
    list: *mut CUarrayMapInfo,
    count: std::ffi::c_uint,
    stream: CUstream,
) -> CUresult {
    passthrough::<sym::MemMapArrayAsync>(|real| {
        let Some((own, _)) = own_freeze().filter(|_| !list.is_null() && count > 0) else {
            // SAFETY: forwards the caller's arguments unchanged.
            return unsafe { real(list, count, stream) };
        };
        // SAFETY: the caller's list of `count` entries (the driver reads them as much).
        let infos = unsafe { std::slice::from_raw_parts(list, count as usize) };
        let mut copy = infos.to_vec();
        let mut ours = false;
        for i in copy
            .iter_mut()
            .filter(|i| i.mem_handle_type == CU_MEM_HANDLE_TYPE_GENERIC)
        {
            if let Some(h) = own.created.real_for_array(i.mem_handle) {
                i.mem_handle = h;
                ours = true;
            }
        }
        if !ours {
            // SAFETY: forwards the caller's arguments unchanged.
            return unsafe { real(list, count, stream) };
        }
        republish(own);
        // SAFETY: the caller's entries with the driver's handles, alive for the call (the
        // driver reads the list when the call is made, as it reads every argument).
        unsafe { real(copy.as_mut_ptr(), count, stream) }
    })
}
