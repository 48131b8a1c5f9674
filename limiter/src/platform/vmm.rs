//! The driver calls of the in-process freeze (`runtime::own_freeze`): the virtual memory API
//! behind the allocations it backs, the copies to and from host memory (`host_memory`), and the
//! contexts those run in. Each is one call of the bound driver's real
//! function (never a hook), returning the driver's code as the error.

use std::ffi::c_void;

use super::{
    cuda::*,
    driver::{Driver, sym},
};

/// A driver call failed with this code (or the driver lacks the function:
/// `CUDA_ERROR_NOT_FOUND`).
pub(crate) type Code = CUresult;

fn check(r: CUresult) -> Result<(), Code> {
    if r == CUDA_SUCCESS { Ok(()) } else { Err(r) }
}

/// The device memory of one allocation: device ordinal, as the virtual memory API takes it.
fn device_prop(device: CUdevice) -> CUmemAllocationPropFull {
    CUmemAllocationPropFull {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        location: CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        ..CUmemAllocationPropFull::default()
    }
}

impl Driver {
    fn need<S: super::driver::Symbol>(&self) -> Result<S::Fn, Code> {
        self.get::<S>().ok_or(CUDA_ERROR_NOT_FOUND)
    }

    /// The allocation granularity of `device` (`cuMemGetAllocationGranularity`, minimum).
    pub(crate) fn vmm_granularity(&self, device: CUdevice) -> Result<u64, Code> {
        let f = self.need::<sym::MemGetAllocationGranularity>()?;
        let prop = device_prop(device);
        let mut g = 0usize;
        // SAFETY: valid out-pointer and a whole property struct; option 0 is the minimum.
        check(unsafe { f(&mut g, &prop, 0) })?;
        Ok(g as u64)
    }

    /// Reserves `size` bytes of device address space aligned to `align`.
    pub(crate) fn vmm_reserve(&self, size: u64, align: u64) -> Result<CUdeviceptr, Code> {
        let f = self.need::<sym::MemAddressReserve>()?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address, no flags.
        check(unsafe { f(&mut p, size as usize, align as usize, 0, 0) })?;
        Ok(p)
    }

    /// Frees a reservation made by [`Driver::vmm_reserve`] (nothing mapped in it).
    pub(crate) fn vmm_address_free(&self, ptr: CUdeviceptr, size: u64) -> Result<(), Code> {
        let f = self.need::<sym::MemAddressFree>()?;
        // SAFETY: a reservation of exactly this range.
        check(unsafe { f(ptr, size as usize) })
    }

    /// Creates `size` bytes of physical memory on `device`.
    pub(crate) fn vmm_create(&self, device: CUdevice, size: u64) -> Result<u64, Code> {
        let f = self.need::<sym::MemCreate>()?;
        let prop = device_prop(device);
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and a whole property struct; no flags.
        check(unsafe { f(&mut h, size as usize, (&raw const prop).cast(), 0) })?;
        Ok(h)
    }

    /// Maps `handle` at `ptr` and lets `device` read and write it.
    pub(crate) fn vmm_map(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        handle: u64,
        device: CUdevice,
    ) -> Result<(), Code> {
        let map = self.need::<sym::MemMap>()?;
        let access = self.need::<sym::MemSetAccess>()?;
        // SAFETY: a reserved range of `size` bytes and a handle of that size, offset 0.
        check(unsafe { map(ptr, size as usize, 0, handle, 0) })?;
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                kind: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range just mapped and one access descriptor.
        let r = check(unsafe { access(ptr, size as usize, &desc, 1) });
        if r.is_err() {
            let _ = self.vmm_unmap(ptr, size);
        }
        r
    }

    /// Creates `size` bytes of physical memory as `prop` says (the application's own properties,
    /// for memory it created and a thaw creates again).
    pub(crate) fn vmm_create_as(
        &self,
        prop: &CUmemAllocationPropFull,
        size: u64,
    ) -> Result<u64, Code> {
        let f = self.need::<sym::MemCreate>()?;
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and a whole property struct (a copy of the application's);
        // no flags.
        check(unsafe { f(&mut h, size as usize, (&raw const *prop).cast(), 0) })?;
        Ok(h)
    }

    /// Maps `size` bytes of `handle` from `offset` at `ptr` (no access set).
    pub(crate) fn vmm_map_range(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<(), Code> {
        let map = self.need::<sym::MemMap>()?;
        // SAFETY: a range the application reserved and mapped this way before; no flags.
        check(unsafe { map(ptr, size as usize, offset as usize, handle, 0) })
    }

    /// Sets the access of the mapped range at `ptr` as `descs` say.
    pub(crate) fn vmm_set_access(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        descs: &[CUmemAccessDesc],
    ) -> Result<(), Code> {
        if descs.is_empty() {
            return Ok(());
        }
        let access = self.need::<sym::MemSetAccess>()?;
        // SAFETY: a mapped range and `descs.len()` descriptors.
        check(unsafe { access(ptr, size as usize, descs.as_ptr(), descs.len()) })
    }

    /// Unmaps the range mapped at `ptr`.
    pub(crate) fn vmm_unmap(&self, ptr: CUdeviceptr, size: u64) -> Result<(), Code> {
        let f = self.need::<sym::MemUnmap>()?;
        // SAFETY: a range this process mapped.
        check(unsafe { f(ptr, size as usize) })
    }

    /// Releases physical memory created by [`Driver::vmm_create`] (its mappings are gone).
    pub(crate) fn vmm_release(&self, handle: u64) -> Result<(), Code> {
        let f = self.need::<sym::MemRelease>()?;
        // SAFETY: a handle this process created.
        check(unsafe { f(handle) })
    }

    /// Copies `size` bytes of device memory at `src` to host memory at `dst` (synchronous).
    pub(crate) fn copy_to_host(
        &self,
        dst: *mut c_void,
        src: CUdeviceptr,
        size: u64,
    ) -> Result<(), Code> {
        let f = self.need::<sym::MemcpyDtoHV2>()?;
        // SAFETY: `dst` holds `size` writable bytes; `src` is a mapped device range.
        check(unsafe { f(dst, src, size as usize) })
    }

    /// Queues a copy of `size` bytes of device memory at `src` to registered host memory at
    /// `dst` on the current context's default stream: the call returns once it is queued, and
    /// the copy is complete at the context's next synchronisation.
    pub(crate) fn copy_to_host_async(
        &self,
        dst: *mut c_void,
        src: CUdeviceptr,
        size: u64,
    ) -> Result<(), Code> {
        let f = self.need::<sym::MemcpyDtoHAsyncV2>()?;
        // SAFETY: `dst` holds `size` registered bytes that stay mapped until the caller's
        // synchronisation; `src` is a mapped device range; the null stream is the context's.
        check(unsafe { f(dst, src, size as usize, std::ptr::null_mut()) })
    }

    /// Copies `size` bytes of host memory at `src` to device memory at `dst` (synchronous for
    /// pinned host memory).
    pub(crate) fn copy_to_device(
        &self,
        dst: CUdeviceptr,
        src: *const c_void,
        size: u64,
    ) -> Result<(), Code> {
        let f = self.need::<sym::MemcpyHtoDV2>()?;
        // SAFETY: `src` holds `size` readable bytes; `dst` is a mapped device range.
        check(unsafe { f(dst, src, size as usize) })
    }

    /// The calling thread's current context (null: none).
    pub(crate) fn current_context(&self) -> CUcontext {
        let mut c: CUcontext = std::ptr::null_mut();
        if let Some(f) = self.get::<sym::CtxGetCurrent>() {
            // SAFETY: valid out-pointer.
            unsafe { f(&mut c) };
        }
        c
    }

    /// Makes `ctx` the calling thread's current context.
    pub(crate) fn set_current_context(&self, ctx: CUcontext) -> Result<(), Code> {
        let f = self.need::<sym::CtxSetCurrent>()?;
        // SAFETY: a context this process created (or null: none).
        check(unsafe { f(ctx) })
    }

    /// Waits for all work of the current context (`cuCtxSynchronize`), returning its code.
    pub(crate) fn synchronize_checked(&self) -> Result<(), Code> {
        let f = self.need::<sym::CtxSynchronize>()?;
        // SAFETY: takes no arguments.
        check(unsafe { f() })
    }

    /// Runs `f` with `ctx` current on the calling thread, then makes the thread's own context
    /// current again.
    pub(crate) fn with_context<T>(
        &self,
        ctx: CUcontext,
        f: impl FnOnce() -> Result<T, Code>,
    ) -> Result<T, Code> {
        let before = self.current_context();
        if before != ctx {
            self.set_current_context(ctx)?;
        }
        let r = f();
        if before != ctx {
            let _ = self.set_current_context(before);
        }
        r
    }
}
