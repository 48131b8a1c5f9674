//! The one place where cuda-exercise touches unsafe code: loading a driver library with
//! `dlopen`, resolving entry points with `dlsym` and calling them with the C signatures of
//! CUDA 12's `cuda.h`. Everything outside this module is safe.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type Handle = *mut c_void;

/// `CUmemAllocationProp` (CUDA 12).
#[repr(C)]
#[derive(Clone, Copy)]
struct MemAllocationProp {
    type_: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

impl MemAllocationProp {
    /// Pinned device memory on `device`.
    fn device(device: c_int) -> MemAllocationProp {
        MemAllocationProp {
            type_: 1,
            requested_handle_types: 0,
            location_type: 1,
            location_id: device,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct MemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

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

/// Granularity used for `cuMemCreate`, `cuMemMap` and `cuMemUnmap` sizes in default calls.
pub const DEFAULT_GRANULARITY: usize = 2 << 20;

/// A loaded driver library. The handle is never closed: entry points stay valid for the life of
/// the process.
pub struct Driver {
    handle: *mut c_void,
    /// The stream [`Driver::call_default`] passes to APIs that take one (NULL unless
    /// [`Driver::create_stream`] made one).
    stream: Handle,
}

/// Calls the entry point `$name` with signature `fn($t...) -> CUresult`; `None` if the library
/// does not export it.
macro_rules! call {
    ($self:expr, $name:expr, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {{
        match $self.symbol($name) {
            None => None,
            Some(p) => {
                // SAFETY: `p` is the address of the exported function `$name` of a CUDA driver
                // library, whose C signature in cuda.h (CUDA 12) is the one given here.
                let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p) };
                // SAFETY: every pointer argument passed at the call sites of this macro points to
                // live memory of the type and size the API reads or writes (or is NULL where the
                // API allows it), and handles are NULL or were returned by the same library.
                Some(unsafe { f($($a),*) })
            }
        }
    }};
}

impl Driver {
    /// Loads `path` (a file path or a soname searched the normal way) with `RTLD_NOW | RTLD_LOCAL`.
    pub fn open(path: &str) -> Result<Driver, String> {
        let c = CString::new(path).map_err(|_| format!("library path {path:?} contains NUL"))?;
        // SAFETY: `c` is a valid NUL-terminated string; dlopen runs the library's initialisers,
        // which is what loading a driver library means.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a valid C string owned by libc.
            let err = unsafe { libc::dlerror() };
            let msg = if err.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: non-null C string from dlerror, copied before any other dl call.
                unsafe { CStr::from_ptr(err) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("dlopen({path}): {msg}"));
        }
        Ok(Driver {
            handle,
            stream: std::ptr::null_mut(),
        })
    }

    /// The address of an exported entry point.
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: `handle` is a live dlopen handle and `c` a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// Creates a stream with `cuStreamCreate` for later calls to use; returns its handle.
    pub fn create_stream(&mut self) -> Result<u64, String> {
        let mut h: Handle = std::ptr::null_mut();
        match call!(self, "cuStreamCreate", fn(*mut Handle, c_uint), &mut h, 0) {
            Some(0) => {
                self.stream = h;
                Ok(h as u64)
            }
            r => Err(format!("cuStreamCreate: {r:?}")),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.symbol(name).is_some()
    }

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

    pub fn init(&self) -> Option<CUresult> {
        call!(self, "cuInit", fn(c_uint), 0)
    }

    /// `cuDeviceGet` + `cuDevicePrimaryCtxRetain` + `cuCtxSetCurrent` for device 0.
    pub fn primary_context(
        &self,
        rec: &mut impl FnMut(&str, Option<CUresult>, u64),
    ) -> Result<(), CUresult> {
        let mut dev: c_int = 0;
        let r = call!(self, "cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 0);
        rec("cuDeviceGet", r, 0);
        ok(r)?;
        let mut ctx: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Handle, c_int),
            &mut ctx,
            dev
        );
        rec("cuDevicePrimaryCtxRetain", r, 0);
        ok(r)?;
        let r = call!(self, "cuCtxSetCurrent", fn(Handle), ctx);
        rec("cuCtxSetCurrent", r, 0);
        ok(r)
    }

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
        let mut h = 0u64;
        let prop = MemAllocationProp::device(0);
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

    /// `cuModuleLoadData(image)` + `cuModuleGetFunction(name)`: the result of the last call
    /// made and the function.
    pub fn function_from_image(&self, image: &[u8], name: &str) -> (Option<CUresult>, Handle) {
        let Ok(cname) = CString::new(name) else {
            return (Some(1), std::ptr::null_mut());
        };
        let mut module: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuModuleLoadData",
            fn(*mut Handle, *const c_void),
            &mut module,
            image.as_ptr().cast()
        );
        if r != Some(0) {
            return (r, std::ptr::null_mut());
        }
        let mut f: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuModuleGetFunction",
            fn(*mut Handle, Handle, *const c_char),
            &mut f,
            module,
            cname.as_ptr()
        );
        (r, f)
    }

    /// `cuLaunchKernel(f)` with a 1x1x1 grid and block on the NULL stream, no parameters.
    pub fn launch_kernel(&self, f: Handle) -> Option<CUresult> {
        let null: Handle = std::ptr::null_mut();
        let none: *mut Handle = std::ptr::null_mut();
        call!(
            self,
            "cuLaunchKernel",
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
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null,
            none,
            none
        )
    }

    pub fn ctx_synchronize(&self) -> Option<CUresult> {
        call!(self, "cuCtxSynchronize", fn())
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

    /// `cuGetProcAddress_v2` (or `cuGetProcAddress` when `v2` is false): result, address,
    /// symbol status (v2 only).
    pub fn get_proc_address(
        &self,
        symbol: &str,
        version: c_int,
        flags: u64,
        v2: bool,
    ) -> Result<(Option<CUresult>, usize, c_int), String> {
        let c = CString::new(symbol).map_err(|_| format!("symbol {symbol:?} contains NUL"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        let r = if v2 {
            call!(
                self,
                "cuGetProcAddress_v2",
                fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int),
                c.as_ptr(),
                &mut p,
                version,
                flags,
                &mut status
            )
        } else {
            call!(
                self,
                "cuGetProcAddress",
                fn(*const c_char, *mut *mut c_void, c_int, u64),
                c.as_ptr(),
                &mut p,
                version,
                flags
            )
        };
        Ok((r, p as usize, status))
    }
}

fn ok(r: Option<CUresult>) -> Result<(), CUresult> {
    match r {
        Some(0) => Ok(()),
        Some(e) => Err(e),
        None => Err(-1),
    }
}
