//! The binding to the real CUDA driver: the only module that finds libcuda and its functions,
//! and the one that calls the driver on the limiter's own account.
//!
//! - The real `dlsym` is found with `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`, never through the
//!   public name `dlsym`, which this library exports itself (hami-core.md §1.1, vgpu-manager PR #89).
//! - libcuda is opened with `dlopen("libcuda.so.1" | $VGPU_REAL_LIBCUDA, RTLD_NOW | RTLD_NODELETE)`
//!   and every symbol of [`Sym`] is resolved once into a [`Driver`] table, lazily, by the first CUDA
//!   call (or the first `dlsym`/`cuGetProcAddress` answer that needs to be compared with the
//!   driver's pointers), never in a constructor: a process that does not use CUDA never loads the
//!   driver through us. The runtime keeps the one table; tests fill their own
//!   ([`Driver::from_fn`]) with stand-in functions.
//! - Each ABI variant (`_v2`, legacy, `_ptsz`) has its own slot, so a hook forwards to exactly the
//!   variant that was called and `cuGetProcAddress` answers can be matched by pointer.
//! - What the limiter's logic asks the driver itself (the current device, a pool's size, draining
//!   the device for the SM controller) is a method of the table here, so that the logic in
//!   `limiter_core` sees the driver only through its traits ([`PoolSizes`], [`sm::Env`]).

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint, c_void},
    mem,
    os::unix::ffi::OsStrExt,
    sync::atomic::AtomicU64,
};

use agent_common::api::ApiId;
use limiter_core::{
    config::REAL_LIBCUDA,
    gpu_time::{self, Query, StreamRef},
    pools::PoolSizes,
    sm,
};
use region::SmShare;

use super::{clock::Clock, cuda::*, os::Waker};

/// glibc's `dlsym`.
pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

pub(crate) type PfnInit = unsafe extern "C" fn(c_uint) -> CUresult;
pub(crate) type PfnGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub(crate) type PfnGetProcAddressV2 = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    u64,
    *mut CUdriverProcAddressQueryResult,
) -> CUresult;
pub(crate) type PfnMemAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnMemAllocPitch =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub(crate) type PfnMemAllocManaged =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub(crate) type PfnMemAllocAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub(crate) type PfnMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
pub(crate) type PfnMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub(crate) type PfnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub(crate) type PfnMemCreate = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    u64,
) -> CUresult;
pub(crate) type PfnMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub(crate) type PfnMemMap =
    unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
pub(crate) type PfnMemPoolCreate =
    unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemPoolProps) -> CUresult;
pub(crate) type PfnMemPoolDestroy = unsafe extern "C" fn(CUmemoryPool) -> CUresult;
pub(crate) type PfnMemPoolTrimTo = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
pub(crate) type PfnDevicePrimaryCtxRetain =
    unsafe extern "C" fn(*mut *mut c_void, CUdevice) -> CUresult;
pub(crate) type PfnCtxCreateV2 =
    unsafe extern "C" fn(*mut *mut c_void, c_uint, CUdevice) -> CUresult;
pub(crate) type PfnCtxCreateV3 =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_int, c_uint, CUdevice) -> CUresult;
pub(crate) type PfnCtxCreateV4 =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint, CUdevice) -> CUresult;
pub(crate) type PfnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub(crate) type PfnDeviceTotalMem = unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
pub(crate) type PfnLaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub(crate) type PfnLaunchKernelEx = unsafe extern "C" fn(
    *const CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub(crate) type PfnLaunchCooperativeKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;
pub(crate) type PfnGraphLaunch = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;
pub(crate) type PfnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub(crate) type PfnCtxSynchronize = unsafe extern "C" fn() -> CUresult;
pub(crate) type PfnMemPoolGetAttribute =
    unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
pub(crate) type PfnDeviceGetMemPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
pub(crate) type PfnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult;
pub(crate) type PfnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
pub(crate) type PfnCtxSynchronizeV2 = unsafe extern "C" fn(CUcontext) -> CUresult;
pub(crate) type PfnStreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
pub(crate) type PfnEventSynchronize = unsafe extern "C" fn(CUevent) -> CUresult;
pub(crate) type PfnStreamWaitEvent = unsafe extern "C" fn(CUstream, CUevent, c_uint) -> CUresult;
pub(crate) type PfnLaunchHostFunc =
    unsafe extern "C" fn(CUstream, CUhostFn, *mut c_void) -> CUresult;
/// `cuMemcpy` and `cuMemcpyDtoD_v2`: (destination, source, bytes).
pub(crate) type PfnMemcpy = unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnMemcpyAsync =
    unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
pub(crate) type PfnMemcpyHtoD = unsafe extern "C" fn(CUdeviceptr, *const c_void, usize) -> CUresult;
pub(crate) type PfnMemcpyHtoDAsync =
    unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
pub(crate) type PfnMemcpyDtoH = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnMemcpyDtoHAsync =
    unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
pub(crate) type PfnMemcpyPeer =
    unsafe extern "C" fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize) -> CUresult;
pub(crate) type PfnMemcpyPeerAsync = unsafe extern "C" fn(
    CUdeviceptr,
    CUcontext,
    CUdeviceptr,
    CUcontext,
    usize,
    CUstream,
) -> CUresult;
/// `cuMemcpyBatchAsync` (CUDA 12.8): (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
/// failIdx, stream).
pub(crate) type PfnMemcpyBatchAsync = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    CUstream,
) -> CUresult;
/// `cuMemcpyBatchAsync_v2` (CUDA 13): as `cuMemcpyBatchAsync` without `failIdx`.
pub(crate) type PfnMemcpyBatchAsyncV2 = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    CUstream,
) -> CUresult;

/// `cuMemcpy2D*`, `cuMemcpy3D*` (`CUDA_MEMCPY2D/3D/3D_PEER` descriptor), synchronous and
/// asynchronous.
pub(crate) type PfnMemcpyDesc = unsafe extern "C" fn(*const c_void) -> CUresult;
pub(crate) type PfnMemcpyDescAsync = unsafe extern "C" fn(*const c_void, CUstream) -> CUresult;
/// `cuMemsetD8/16/32` (`_v2`, `_v2_ptds`), their 2D and asynchronous (`_ptsz`) forms.
pub(crate) type PfnMemsetD8 = unsafe extern "C" fn(CUdeviceptr, u8, usize) -> CUresult;
pub(crate) type PfnMemsetD2D8 =
    unsafe extern "C" fn(CUdeviceptr, usize, u8, usize, usize) -> CUresult;
pub(crate) type PfnMemsetD8Async =
    unsafe extern "C" fn(CUdeviceptr, u8, usize, CUstream) -> CUresult;
pub(crate) type PfnMemsetD2D8Async =
    unsafe extern "C" fn(CUdeviceptr, usize, u8, usize, usize, CUstream) -> CUresult;
pub(crate) type PfnMemsetD16 = unsafe extern "C" fn(CUdeviceptr, u16, usize) -> CUresult;
pub(crate) type PfnMemsetD2D16 =
    unsafe extern "C" fn(CUdeviceptr, usize, u16, usize, usize) -> CUresult;
pub(crate) type PfnMemsetD16Async =
    unsafe extern "C" fn(CUdeviceptr, u16, usize, CUstream) -> CUresult;
pub(crate) type PfnMemsetD2D16Async =
    unsafe extern "C" fn(CUdeviceptr, usize, u16, usize, usize, CUstream) -> CUresult;
pub(crate) type PfnMemsetD32 = unsafe extern "C" fn(CUdeviceptr, c_uint, usize) -> CUresult;
pub(crate) type PfnMemsetD2D32 =
    unsafe extern "C" fn(CUdeviceptr, usize, c_uint, usize, usize) -> CUresult;
pub(crate) type PfnMemsetD32Async =
    unsafe extern "C" fn(CUdeviceptr, c_uint, usize, CUstream) -> CUresult;
pub(crate) type PfnMemsetD2D32Async =
    unsafe extern "C" fn(CUdeviceptr, usize, c_uint, usize, usize, CUstream) -> CUresult;

pub(crate) type PfnEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
pub(crate) type PfnEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
pub(crate) type PfnEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
pub(crate) type PfnEventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
pub(crate) type PfnEventDestroy = unsafe extern "C" fn(CUevent) -> CUresult;
/// `cuFuncGetName` and `cuKernelGetName`: (name out, function or kernel).
pub(crate) type PfnGetName = unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> CUresult;
pub(crate) type PfnStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
pub(crate) type PfnThreadExchangeStreamCaptureMode = unsafe extern "C" fn(*mut c_int) -> CUresult;
pub(crate) type PfnCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
pub(crate) type PfnStreamValue32 =
    unsafe extern "C" fn(CUstream, CUdeviceptr, u32, c_uint) -> CUresult;
pub(crate) type PfnStreamValue64 =
    unsafe extern "C" fn(CUstream, CUdeviceptr, u64, c_uint) -> CUresult;
pub(crate) type PfnStreamBatchMemOp =
    unsafe extern "C" fn(CUstream, c_uint, *mut c_void, c_uint) -> CUresult;
pub(crate) type PfnMemcpyAtoD =
    unsafe extern "C" fn(CUdeviceptr, *mut c_void, usize, usize) -> CUresult;
pub(crate) type PfnMemcpyDtoA =
    unsafe extern "C" fn(*mut c_void, usize, CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
pub(crate) type PfnMemAddressReserve =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64) -> CUresult;
pub(crate) type PfnMemAddressFree = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnMemSetAccess =
    unsafe extern "C" fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
pub(crate) type PfnMemUnmap = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnMemGetAllocationGranularity =
    unsafe extern "C" fn(*mut usize, *const CUmemAllocationPropFull, c_int) -> CUresult;
pub(crate) type PfnMemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult;
pub(crate) type PfnMemHostUnregister = unsafe extern "C" fn(*mut c_void) -> CUresult;
pub(crate) type PfnMemRetainAllocationHandle =
    unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut c_void) -> CUresult;
pub(crate) type PfnMemGetAllocationPropertiesFromHandle =
    unsafe extern "C" fn(*mut CUmemAllocationProp, CUmemGenericAllocationHandle) -> CUresult;
pub(crate) type PfnMemExportToShareableHandle =
    unsafe extern "C" fn(*mut c_void, CUmemGenericAllocationHandle, c_int, u64) -> CUresult;
pub(crate) type PfnMemMapArrayAsync =
    unsafe extern "C" fn(*mut CUarrayMapInfo, c_uint, CUstream) -> CUresult;

/// A driver symbol with its function-pointer type, so that the slot and the signature of a symbol
/// are named together once, in [`driver_symbols!`].
pub(crate) trait Symbol {
    /// The exact `cuda.h` signature of the symbol.
    type Fn: Copy;
    const SYM: Sym;
}

macro_rules! driver_symbols {
    ($($(#[$doc:meta])* $sym:ident = $name:literal: $pfn:ty, hooked: $hooked:literal;)*) => {
        /// Every driver symbol the limiter resolves, one per ABI variant.
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Sym { $($(#[$doc])* $sym,)* }

        impl Sym {
            pub(crate) const ALL: &[Sym] = &[$(Sym::$sym,)*];
            pub(crate) const COUNT: usize = Sym::ALL.len();

            /// The symbol's exported name in libcuda (and in this library, if hooked).
            pub(crate) const fn name(self) -> &'static CStr {
                match self { $(Sym::$sym => $name,)* }
            }

            /// Whether the limiter exports a hook of this name.
            pub(crate) const fn hooked(self) -> bool {
                match self { $(Sym::$sym => $hooked,)* }
            }
        }

        /// Marker types tying each [`Sym`] to its signature.
        pub(crate) mod sym {
            use super::*;
            $(
                #[derive(Debug)]
                pub(crate) struct $sym;
                impl Symbol for $sym {
                    type Fn = $pfn;
                    const SYM: Sym = Sym::$sym;
                }
                const _: () = assert!(mem::size_of::<$pfn>() == mem::size_of::<usize>());
            )*
        }
    };
}

// The order is the driver table's: the allocation and free a process makes most often first,
// so that both pointers sit in the table's first cache line.
driver_symbols! {
    MemAllocV2 = c"cuMemAlloc_v2": PfnMemAlloc, hooked: true;
    MemFreeV2 = c"cuMemFree_v2": PfnMemFree, hooked: true;
    Init = c"cuInit": PfnInit, hooked: true;
    GetProcAddress = c"cuGetProcAddress": PfnGetProcAddress, hooked: true;
    GetProcAddressV2 = c"cuGetProcAddress_v2": PfnGetProcAddressV2, hooked: true;
    MemAllocPitchV2 = c"cuMemAllocPitch_v2": PfnMemAllocPitch, hooked: true;
    MemAllocManaged = c"cuMemAllocManaged": PfnMemAllocManaged, hooked: true;
    MemAllocAsync = c"cuMemAllocAsync": PfnMemAllocAsync, hooked: true;
    MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz": PfnMemAllocAsync, hooked: true;
    MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync": PfnMemAllocFromPoolAsync, hooked: true;
    MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz": PfnMemAllocFromPoolAsync, hooked: true;
    MemFreeAsync = c"cuMemFreeAsync": PfnMemFreeAsync, hooked: true;
    MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz": PfnMemFreeAsync, hooked: true;
    MemCreate = c"cuMemCreate": PfnMemCreate, hooked: true;
    MemRelease = c"cuMemRelease": PfnMemRelease, hooked: true;
    MemMap = c"cuMemMap": PfnMemMap, hooked: true;
    MemPoolCreate = c"cuMemPoolCreate": PfnMemPoolCreate, hooked: true;
    MemPoolDestroy = c"cuMemPoolDestroy": PfnMemPoolDestroy, hooked: true;
    MemPoolTrimTo = c"cuMemPoolTrimTo": PfnMemPoolTrimTo, hooked: true;
    MemGetInfoV2 = c"cuMemGetInfo_v2": PfnMemGetInfo, hooked: true;
    DeviceTotalMemV2 = c"cuDeviceTotalMem_v2": PfnDeviceTotalMem, hooked: true;
    DevicePrimaryCtxRetain = c"cuDevicePrimaryCtxRetain": PfnDevicePrimaryCtxRetain, hooked: true;
    CtxCreateV2 = c"cuCtxCreate_v2": PfnCtxCreateV2, hooked: true;
    CtxCreateV3 = c"cuCtxCreate_v3": PfnCtxCreateV3, hooked: true;
    CtxCreateV4 = c"cuCtxCreate_v4": PfnCtxCreateV4, hooked: true;
    LaunchKernel = c"cuLaunchKernel": PfnLaunchKernel, hooked: true;
    LaunchKernelPtsz = c"cuLaunchKernel_ptsz": PfnLaunchKernel, hooked: true;
    LaunchKernelEx = c"cuLaunchKernelEx": PfnLaunchKernelEx, hooked: true;
    LaunchKernelExPtsz = c"cuLaunchKernelEx_ptsz": PfnLaunchKernelEx, hooked: true;
    LaunchCooperativeKernel = c"cuLaunchCooperativeKernel": PfnLaunchCooperativeKernel, hooked: true;
    LaunchCooperativeKernelPtsz = c"cuLaunchCooperativeKernel_ptsz": PfnLaunchCooperativeKernel, hooked: true;
    GraphLaunch = c"cuGraphLaunch": PfnGraphLaunch, hooked: true;
    GraphLaunchPtsz = c"cuGraphLaunch_ptsz": PfnGraphLaunch, hooked: true;
    /// Used by the hooks to find the current device; not hooked.
    CtxGetDevice = c"cuCtxGetDevice": PfnCtxGetDevice, hooked: false;
    // Synchronisations, copies and host functions: counted and timed (`hooks::timed`). The SM
    // controller drains the device through the real cuCtxSynchronize, from this table.
    CtxSynchronize = c"cuCtxSynchronize": PfnCtxSynchronize, hooked: true;
    CtxSynchronizeV2 = c"cuCtxSynchronize_v2": PfnCtxSynchronizeV2, hooked: true;
    StreamSynchronize = c"cuStreamSynchronize": PfnStreamSynchronize, hooked: true;
    StreamSynchronizePtsz = c"cuStreamSynchronize_ptsz": PfnStreamSynchronize, hooked: true;
    EventSynchronize = c"cuEventSynchronize": PfnEventSynchronize, hooked: true;
    StreamWaitEvent = c"cuStreamWaitEvent": PfnStreamWaitEvent, hooked: true;
    StreamWaitEventPtsz = c"cuStreamWaitEvent_ptsz": PfnStreamWaitEvent, hooked: true;
    LaunchHostFunc = c"cuLaunchHostFunc": PfnLaunchHostFunc, hooked: true;
    LaunchHostFuncPtsz = c"cuLaunchHostFunc_ptsz": PfnLaunchHostFunc, hooked: true;
    Memcpy = c"cuMemcpy": PfnMemcpy, hooked: true;
    MemcpyPtds = c"cuMemcpy_ptds": PfnMemcpy, hooked: true;
    MemcpyAsync = c"cuMemcpyAsync": PfnMemcpyAsync, hooked: true;
    MemcpyAsyncPtsz = c"cuMemcpyAsync_ptsz": PfnMemcpyAsync, hooked: true;
    MemcpyHtoDV2 = c"cuMemcpyHtoD_v2": PfnMemcpyHtoD, hooked: true;
    MemcpyHtoDV2Ptds = c"cuMemcpyHtoD_v2_ptds": PfnMemcpyHtoD, hooked: true;
    MemcpyDtoHV2 = c"cuMemcpyDtoH_v2": PfnMemcpyDtoH, hooked: true;
    MemcpyDtoHV2Ptds = c"cuMemcpyDtoH_v2_ptds": PfnMemcpyDtoH, hooked: true;
    MemcpyDtoDV2 = c"cuMemcpyDtoD_v2": PfnMemcpy, hooked: true;
    MemcpyDtoDV2Ptds = c"cuMemcpyDtoD_v2_ptds": PfnMemcpy, hooked: true;
    MemcpyHtoDAsyncV2 = c"cuMemcpyHtoDAsync_v2": PfnMemcpyHtoDAsync, hooked: true;
    MemcpyHtoDAsyncV2Ptsz = c"cuMemcpyHtoDAsync_v2_ptsz": PfnMemcpyHtoDAsync, hooked: true;
    MemcpyDtoHAsyncV2 = c"cuMemcpyDtoHAsync_v2": PfnMemcpyDtoHAsync, hooked: true;
    MemcpyDtoHAsyncV2Ptsz = c"cuMemcpyDtoHAsync_v2_ptsz": PfnMemcpyDtoHAsync, hooked: true;
    MemcpyDtoDAsyncV2 = c"cuMemcpyDtoDAsync_v2": PfnMemcpyAsync, hooked: true;
    MemcpyDtoDAsyncV2Ptsz = c"cuMemcpyDtoDAsync_v2_ptsz": PfnMemcpyAsync, hooked: true;
    MemcpyPeer = c"cuMemcpyPeer": PfnMemcpyPeer, hooked: true;
    MemcpyPeerPtds = c"cuMemcpyPeer_ptds": PfnMemcpyPeer, hooked: true;
    MemcpyPeerAsync = c"cuMemcpyPeerAsync": PfnMemcpyPeerAsync, hooked: true;
    MemcpyPeerAsyncPtsz = c"cuMemcpyPeerAsync_ptsz": PfnMemcpyPeerAsync, hooked: true;
    MemcpyBatchAsync = c"cuMemcpyBatchAsync": PfnMemcpyBatchAsync, hooked: true;
    MemcpyBatchAsyncPtsz = c"cuMemcpyBatchAsync_ptsz": PfnMemcpyBatchAsync, hooked: true;
    MemcpyBatchAsyncV2 = c"cuMemcpyBatchAsync_v2": PfnMemcpyBatchAsyncV2, hooked: true;
    MemcpyBatchAsyncV2Ptsz = c"cuMemcpyBatchAsync_v2_ptsz": PfnMemcpyBatchAsyncV2, hooked: true;
    // Memsets and 2D/3D copies: hooked so that a frozen container's next one asks for its thaw
    // (not recorded: the shared API table has no room for them).
    Memcpy2DV2 = c"cuMemcpy2D_v2": PfnMemcpyDesc, hooked: true;
    Memcpy2DV2Ptds = c"cuMemcpy2D_v2_ptds": PfnMemcpyDesc, hooked: true;
    Memcpy2DUnalignedV2 = c"cuMemcpy2DUnaligned_v2": PfnMemcpyDesc, hooked: true;
    Memcpy2DUnalignedV2Ptds = c"cuMemcpy2DUnaligned_v2_ptds": PfnMemcpyDesc, hooked: true;
    Memcpy2DAsyncV2 = c"cuMemcpy2DAsync_v2": PfnMemcpyDescAsync, hooked: true;
    Memcpy2DAsyncV2Ptsz = c"cuMemcpy2DAsync_v2_ptsz": PfnMemcpyDescAsync, hooked: true;
    Memcpy3DV2 = c"cuMemcpy3D_v2": PfnMemcpyDesc, hooked: true;
    Memcpy3DV2Ptds = c"cuMemcpy3D_v2_ptds": PfnMemcpyDesc, hooked: true;
    Memcpy3DAsyncV2 = c"cuMemcpy3DAsync_v2": PfnMemcpyDescAsync, hooked: true;
    Memcpy3DAsyncV2Ptsz = c"cuMemcpy3DAsync_v2_ptsz": PfnMemcpyDescAsync, hooked: true;
    Memcpy3DPeer = c"cuMemcpy3DPeer": PfnMemcpyDesc, hooked: true;
    Memcpy3DPeerPtds = c"cuMemcpy3DPeer_ptds": PfnMemcpyDesc, hooked: true;
    Memcpy3DPeerAsync = c"cuMemcpy3DPeerAsync": PfnMemcpyDescAsync, hooked: true;
    Memcpy3DPeerAsyncPtsz = c"cuMemcpy3DPeerAsync_ptsz": PfnMemcpyDescAsync, hooked: true;
    MemsetD8V2 = c"cuMemsetD8_v2": PfnMemsetD8, hooked: true;
    MemsetD8V2Ptds = c"cuMemsetD8_v2_ptds": PfnMemsetD8, hooked: true;
    MemsetD2D8V2 = c"cuMemsetD2D8_v2": PfnMemsetD2D8, hooked: true;
    MemsetD2D8V2Ptds = c"cuMemsetD2D8_v2_ptds": PfnMemsetD2D8, hooked: true;
    MemsetD8Async = c"cuMemsetD8Async": PfnMemsetD8Async, hooked: true;
    MemsetD8AsyncPtsz = c"cuMemsetD8Async_ptsz": PfnMemsetD8Async, hooked: true;
    MemsetD2D8Async = c"cuMemsetD2D8Async": PfnMemsetD2D8Async, hooked: true;
    MemsetD2D8AsyncPtsz = c"cuMemsetD2D8Async_ptsz": PfnMemsetD2D8Async, hooked: true;
    MemsetD16V2 = c"cuMemsetD16_v2": PfnMemsetD16, hooked: true;
    MemsetD16V2Ptds = c"cuMemsetD16_v2_ptds": PfnMemsetD16, hooked: true;
    MemsetD2D16V2 = c"cuMemsetD2D16_v2": PfnMemsetD2D16, hooked: true;
    MemsetD2D16V2Ptds = c"cuMemsetD2D16_v2_ptds": PfnMemsetD2D16, hooked: true;
    MemsetD16Async = c"cuMemsetD16Async": PfnMemsetD16Async, hooked: true;
    MemsetD16AsyncPtsz = c"cuMemsetD16Async_ptsz": PfnMemsetD16Async, hooked: true;
    MemsetD2D16Async = c"cuMemsetD2D16Async": PfnMemsetD2D16Async, hooked: true;
    MemsetD2D16AsyncPtsz = c"cuMemsetD2D16Async_ptsz": PfnMemsetD2D16Async, hooked: true;
    MemsetD32V2 = c"cuMemsetD32_v2": PfnMemsetD32, hooked: true;
    MemsetD32V2Ptds = c"cuMemsetD32_v2_ptds": PfnMemsetD32, hooked: true;
    MemsetD2D32V2 = c"cuMemsetD2D32_v2": PfnMemsetD2D32, hooked: true;
    MemsetD2D32V2Ptds = c"cuMemsetD2D32_v2_ptds": PfnMemsetD2D32, hooked: true;
    MemsetD32Async = c"cuMemsetD32Async": PfnMemsetD32Async, hooked: true;
    MemsetD32AsyncPtsz = c"cuMemsetD32Async_ptsz": PfnMemsetD32Async, hooked: true;
    MemsetD2D32Async = c"cuMemsetD2D32Async": PfnMemsetD2D32Async, hooked: true;
    MemsetD2D32AsyncPtsz = c"cuMemsetD2D32Async_ptsz": PfnMemsetD2D32Async, hooked: true;
    // Stream memory operations and copies between arrays and linear memory: hooked like the
    // memsets (they write or read device memory), not recorded.
    StreamWaitValue32 = c"cuStreamWaitValue32": PfnStreamValue32, hooked: true;
    StreamWaitValue32Ptsz = c"cuStreamWaitValue32_ptsz": PfnStreamValue32, hooked: true;
    StreamWaitValue32V2 = c"cuStreamWaitValue32_v2": PfnStreamValue32, hooked: true;
    StreamWaitValue32V2Ptsz = c"cuStreamWaitValue32_v2_ptsz": PfnStreamValue32, hooked: true;
    StreamWaitValue64 = c"cuStreamWaitValue64": PfnStreamValue64, hooked: true;
    StreamWaitValue64Ptsz = c"cuStreamWaitValue64_ptsz": PfnStreamValue64, hooked: true;
    StreamWaitValue64V2 = c"cuStreamWaitValue64_v2": PfnStreamValue64, hooked: true;
    StreamWaitValue64V2Ptsz = c"cuStreamWaitValue64_v2_ptsz": PfnStreamValue64, hooked: true;
    StreamWriteValue32 = c"cuStreamWriteValue32": PfnStreamValue32, hooked: true;
    StreamWriteValue32Ptsz = c"cuStreamWriteValue32_ptsz": PfnStreamValue32, hooked: true;
    StreamWriteValue32V2 = c"cuStreamWriteValue32_v2": PfnStreamValue32, hooked: true;
    StreamWriteValue32V2Ptsz = c"cuStreamWriteValue32_v2_ptsz": PfnStreamValue32, hooked: true;
    StreamWriteValue64 = c"cuStreamWriteValue64": PfnStreamValue64, hooked: true;
    StreamWriteValue64Ptsz = c"cuStreamWriteValue64_ptsz": PfnStreamValue64, hooked: true;
    StreamWriteValue64V2 = c"cuStreamWriteValue64_v2": PfnStreamValue64, hooked: true;
    StreamWriteValue64V2Ptsz = c"cuStreamWriteValue64_v2_ptsz": PfnStreamValue64, hooked: true;
    StreamBatchMemOp = c"cuStreamBatchMemOp": PfnStreamBatchMemOp, hooked: true;
    StreamBatchMemOpPtsz = c"cuStreamBatchMemOp_ptsz": PfnStreamBatchMemOp, hooked: true;
    StreamBatchMemOpV2 = c"cuStreamBatchMemOp_v2": PfnStreamBatchMemOp, hooked: true;
    StreamBatchMemOpV2Ptsz = c"cuStreamBatchMemOp_v2_ptsz": PfnStreamBatchMemOp, hooked: true;
    MemcpyAtoDV2 = c"cuMemcpyAtoD_v2": PfnMemcpyAtoD, hooked: true;
    MemcpyAtoDV2Ptds = c"cuMemcpyAtoD_v2_ptds": PfnMemcpyAtoD, hooked: true;
    MemcpyDtoAV2 = c"cuMemcpyDtoA_v2": PfnMemcpyDtoA, hooked: true;
    MemcpyDtoAV2Ptds = c"cuMemcpyDtoA_v2_ptds": PfnMemcpyDtoA, hooked: true;
    /// Used to charge pools their reserved size; not hooked.
    MemPoolGetAttribute = c"cuMemPoolGetAttribute": PfnMemPoolGetAttribute, hooked: false;
    /// Used to find the pool of `cuMemAllocAsync`; not hooked.
    DeviceGetMemPool = c"cuDeviceGetMemPool": PfnDeviceGetMemPool, hooked: false;
    /// Used to map NVML devices to CUDA ordinals by UUID; not hooked.
    DeviceGetUuidV2 = c"cuDeviceGetUuid_v2": PfnDeviceGetUuid, hooked: false;
    /// Used to map NVML devices to CUDA ordinals by UUID; not hooked.
    DeviceGetCount = c"cuDeviceGetCount": PfnDeviceGetCount, hooked: false;
    // Sampled GPU time (`runtime::gpu_time`): event pairs around one launch in N, the kernel's
    // name, and what keeps the events out of the application's stream captures. Not hooked: the
    // limiter calls the real functions from this table.
    EventCreate = c"cuEventCreate": PfnEventCreate, hooked: false;
    EventRecord = c"cuEventRecord": PfnEventRecord, hooked: false;
    EventQuery = c"cuEventQuery": PfnEventQuery, hooked: false;
    EventElapsedTime = c"cuEventElapsedTime": PfnEventElapsedTime, hooked: false;
    EventDestroyV2 = c"cuEventDestroy_v2": PfnEventDestroy, hooked: false;
    FuncGetName = c"cuFuncGetName": PfnGetName, hooked: false;
    KernelGetName = c"cuKernelGetName": PfnGetName, hooked: false;
    StreamIsCapturing = c"cuStreamIsCapturing": PfnStreamIsCapturing, hooked: false;
    ThreadExchangeStreamCaptureMode = c"cuThreadExchangeStreamCaptureMode": PfnThreadExchangeStreamCaptureMode, hooked: false;
    CtxGetCurrent = c"cuCtxGetCurrent": PfnCtxGetCurrent, hooked: false;
    // The in-process freeze (`platform::vmm`, `platform::host_memory`): the virtual memory API
    // behind the allocations it backs, host memory registered for what it saves, and the
    // contexts it works in. Not hooked.
    CtxSetCurrent = c"cuCtxSetCurrent": PfnCtxSetCurrent, hooked: false;
    MemAddressReserve = c"cuMemAddressReserve": PfnMemAddressReserve, hooked: false;
    MemAddressFree = c"cuMemAddressFree": PfnMemAddressFree, hooked: false;
    // Hooked too: with the path on, they follow the mappings and access of the memory the
    // application creates (`runtime::own_freeze::created`); off, counted and passed through.
    MemSetAccess = c"cuMemSetAccess": PfnMemSetAccess, hooked: true;
    MemUnmap = c"cuMemUnmap": PfnMemUnmap, hooked: true;
    MemRetainAllocationHandle = c"cuMemRetainAllocationHandle": PfnMemRetainAllocationHandle, hooked: true;
    MemGetAllocationPropertiesFromHandle = c"cuMemGetAllocationPropertiesFromHandle": PfnMemGetAllocationPropertiesFromHandle, hooked: true;
    MemExportToShareableHandle = c"cuMemExportToShareableHandle": PfnMemExportToShareableHandle, hooked: true;
    MemMapArrayAsync = c"cuMemMapArrayAsync": PfnMemMapArrayAsync, hooked: true;
    MemGetAllocationGranularity = c"cuMemGetAllocationGranularity": PfnMemGetAllocationGranularity, hooked: false;
    MemHostRegisterV2 = c"cuMemHostRegister_v2": PfnMemHostRegister, hooked: false;
    MemHostUnregister = c"cuMemHostUnregister": PfnMemHostUnregister, hooked: false;
}

/// An id that no API has: records against it are dropped by the backend's bounds check.
const NO_API: ApiId = ApiId(u16::MAX);

/// The shared API id of every symbol, computed at compile time (no table to load at run time).
const API_IDS: [ApiId; Sym::COUNT] = {
    let mut ids = [NO_API; Sym::COUNT];
    let mut i = 0;
    while i < Sym::COUNT {
        if let Ok(name) = Sym::ALL[i].name().to_str()
            && let Some(id) = ApiId::from_name(name)
        {
            ids[i] = id;
        }
        i += 1;
    }
    ids
};

impl Sym {
    /// The shared API id of this symbol (`agent_common::api`), or an id no API has.
    #[inline(always)]
    pub(crate) const fn api(self) -> ApiId {
        API_IDS[self as usize]
    }

    /// The hooked symbol of this exact name.
    pub(crate) fn hooked_by_name(name: &[u8]) -> Option<Sym> {
        Sym::ALL
            .iter()
            .copied()
            .find(|s| s.hooked() && s.name().to_bytes() == name)
    }
}

/// Why the real driver could not be bound.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindError {
    /// glibc's `dlsym` could not be found with `dlvsym`.
    #[error("cannot find glibc's dlsym with dlvsym")]
    NoRealDlsym,
    /// `dlopen` of the driver failed.
    #[error("cannot open the CUDA driver {path:?}: {reason}")]
    Open { path: String, reason: String },
}

/// Converts a non-null symbol address into the symbol's function-pointer type.
///
/// # Safety
/// `p` must be the address of a function with the signature `S::Fn`.
unsafe fn typed<S: Symbol>(p: usize) -> Option<S::Fn> {
    if p == 0 {
        return None;
    }
    // SAFETY: `S::Fn` is a function-pointer type of the size of `usize` (asserted per symbol in
    // `driver_symbols!`), `p` is non-null and the caller guarantees the signature.
    Some(unsafe { mem::transmute_copy::<usize, S::Fn>(&p) })
}

/// The bound driver: one real pointer per [`Sym`] (0 where the driver lacks it) and its handle.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Driver {
    ptrs: [usize; Sym::COUNT],
    handle: usize,
}

impl Driver {
    /// The real function of `S`, if the driver exports it.
    #[inline]
    pub(crate) fn get<S: Symbol>(&self) -> Option<S::Fn> {
        // SAFETY: slot `S::SYM` was resolved by the name of `S::SYM`, whose cuda.h signature is
        // `S::Fn`.
        unsafe { typed::<S>(self.ptrs[S::SYM as usize]) }
    }

    /// The symbol whose real address is `p`.
    pub(crate) fn sym_at(&self, p: *mut c_void) -> Option<Sym> {
        let p = p as usize;
        if p == 0 {
            return None;
        }
        Sym::ALL
            .iter()
            .copied()
            .find(|&s| self.ptrs[s as usize] == p)
    }

    /// The raw real address of `sym`, 0 if absent.
    pub(crate) fn addr(&self, sym: Sym) -> usize {
        self.ptrs[sym as usize]
    }
}

/// glibc's `dlsym`, never this library's export: `dlvsym(RTLD_NEXT, "dlsym", <version>)`, or
/// from libc's own handle if the limiter was loaded in an unusual order. Neither can answer with
/// this library's `dlsym`: `RTLD_NEXT` searches only the objects loaded after this one, and libc's
/// handle searches libc and what it depends on.
pub(crate) fn find_real_dlsym() -> Option<DlsymFn> {
    #[cfg(target_arch = "aarch64")]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
    #[cfg(not(target_arch = "aarch64"))]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
    let accept = |p: *mut c_void| {
        (!p.is_null()).then(|| {
            // SAFETY: `p` is glibc's `dlsym`, found by name and version, whose signature is
            // `DlsymFn`.
            unsafe { mem::transmute::<*mut c_void, DlsymFn>(p) }
        })
    };
    for v in VERSIONS {
        // SAFETY: both strings are NUL-terminated.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if let Some(f) = accept(p) {
            return Some(f);
        }
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded libc, which stays loaded.
    let libc_handle =
        unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if libc_handle.is_null() {
        return None;
    }
    for v in VERSIONS {
        // SAFETY: a valid handle and NUL-terminated strings.
        let p = unsafe { libc::dlvsym(libc_handle, c"dlsym".as_ptr(), v.as_ptr()) };
        if let Some(f) = accept(p) {
            return Some(f);
        }
    }
    None
}

/// The loaded object `p` lies in and the exported symbol at `p`, if any (`dladdr`).
pub(crate) fn dladdr(p: *mut c_void) -> Option<libc::Dl_info> {
    if p.is_null() {
        return None;
    }
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid out-pointer; dladdr accepts any address.
    (unsafe { libc::dladdr(p, &mut info) } != 0).then_some(info)
}

impl Driver {
    /// Opens the driver (`VGPU_REAL_LIBCUDA`, else `libcuda.so.1`) with glibc's `dlsym` and
    /// resolves every [`Sym`].
    pub(crate) fn open(dlsym: DlsymFn) -> Result<Driver, BindError> {
        let path = match std::env::var_os(REAL_LIBCUDA) {
            Some(p) if !p.is_empty() => {
                CString::new(p.as_bytes()).map_err(|_| BindError::Open {
                    path: p.to_string_lossy().into_owned(),
                    reason: "path contains a NUL byte".into(),
                })?
            }
            _ => c"libcuda.so.1".to_owned(),
        };
        // SAFETY: a NUL-terminated path; RTLD_NODELETE keeps the driver mapped for the process's
        // life, so the pointers resolved below never dangle.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
        if handle.is_null() {
            return Err(BindError::Open {
                path: path.to_string_lossy().into_owned(),
                reason: dlerror(),
            });
        }
        let mut ptrs = [0usize; Sym::COUNT];
        for &s in Sym::ALL {
            // SAFETY: a valid handle and a NUL-terminated name; glibc's dlsym, not our override.
            ptrs[s as usize] = unsafe { dlsym(handle, s.name().as_ptr()) } as usize;
        }
        Ok(Driver {
            handle: handle as usize,
            ptrs,
        })
    }

    /// A table filled by `addr` (0: the driver lacks the symbol), for tests: each address must be
    /// a function with the symbol's `cuda.h` signature.
    #[cfg(test)]
    pub(crate) fn from_fn(addr: impl Fn(Sym) -> usize) -> Driver {
        let mut ptrs = [0usize; Sym::COUNT];
        for &s in Sym::ALL {
            ptrs[s as usize] = addr(s);
        }
        Driver { ptrs, handle: 0 }
    }
}

/// The C library's last `dlerror` message.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local message.
    let err = unsafe { libc::dlerror() };
    if err.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
        unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The next definition of `S` after this library, through glibc's `dlsym` (for a call made while
/// the driver is being bound on this very thread).
pub(crate) fn next_definition<S: Symbol>(dlsym: DlsymFn) -> Option<S::Fn> {
    // SAFETY: RTLD_NEXT and a NUL-terminated name; the result, if any, is the next definition of
    // `S::SYM`'s name, with its cuda.h signature.
    unsafe { typed::<S>(dlsym(libc::RTLD_NEXT, S::SYM.name().as_ptr()) as usize) }
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` of `CUmemPool_attribute`.
const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

/// The driver calls the limiter makes on its own account. Each answers `None` (or 0) when the
/// driver lacks the function or fails.
impl Driver {
    /// The device of the calling thread's current context.
    pub(crate) fn context_device(&self) -> Option<usize> {
        let get = self.get::<sym::CtxGetDevice>()?;
        let mut dev: CUdevice = 0;
        // SAFETY: `dev` is a valid out-pointer for the duration of the call.
        let r = unsafe { get(&mut dev) };
        if r == CUDA_SUCCESS {
            usize::try_from(dev).ok()
        } else {
            None
        }
    }

    /// The number of devices the driver reports (`cuDeviceGetCount`), 0 if it does not answer.
    pub(crate) fn device_count(&self) -> u32 {
        let Some(get) = self.get::<sym::DeviceGetCount>() else {
            return 0;
        };
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        if unsafe { get(&mut n) } != CUDA_SUCCESS {
            return 0;
        }
        u32::try_from(n).unwrap_or(0)
    }

    /// The current pool of `device` (what `cuMemAllocAsync` allocates from).
    pub(crate) fn device_pool(&self, device: usize) -> Option<u64> {
        let get = self.get::<sym::DeviceGetMemPool>()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let dev = CUdevice::try_from(device).ok()?;
        // SAFETY: a valid out-pointer and a device ordinal.
        let r = unsafe { get(&mut pool, dev) };
        (r == CUDA_SUCCESS && !pool.is_null()).then_some(pool as u64)
    }

    /// The UUID of CUDA device `device` (`cuDeviceGetUuid_v2`).
    pub(crate) fn uuid(&self, device: usize) -> Option<[u8; 16]> {
        let get = self.get::<sym::DeviceGetUuidV2>()?;
        let mut u = [0u8; 16];
        // SAFETY: a 16-byte out-buffer; an invalid ordinal is the driver's error to return.
        (unsafe { get(&mut u, CUdevice::try_from(device).ok()?) } == CUDA_SUCCESS).then_some(u)
    }

    /// Waits until the current context has finished all launched work (`cuCtxSynchronize`). Its
    /// error (a sticky context error) is the application's to see at its next call, not ours.
    pub(crate) fn synchronize(&self) {
        if let Some(sync) = self.get::<sym::CtxSynchronize>() {
            // SAFETY: the real cuCtxSynchronize takes no arguments.
            let _ = unsafe { sync() };
        }
    }

    /// Frees `addr` (`cuMemFree_v2`), an allocation the application has not been told about.
    pub(crate) fn free(&self, addr: CUdeviceptr) {
        if let Some(free) = self.get::<sym::MemFreeV2>() {
            // SAFETY: the caller passes an address the driver just allocated.
            unsafe { free(addr) };
        }
    }
}

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, what stream 0 of a `_ptsz`
/// launch means.
const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_CAPTURE_MODE_RELAXED` of `CUstreamCaptureMode`.
const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
/// `CU_STREAM_CAPTURE_STATUS_NONE` of `CUstreamCaptureStatus`.
const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CUDA_ERROR_NOT_READY`: `cuEventQuery`'s "not yet".
const CUDA_ERROR_NOT_READY: CUresult = 600;

/// The real driver's events, for the GPU-time sampler (`limiter_core::gpu_time::Events`): every
/// function it needs, found once. None of these calls waits for the GPU.
#[derive(Clone, Copy)]
pub(crate) struct DriverEvents {
    create: PfnEventCreate,
    record: PfnEventRecord,
    query: PfnEventQuery,
    elapsed: PfnEventElapsedTime,
    destroy: PfnEventDestroy,
    is_capturing: PfnStreamIsCapturing,
    exchange_mode: PfnThreadExchangeStreamCaptureMode,
    current: PfnCtxGetCurrent,
    func_name: Option<PfnGetName>,
    kernel_name: Option<PfnGetName>,
}

impl Driver {
    /// The event functions, if the driver has every one the sampler needs.
    pub(crate) fn events(&self) -> Option<DriverEvents> {
        Some(DriverEvents {
            create: self.get::<sym::EventCreate>()?,
            record: self.get::<sym::EventRecord>()?,
            query: self.get::<sym::EventQuery>()?,
            elapsed: self.get::<sym::EventElapsedTime>()?,
            destroy: self.get::<sym::EventDestroyV2>()?,
            is_capturing: self.get::<sym::StreamIsCapturing>()?,
            exchange_mode: self.get::<sym::ThreadExchangeStreamCaptureMode>()?,
            current: self.get::<sym::CtxGetCurrent>()?,
            func_name: self.get::<sym::FuncGetName>(),
            kernel_name: self.get::<sym::KernelGetName>(),
        })
    }
}

/// The stream handle an event is recorded on for `stream` (a `_ptsz` launch's stream 0 is the
/// thread's default stream).
fn stream_handle(stream: StreamRef) -> CUstream {
    if stream.handle == 0 && stream.per_thread {
        CU_STREAM_PER_THREAD as CUstream
    } else {
        stream.handle as usize as CUstream
    }
}

impl DriverEvents {
    /// The calling thread's current context (0: none).
    pub(crate) fn current_context(&self) -> u64 {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { (self.current)(&mut ctx) } == CUDA_SUCCESS {
            ctx as u64
        } else {
            0
        }
    }

    /// Runs `f` with this thread's stream-capture mode relaxed: an event query made while
    /// another thread captures in global mode would otherwise invalidate its capture. The mode
    /// the application set is put back.
    pub(crate) fn relaxed<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer to a `CUstreamCaptureMode`.
        let swapped = unsafe { (self.exchange_mode)(&mut mode) } == CUDA_SUCCESS;
        let out = f();
        if swapped {
            // SAFETY: as above; puts the thread's previous mode back.
            unsafe { (self.exchange_mode)(&mut mode) };
        }
        out
    }

    /// The name of the function (or library kernel) `f`, as the driver keeps it.
    pub(crate) fn function_name(&self, f: CUfunction) -> Option<&'static CStr> {
        for get in [self.func_name, self.kernel_name].into_iter().flatten() {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: a valid out-pointer; a handle the application launched with (the driver
            // checks it and answers an error for one of the other kind).
            if unsafe { get(&mut name, f) } == CUDA_SUCCESS && !name.is_null() {
                // SAFETY: the driver answers a NUL-terminated name it keeps while the module is
                // loaded (the caller copies it at once).
                return Some(unsafe { CStr::from_ptr(name) });
            }
        }
        None
    }
}

impl gpu_time::Events for DriverEvents {
    type Event = usize;

    fn create(&self) -> Option<usize> {
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags 0 (CU_EVENT_DEFAULT): timing enabled.
        (unsafe { (self.create)(&mut e, 0) } == CUDA_SUCCESS && !e.is_null()).then_some(e as usize)
    }

    fn record(&self, event: usize, stream: StreamRef) -> bool {
        // SAFETY: an event this sampler created, and the stream the application launched on.
        unsafe { (self.record)(event as CUevent, stream_handle(stream)) == CUDA_SUCCESS }
    }

    fn query(&self, event: usize) -> Query {
        // SAFETY: an event this sampler created and recorded.
        match unsafe { (self.query)(event as CUevent) } {
            CUDA_SUCCESS => Query::Done,
            CUDA_ERROR_NOT_READY => Query::NotReady,
            _ => Query::Failed,
        }
    }

    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64> {
        let mut ms: f32 = 0.0;
        // SAFETY: a valid out-pointer and two recorded events the GPU has passed.
        let r = unsafe { (self.elapsed)(&mut ms, start as CUevent, end as CUevent) };
        (r == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0).then(|| (f64::from(ms) * 1e6) as u64)
    }

    fn destroy(&self, event: usize) {
        // SAFETY: an event this sampler created and no longer uses.
        let _ = unsafe { (self.destroy)(event as CUevent) };
    }

    fn capturing(&self, stream: StreamRef) -> Option<bool> {
        let mut status: c_int = 0;
        // SAFETY: a valid out-pointer and the stream the application launched on.
        let r = unsafe { (self.is_capturing)(stream_handle(stream), &mut status) };
        (r == CUDA_SUCCESS).then_some(status != CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

impl PoolSizes for Driver {
    fn reserved(&self, pool: u64) -> Option<u64> {
        let get = self.get::<sym::MemPoolGetAttribute>()?;
        let mut value: u64 = 0;
        // SAFETY: the attribute is a `cuuint64_t`, written to a valid out-pointer.
        let r = unsafe {
            get(
                pool as CUmemoryPool,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&raw mut value).cast(),
            )
        };
        (r == CUDA_SUCCESS).then_some(value)
    }
}

/// What the SM controller asks of the device: the driver's current device and
/// `cuCtxSynchronize`, `CLOCK_MONOTONIC`, and the duty-cycle words of each device (the region's,
/// shared by the container, or this process's own).
pub(crate) struct DriverEnv<'a> {
    pub(crate) driver: &'a Driver,
    pub(crate) windows: &'a [SmShare; agent_common::MAX_DEVICES],
    /// What the QoS thread and the launches of a tiered container tell each other.
    pub(crate) latency: &'a LatencyWords,
}

/// The words between the QoS thread (`runtime::qos`) and the launches of a tiered container.
#[derive(Debug)]
pub(crate) struct LatencyWords {
    /// Per device, until when a latency-tier neighbour's work is in flight (CLOCK_MONOTONIC ns;
    /// 0: none): a best-effort container's launches wait until then.
    pub(crate) gates: [AtomicU64; agent_common::MAX_DEVICES],
    /// Per device, until when the QoS thread of this latency-tier container last published its
    /// work in flight (0: never; only the container's lease holder publishes).
    pub(crate) published: [AtomicU64; agent_common::MAX_DEVICES],
    /// The QoS thread: a latency launch after the published horizon has passed wakes it, so that
    /// the first launch of a request reaches the board within microseconds, not at its next tick.
    pub(crate) thread: Waker,
}

impl LatencyWords {
    pub(crate) const fn new() -> LatencyWords {
        LatencyWords {
            gates: [const { AtomicU64::new(0) }; agent_common::MAX_DEVICES],
            published: [const { AtomicU64::new(0) }; agent_common::MAX_DEVICES],
            thread: Waker::new(),
        }
    }
}

/// A device's duty-cycle words as the controller sees them.
#[derive(Clone, Copy)]
pub(crate) struct SharedWindow<'a>(pub(crate) &'a SmShare);

impl sm::Window for SharedWindow<'_> {
    fn view(&self) -> sm::View {
        let v = self.0.view();
        sm::View {
            start: v.start,
            last: v.last,
            resume: v.resume,
            closed: v.closed,
        }
    }

    fn open(&self, now: u64) {
        self.0.open(now);
    }

    fn touch(&self, now: u64) {
        self.0.touch(now);
    }

    fn close(&self, start: u64, resume: u64) {
        self.0.close(start, resume);
    }

    fn repair(&self, seen: sm::View) {
        self.0.repair(region::sm_share::WindowView {
            start: seen.start,
            last: seen.last,
            resume: seen.resume,
            closed: seen.closed,
        });
    }

    fn duty(&self) -> Option<(u8, u16)> {
        region::sm_share::decode_duty(self.0.duty())
    }
}

impl<'a> sm::Env for DriverEnv<'a> {
    type Window = SharedWindow<'a>;

    fn device(&self) -> Option<usize> {
        self.driver.context_device()
    }

    fn window(&self, device: usize) -> Option<SharedWindow<'a>> {
        self.windows.get(device).map(SharedWindow)
    }

    fn now_ns(&self) -> u64 {
        Clock::MONOTONIC.now()
    }

    fn drain(&self) {
        self.driver.synchronize();
    }

    fn sleep_until(&self, t: u64) {
        let now = self.now_ns();
        if t > now {
            std::thread::sleep(std::time::Duration::from_nanos(t - now));
        }
    }

    fn latency_until(&self, device: usize) -> u64 {
        // Relaxed: a time compared with the clock; a launch that sees the previous value waits
        // by the previous one.
        self.latency
            .gates
            .get(device)
            .map_or(0, |g| g.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn mark_launch(&self, device: usize, now: u64) {
        if let Some(w) = self.windows.get(device) {
            sm::note_unlimited(&SharedWindow(w), now);
        }
    }

    fn tiered_launch(&self, device: usize) {
        // Relaxed: a time compared with the clock; a stale value at worst wakes the thread once
        // more, or leaves the launch to its next tick.
        let published = self
            .latency
            .published
            .get(device)
            .map_or(0, |p| p.load(std::sync::atomic::Ordering::Relaxed));
        if published != 0 && self.now_ns() >= published {
            self.latency.thread.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        for &s in Sym::ALL {
            assert_eq!(
                Sym::ALL.iter().filter(|t| t.name() == s.name()).count(),
                1,
                "{:?}",
                s
            );
            if s.hooked() {
                assert_eq!(Sym::hooked_by_name(s.name().to_bytes()), Some(s));
            }
        }
        assert_eq!(Sym::hooked_by_name(b"cuCtxGetDevice"), None);
        assert_eq!(Sym::hooked_by_name(b"cuMemAlloc"), None);
    }

    /// The agent probes launches, synchronisations and copies only in processes without the
    /// limiter: every such entry point must be one the limiter records, or its calls would go
    /// uncounted in the limiter's processes.
    #[test]
    fn every_launch_sync_and_copy_entry_point_is_hooked() {
        use agent_common::api::{APIS, ApiKind};
        let kinds = [ApiKind::Launch, ApiKind::Sync, ApiKind::Copy];
        let mut checked = 0;
        for spec in APIS.iter().filter(|a| kinds.contains(&a.kind)) {
            let sym = Sym::hooked_by_name(spec.name.as_bytes());
            assert!(sym.is_some(), "{} is not hooked", spec.name);
            assert_eq!(sym.map(Sym::api), ApiId::from_name(spec.name));
            checked += 1;
        }
        assert!(checked >= 40, "{checked}");
    }

    #[test]
    fn real_dlsym_is_glibcs() {
        let d = find_real_dlsym().expect("glibc dlsym");
        let info = dladdr(d as *mut c_void).expect("a loaded object");
        // SAFETY: dladdr filled the object's file name, NUL-terminated.
        let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
        assert!(file.contains("libc.so"), "{file}");
        // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
        let p = unsafe { d(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert!(!p.is_null());
    }
}
