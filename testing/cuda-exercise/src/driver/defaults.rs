//! [`Driver::call_default`]: every traced entry point called once with harmless arguments, and the
//! size argument it passes.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{CUresult, DEFAULT_GRANULARITY, Driver, Handle, MemAllocationProp};

/// `CUlaunchConfig`.
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

impl Driver {
    /// The size argument that [`Driver::call_default`] passes to `name` when asked for `size`.
    pub fn default_size(name: &str, size: usize) -> usize {
        match name {
            "cuMemCreate" | "cuMemMap" | "cuMemUnmap" => {
                size.max(1).div_ceil(DEFAULT_GRANULARITY) * DEFAULT_GRANULARITY
            }
            _ => size,
        }
    }

    /// Calls a traced entry point once with harmless arguments: valid out-pointers and buffers,
    /// NULL handles, device pointer 0, [`Driver::default_size`] bytes. Returns `None` when the
    /// library does not export `name`, and `Err` when this program does not know `name`.
    pub fn call_default(&self, name: &str, size: usize) -> Result<Option<CUresult>, String> {
        let size = Driver::default_size(name, size);
        let null: Handle = std::ptr::null_mut();
        let st = self.stream;
        let mut out: u64 = 0;
        let mut handle: Handle = std::ptr::null_mut();
        let mut pitch: usize = 0;
        let mut host = vec![0u8; size.max(1)];
        let hp = host.as_mut_ptr().cast::<c_void>();
        let prop = MemAllocationProp::device(0);
        let cfg = LaunchConfig {
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
            stream: null,
            attrs: null,
            num_attrs: 0,
        };
        let o = &mut out as *mut u64;
        let r = match name {
            "cuMemAlloc_v2" => call!(self, name, fn(*mut u64, usize), o, size),
            "cuMemAllocPitch_v2" => {
                call!(
                    self,
                    name,
                    fn(*mut u64, *mut usize, usize, usize, c_uint),
                    o,
                    &mut pitch,
                    size,
                    1,
                    4
                )
            }
            "cuMemAllocManaged" => call!(self, name, fn(*mut u64, usize, c_uint), o, size, 1),
            "cuMemAllocAsync" | "cuMemAllocAsync_ptsz" => {
                call!(self, name, fn(*mut u64, usize, Handle), o, size, st)
            }
            "cuMemAllocFromPoolAsync" | "cuMemAllocFromPoolAsync_ptsz" => {
                call!(
                    self,
                    name,
                    fn(*mut u64, usize, Handle, Handle),
                    o,
                    size,
                    null,
                    st
                )
            }
            "cuMemCreate" => call!(
                self,
                name,
                fn(*mut u64, usize, *const MemAllocationProp, u64),
                o,
                size,
                &prop,
                0
            ),
            "cuMemMap" => call!(
                self,
                name,
                fn(u64, usize, usize, u64, u64),
                0,
                size,
                0,
                0,
                0
            ),
            "cuStreamWriteValue32_v2" | "cuStreamWriteValue32_v2_ptsz" => {
                call!(self, name, fn(Handle, u64, c_uint, c_uint), st, 0, 0, 0)
            }
            "cuStreamWriteValue64_v2" | "cuStreamWriteValue64_v2_ptsz" => {
                call!(self, name, fn(Handle, u64, u64, c_uint), st, 0, 0, 0)
            }
            "cuMemsetD8_v2" | "cuMemsetD8_v2_ptds" => {
                call!(self, name, fn(u64, u8, usize), 0, 0, size)
            }
            "cuMemsetD16_v2" | "cuMemsetD16_v2_ptds" => {
                call!(self, name, fn(u64, u16, usize), 0, 0, size / 2)
            }
            "cuMemsetD32_v2" | "cuMemsetD32_v2_ptds" => {
                call!(self, name, fn(u64, c_uint, usize), 0, 0, size / 4)
            }
            "cuMemsetD8Async" | "cuMemsetD8Async_ptsz" => {
                call!(self, name, fn(u64, u8, usize, Handle), 0, 0, size, st)
            }
            "cuMemsetD32Async" | "cuMemsetD32Async_ptsz" => {
                call!(
                    self,
                    name,
                    fn(u64, c_uint, usize, Handle),
                    0,
                    0,
                    size / 4,
                    st
                )
            }
            "cuMemsetD2D8_v2" | "cuMemsetD2D8_v2_ptds" => {
                call!(
                    self,
                    name,
                    fn(u64, usize, u8, usize, usize),
                    0,
                    size,
                    0,
                    size,
                    1
                )
            }
            "cuMemsetD2D32Async" | "cuMemsetD2D32Async_ptsz" => {
                call!(
                    self,
                    name,
                    fn(u64, usize, c_uint, usize, usize, Handle),
                    0,
                    size,
                    0,
                    size / 4,
                    1,
                    st
                )
            }
            // A descriptor of nothing (every field zero: no rows), as large as CUDA_MEMCPY3D_PEER.
            "cuMemcpy2D_v2" | "cuMemcpy2D_v2_ptds" | "cuMemcpy3D_v2" | "cuMemcpy3D_v2_ptds" => {
                let desc = [0u64; 32];
                call!(self, name, fn(*const c_void), desc.as_ptr().cast())
            }
            "cuMemcpy2DAsync_v2" | "cuMemcpy2DAsync_v2_ptsz" => {
                let desc = [0u64; 32];
                call!(
                    self,
                    name,
                    fn(*const c_void, Handle),
                    desc.as_ptr().cast(),
                    st
                )
            }
            "cuMemFree_v2" => call!(self, name, fn(u64), 0),
            "cuMemFreeAsync" | "cuMemFreeAsync_ptsz" => call!(self, name, fn(u64, Handle), 0, st),
            "cuMemRelease" => call!(self, name, fn(u64), 0),
            "cuMemUnmap" => call!(self, name, fn(u64, usize), 0, size),
            "cuStreamSynchronize" | "cuStreamSynchronize_ptsz" => call!(self, name, fn(Handle), st),
            "cuEventSynchronize" => call!(self, name, fn(Handle), null),
            "cuCtxSynchronize" => call!(self, name, fn()),
            "cuStreamWaitEvent" | "cuStreamWaitEvent_ptsz" => {
                call!(self, name, fn(Handle, Handle, c_uint), st, null, 0)
            }
            "cuMemcpy" | "cuMemcpy_ptds" | "cuMemcpyDtoD_v2" | "cuMemcpyDtoD_v2_ptds" => {
                call!(self, name, fn(u64, u64, usize), 0, 0, size)
            }
            "cuMemcpyAsync"
            | "cuMemcpyAsync_ptsz"
            | "cuMemcpyDtoDAsync_v2"
            | "cuMemcpyDtoDAsync_v2_ptsz" => {
                call!(self, name, fn(u64, u64, usize, Handle), 0, 0, size, st)
            }
            "cuMemcpyHtoD_v2" | "cuMemcpyHtoD_v2_ptds" => {
                call!(self, name, fn(u64, *const c_void, usize), 0, hp, size)
            }
            "cuMemcpyDtoH_v2" | "cuMemcpyDtoH_v2_ptds" => {
                call!(self, name, fn(*mut c_void, u64, usize), hp, 0, size)
            }
            "cuMemcpyHtoDAsync_v2" | "cuMemcpyHtoDAsync_v2_ptsz" => {
                call!(
                    self,
                    name,
                    fn(u64, *const c_void, usize, Handle),
                    0,
                    hp,
                    size,
                    st
                )
            }
            "cuMemcpyDtoHAsync_v2" | "cuMemcpyDtoHAsync_v2_ptsz" => {
                call!(
                    self,
                    name,
                    fn(*mut c_void, u64, usize, Handle),
                    hp,
                    0,
                    size,
                    st
                )
            }
            "cuMemcpyPeer" => call!(
                self,
                name,
                fn(u64, Handle, u64, Handle, usize),
                0,
                null,
                0,
                null,
                size
            ),
            "cuMemcpyPeerAsync" => {
                call!(
                    self,
                    name,
                    fn(u64, Handle, u64, Handle, usize, Handle),
                    0,
                    null,
                    0,
                    null,
                    size,
                    st
                )
            }
            "cuLaunchKernel" | "cuLaunchKernel_ptsz" => call!(
                self,
                name,
                fn(
                    Handle,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    Handle,
                    *mut Handle,
                    *mut Handle,
                ),
                null,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                null,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            "cuLaunchKernelEx" | "cuLaunchKernelEx_ptsz" => call!(
                self,
                name,
                fn(*const LaunchConfig, Handle, *mut Handle, *mut Handle),
                &cfg,
                null,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            "cuLaunchCooperativeKernel" | "cuLaunchCooperativeKernel_ptsz" => call!(
                self,
                name,
                fn(
                    Handle,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    Handle,
                    *mut Handle,
                ),
                null,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                null,
                std::ptr::null_mut()
            ),
            "cuGraphLaunch" | "cuGraphLaunch_ptsz" => {
                call!(self, name, fn(Handle, Handle), null, st)
            }
            "cuInit" => call!(self, name, fn(c_uint), 0),
            "cuCtxCreate_v2" => call!(
                self,
                name,
                fn(*mut Handle, c_uint, c_int),
                &mut handle,
                0,
                0
            ),
            "cuCtxCreate_v3" => {
                call!(
                    self,
                    name,
                    fn(*mut Handle, *mut c_void, c_int, c_uint, c_int),
                    &mut handle,
                    null,
                    0,
                    0,
                    0
                )
            }
            "cuCtxCreate_v4" => call!(
                self,
                name,
                fn(*mut Handle, *mut c_void, c_uint, c_int),
                &mut handle,
                null,
                0,
                0
            ),
            "cuDevicePrimaryCtxRetain" => call!(self, name, fn(*mut Handle, c_int), &mut handle, 0),
            "cuCtxDestroy_v2" => call!(self, name, fn(Handle), null),
            "cuMemGetInfo_v2" => {
                let (mut f, mut t) = (0usize, 0usize);
                call!(self, name, fn(*mut usize, *mut usize), &mut f, &mut t)
            }
            "cuDeviceTotalMem_v2" => {
                let mut t = 0usize;
                call!(self, name, fn(*mut usize, c_int), &mut t, 0)
            }
            "cuCtxSynchronize_v2" => call!(self, name, fn(Handle), null),
            "cuMemcpyPeer_ptds" => {
                call!(
                    self,
                    name,
                    fn(u64, Handle, u64, Handle, usize),
                    0,
                    null,
                    0,
                    null,
                    size
                )
            }
            "cuMemcpyPeerAsync_ptsz" => {
                call!(
                    self,
                    name,
                    fn(u64, Handle, u64, Handle, usize, Handle),
                    0,
                    null,
                    0,
                    null,
                    size,
                    st
                )
            }
            "cuMemcpyBatchAsync" | "cuMemcpyBatchAsync_ptsz" => {
                // An empty batch: no copies, nothing dereferenced.
                let mut fail = 0usize;
                call!(
                    self,
                    name,
                    fn(
                        *mut u64,
                        *mut u64,
                        *mut usize,
                        usize,
                        Handle,
                        *mut usize,
                        usize,
                        *mut usize,
                        Handle,
                    ),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    null,
                    std::ptr::null_mut(),
                    0,
                    &mut fail,
                    null
                )
            }
            "cuMemcpyBatchAsync_v2" | "cuMemcpyBatchAsync_v2_ptsz" => call!(
                self,
                name,
                fn(*mut u64, *mut u64, *mut usize, usize, Handle, *mut usize, usize, Handle),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                null,
                std::ptr::null_mut(),
                0,
                null
            ),
            "cuLaunchHostFunc" | "cuLaunchHostFunc_ptsz" => {
                extern "C" fn nothing(_: *mut c_void) {}
                call!(
                    self,
                    name,
                    fn(Handle, extern "C" fn(*mut c_void), *mut c_void),
                    st,
                    nothing,
                    std::ptr::null_mut()
                )
            }
            "cuMemPoolCreate" => {
                // Zeroed properties: an invalid allocation type, so no pool is created.
                let props = [0u8; 88];
                call!(
                    self,
                    name,
                    fn(*mut Handle, *const u8),
                    &mut handle,
                    props.as_ptr()
                )
            }
            "cuMemPoolDestroy" => call!(self, name, fn(Handle), null),
            "cuMemPoolTrimTo" => call!(self, name, fn(Handle, usize), null, size),
            "cuGetProcAddress" => {
                let mut pfn: Handle = null;
                call!(
                    self,
                    name,
                    fn(*const c_char, *mut Handle, c_int, u64),
                    c"cuInit".as_ptr(),
                    &mut pfn,
                    12000,
                    0
                )
            }
            "cuGetProcAddress_v2" => {
                let (mut pfn, mut status): (Handle, c_int) = (null, 0);
                call!(
                    self,
                    name,
                    fn(*const c_char, *mut Handle, c_int, u64, *mut c_int),
                    c"cuInit".as_ptr(),
                    &mut pfn,
                    12000,
                    0,
                    &mut status
                )
            }
            _ => return Err(format!("cuda-exercise does not know how to call {name}")),
        };
        drop(host);
        Ok(r)
    }
}
