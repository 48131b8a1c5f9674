//! The subset of `cuda.h` (CUDA 12) that the limiter's hooks need: handle types, result codes and the
//! one structure whose fields the limiter reads.
//!
//! Reference: the CUDA Driver API, <https://docs.nvidia.com/cuda/cuda-driver-api/> (cuda.h of CUDA
//! 12.x). Only the leading fields of [`CUmemAllocationProp`] are declared: the limiter reads them
//! through a pointer the caller owns and never creates or copies the structure.

use std::ffi::{c_int, c_uint, c_void};

/// `CUresult`.
pub(crate) type CUresult = c_int;
/// `CUdeviceptr` (`CUdeviceptr_v2`, 64-bit since CUDA 3.2).
pub(crate) type CUdeviceptr = u64;
/// `CUdevice`.
pub(crate) type CUdevice = c_int;
/// `CUstream`.
pub(crate) type CUstream = *mut c_void;
/// `CUfunction`.
pub(crate) type CUfunction = *mut c_void;
/// `CUgraphExec`.
pub(crate) type CUgraphExec = *mut c_void;
/// `CUmemoryPool`.
pub(crate) type CUmemoryPool = *mut c_void;
/// `CUmemGenericAllocationHandle` (`unsigned long long`).
pub(crate) type CUmemGenericAllocationHandle = u64;
/// `CUlaunchConfig` is only passed through.
pub(crate) type CUlaunchConfig = c_void;
/// `CUmemPoolProps` is only passed through.
pub(crate) type CUmemPoolProps = c_void;
/// `CUcontext`.
pub(crate) type CUcontext = *mut c_void;
/// `CUevent`.
pub(crate) type CUevent = *mut c_void;
/// `CUhostFn` (`void (*)(void *)`), only passed through.
pub(crate) type CUhostFn = *mut c_void;
/// `CUmemcpyAttributes`, only passed through.
pub(crate) type CUmemcpyAttributes = c_void;
/// `CUdriverProcAddressQueryResult`.
pub(crate) type CUdriverProcAddressQueryResult = c_int;

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// `CU_MEM_LOCATION_TYPE_DEVICE` of `CUmemLocationType`.
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CUmemLocation {
    /// `CUmemLocationType`.
    pub(crate) kind: c_int,
    /// Device ordinal when `kind` is [`CU_MEM_LOCATION_TYPE_DEVICE`].
    pub(crate) id: c_int,
}

/// The leading fields of `CUmemAllocationProp`; the rest (`win32HandleMetaData`, `allocFlags`) is
/// never read.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub(crate) kind: c_uint,
    /// `CUmemAllocationHandleType`.
    pub(crate) requested_handle_types: c_uint,
    pub(crate) location: CUmemLocation,
}

const _: () = assert!(std::mem::offset_of!(CUmemAllocationProp, location) == 8);

/// `CU_MEM_ALLOCATION_TYPE_PINNED` of `CUmemAllocationType`.
pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE` of `CUmemAccess_flags`.
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ` of `CUmemAccess_flags`.
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READ: c_int = 1;

/// The whole `CUmemAllocationProp` (cuda.h 12.x), for the allocations the limiter itself
/// creates: the driver reads all 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemAllocationPropFull {
    pub(crate) kind: c_uint,
    pub(crate) requested_handle_types: c_uint,
    pub(crate) location: CUmemLocation,
    pub(crate) win32_handle_meta_data: usize,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, 4 reserved bytes.
    pub(crate) alloc_flags: [u8; 8],
}

const _: () = assert!(size_of::<CUmemAllocationPropFull>() == 32);

/// `CUmemHandleType`'s only value: a handle of `cuMemCreate`.
pub(crate) const CU_MEM_HANDLE_TYPE_GENERIC: c_int = 0;

/// `CUarrayMapInfo` (`cuMemMapArrayAsync`): one mapping of a sparse array's tile to memory. Only
/// `mem_handle_type` and `mem_handle` are read; the rest is the driver's and is passed on as is.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CUarrayMapInfo {
    /// `resourceType`, its padding and the `resource` union.
    pub(crate) resource: [u64; 2],
    /// `subresourceType`, its padding and the `subresource` union.
    pub(crate) subresource: [u64; 5],
    /// `CUmemOperationType`.
    pub(crate) mem_operation_type: c_int,
    /// `CUmemHandleType`.
    pub(crate) mem_handle_type: c_int,
    pub(crate) mem_handle: CUmemGenericAllocationHandle,
    pub(crate) offset: u64,
    pub(crate) device_bit_mask: u32,
    pub(crate) flags: u32,
    pub(crate) reserved: [u32; 2],
}

// cuda.h's layout on x86-64 and aarch64: the handle at 64 of 96 bytes.
const _: () = assert!(size_of::<CUarrayMapInfo>() == 96);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, mem_operation_type) == 56);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, mem_handle_type) == 60);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, mem_handle) == 64);
const _: () = assert!(std::mem::offset_of!(CUarrayMapInfo, offset) == 72);

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CUmemAccessDesc {
    pub(crate) location: CUmemLocation,
    /// `CUmemAccess_flags`.
    pub(crate) flags: c_int,
}

const _: () = assert!(size_of::<CUmemAccessDesc>() == 12);
