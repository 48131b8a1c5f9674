//! Typed wrappers of the memory APIs: allocation (pointer, pitched, managed, async, from a pool),
//! free, the virtual memory calls (create, reserve, map, set access, unmap, release) and mem info.

use std::ffi::{c_int, c_uint, c_void};

use super::{CUresult, Driver, Handle, MemAllocationProp};

/// `CUmemAccessDesc`.
#[repr(C)]
struct MemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

impl Driver {
    pub fn mem_alloc(&self, size: usize) -> (Option<CUresult>, u64) {
        let mut p = 0u64;
        (
            call!(self, "cuMemAlloc_v2", fn(*mut u64, usize), &mut p, size),
            p,
        )
    }

    /// `cuMemAllocPitch_v2`: result, pointer, pitch.
    pub fn mem_alloc_pitch(&self, width: usize, height: usize) -> (Option<CUresult>, u64, usize) {
        let (mut p, mut pitch) = (0u64, 0usize);
        let r = call!(
            self,
            "cuMemAllocPitch_v2",
            fn(*mut u64, *mut usize, usize, usize, c_uint),
            &mut p,
            &mut pitch,
            width,
            height,
            4
        );
        (r, p, pitch)
    }

    pub fn mem_alloc_managed(&self, size: usize) -> (Option<CUresult>, u64) {
        let mut p = 0u64;
        (
            call!(
                self,
                "cuMemAllocManaged",
                fn(*mut u64, usize, c_uint),
                &mut p,
                size,
                1
            ),
            p,
        )
    }

    /// `cuMemAllocAsync` or `_ptsz` on the NULL stream.
    pub fn mem_alloc_async(&self, name: &str, size: usize) -> (Option<CUresult>, u64) {
        let mut p = 0u64;
        (
            call!(
                self,
                name,
                fn(*mut u64, usize, Handle),
                &mut p,
                size,
                std::ptr::null_mut()
            ),
            p,
        )
    }

    /// `cuMemAllocFromPoolAsync` or `_ptsz` on the NULL stream.
    pub fn mem_alloc_from_pool(
        &self,
        name: &str,
        size: usize,
        pool: Handle,
    ) -> (Option<CUresult>, u64) {
        let mut p = 0u64;
        (
            call!(
                self,
                name,
                fn(*mut u64, usize, Handle, Handle),
                &mut p,
                size,
                pool,
                std::ptr::null_mut()
            ),
            p,
        )
    }

    pub fn mem_free(&self, ptr: u64) -> Option<CUresult> {
        call!(self, "cuMemFree_v2", fn(u64), ptr)
    }

    /// `cuMemFreeAsync` or `_ptsz` on the NULL stream.
    pub fn mem_free_async(&self, name: &str, ptr: u64) -> Option<CUresult> {
        call!(self, name, fn(u64, Handle), ptr, std::ptr::null_mut())
    }

    pub fn default_mem_pool(&self) -> (Option<CUresult>, Handle) {
        let mut p: Handle = std::ptr::null_mut();
        (
            call!(
                self,
                "cuDeviceGetDefaultMemPool",
                fn(*mut Handle, c_int),
                &mut p,
                0
            ),
            p,
        )
    }

    pub fn allocation_granularity(&self) -> (Option<CUresult>, usize) {
        let mut g = 0usize;
        let prop = MemAllocationProp::device(0);
        let r = call!(
            self,
            "cuMemGetAllocationGranularity",
            fn(*mut usize, *const MemAllocationProp, c_int),
            &mut g,
            &prop,
            0
        );
        (r, g)
    }

    pub fn mem_create(&self, size: usize) -> (Option<CUresult>, u64) {
        self.mem_create_with(size, MemAllocationProp::device(0))
    }

    /// `cuMemCreate` of `size` bytes on device 0 that may be exported as a POSIX file
    /// descriptor (`requestedHandleTypes` = 1).
    pub fn mem_create_shareable(&self, size: usize) -> (Option<CUresult>, u64) {
        let mut prop = MemAllocationProp::device(0);
        prop.requested_handle_types = 1;
        self.mem_create_with(size, prop)
    }

    fn mem_create_with(&self, size: usize, prop: MemAllocationProp) -> (Option<CUresult>, u64) {
        let mut h = 0u64;
        (
            call!(
                self,
                "cuMemCreate",
                fn(*mut u64, usize, *const MemAllocationProp, u64),
                &mut h,
                size,
                &prop,
                0
            ),
            h,
        )
    }

    /// `cuMemRetainAllocationHandle` of the address `ptr`.
    pub fn mem_retain(&self, ptr: u64) -> (Option<CUresult>, u64) {
        let mut h = 0u64;
        let r = call!(
            self,
            "cuMemRetainAllocationHandle",
            fn(*mut u64, *mut c_void),
            &mut h,
            ptr as *mut c_void
        );
        (r, h)
    }

    /// `cuMemExportToShareableHandle` of `handle` as a POSIX file descriptor.
    pub fn mem_export_fd(&self, handle: u64) -> (Option<CUresult>, c_int) {
        let mut fd: c_int = -1;
        let r = call!(
            self,
            "cuMemExportToShareableHandle",
            fn(*mut c_void, u64, c_int, u64),
            (&raw mut fd).cast(),
            handle,
            1,
            0
        );
        (r, fd)
    }

    pub fn mem_release(&self, handle: u64) -> Option<CUresult> {
        call!(self, "cuMemRelease", fn(u64), handle)
    }

    pub fn address_reserve(&self, size: usize) -> (Option<CUresult>, u64) {
        let mut p = 0u64;
        (
            call!(
                self,
                "cuMemAddressReserve",
                fn(*mut u64, usize, usize, u64, u64),
                &mut p,
                size,
                0,
                0,
                0
            ),
            p,
        )
    }

    pub fn address_free(&self, ptr: u64, size: usize) -> Option<CUresult> {
        call!(self, "cuMemAddressFree", fn(u64, usize), ptr, size)
    }

    pub fn mem_map(&self, ptr: u64, size: usize, handle: u64) -> Option<CUresult> {
        call!(
            self,
            "cuMemMap",
            fn(u64, usize, usize, u64, u64),
            ptr,
            size,
            0,
            handle,
            0
        )
    }

    pub fn mem_unmap(&self, ptr: u64, size: usize) -> Option<CUresult> {
        call!(self, "cuMemUnmap", fn(u64, usize), ptr, size)
    }

    /// Read-write access for device 0.
    pub fn mem_set_access(&self, ptr: u64, size: usize) -> Option<CUresult> {
        let desc = MemAccessDesc {
            location_type: 1,
            location_id: 0,
            flags: 3,
        };
        call!(
            self,
            "cuMemSetAccess",
            fn(u64, usize, *const MemAccessDesc, usize),
            ptr,
            size,
            &desc,
            1
        )
    }

    /// `cuMemcpyHtoD_v2` of all of `src` to `dst`.
    pub fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Option<CUresult> {
        call!(
            self,
            "cuMemcpyHtoD_v2",
            fn(u64, *const c_void, usize),
            dst,
            src.as_ptr().cast(),
            src.len()
        )
    }

    /// `cuMemcpyDtoH_v2` of `dst.len()` bytes from `src`.
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Option<CUresult> {
        call!(
            self,
            "cuMemcpyDtoH_v2",
            fn(*mut c_void, u64, usize),
            dst.as_mut_ptr().cast(),
            src,
            dst.len()
        )
    }

    /// `cuMemGetInfo_v2`: result, free, total.
    pub fn mem_get_info(&self) -> (Option<CUresult>, usize, usize) {
        let (mut f, mut t) = (0usize, 0usize);
        (
            call!(
                self,
                "cuMemGetInfo_v2",
                fn(*mut usize, *mut usize),
                &mut f,
                &mut t
            ),
            f,
            t,
        )
    }
}
