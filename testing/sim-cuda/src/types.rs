//! The subset of `cuda.h` (CUDA 12) that the simulated driver needs: result codes, handle types,
//! attribute numbers and the few structs it reads.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUmemGenericAllocationHandle = u64;
pub type cuuint64_t = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUmemoryPool = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_TIMEOUT: CUresult = 909;

/// `CUprocessState`, as `u64` for the shared device's mailbox words.
pub const CU_PROCESS_STATE_RUNNING: u64 = 0;
pub const CU_PROCESS_STATE_LOCKED: u64 = 1;
pub const CU_PROCESS_STATE_CHECKPOINTED: u64 = 2;

/// `CUcheckpointLockArgs`.
#[repr(C)]
pub struct CUcheckpointLockArgs {
    /// How long the lock waits for the process's calls in flight (0: no limit).
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub reserved1: [u64; 7],
}
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CUdriverProcAddressQueryResult`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Special stream handles.
pub const CU_STREAM_LEGACY: u64 = 0x1;
pub const CU_STREAM_PER_THREAD: u64 = 0x2;

/// `CUmemPool_attribute`.
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: c_int = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;

/// `CUpointer_attribute`.
pub const CU_POINTER_ATTRIBUTE_CONTEXT: c_int = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: c_int = 3;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: c_int = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: c_int = 13;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: c_int = 17;
/// `CUmemorytype`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// `CUmemLocationType` / `CUmemAllocationType`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (CUDA 12).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `CUmemPoolProps` (CUDA 12: 88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub reserved: [u8; 56],
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUlaunchConfig` (the fields read here; attributes are not interpreted).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub grid_dim: [c_uint; 3],
    pub block_dim: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUdevice_attribute` values the simulated device reports (an H100-like device).
pub const DEVICE_ATTRIBUTES: &[(c_int, c_int)] = &[
    (1, 1024),       // MAX_THREADS_PER_BLOCK
    (2, 1024),       // MAX_BLOCK_DIM_X
    (3, 1024),       // MAX_BLOCK_DIM_Y
    (4, 64),         // MAX_BLOCK_DIM_Z
    (5, 2147483647), // MAX_GRID_DIM_X
    (6, 65535),      // MAX_GRID_DIM_Y
    (7, 65535),      // MAX_GRID_DIM_Z
    (8, 49152),      // MAX_SHARED_MEMORY_PER_BLOCK
    (9, 65536),      // TOTAL_CONSTANT_MEMORY
    (10, 32),        // WARP_SIZE
    (12, 65536),     // MAX_REGISTERS_PER_BLOCK
    (13, 1980000),   // CLOCK_RATE (kHz)
    (16, 132),       // MULTIPROCESSOR_COUNT
    (18, 0),         // INTEGRATED
    (19, 1),         // CAN_MAP_HOST_MEMORY
    (20, 0),         // COMPUTE_MODE (default)
    (31, 1),         // CONCURRENT_KERNELS
    (33, 0),         // PCI_BUS_ID (device ordinal is added)
    (34, 0),         // PCI_DEVICE_ID
    (36, 2619000),   // MEMORY_CLOCK_RATE (kHz)
    (37, 5120),      // GLOBAL_MEMORY_BUS_WIDTH
    (38, 52428800),  // L2_CACHE_SIZE
    (39, 2048),      // MAX_THREADS_PER_MULTIPROCESSOR
    (41, 1),         // UNIFIED_ADDRESSING
    (50, 0),         // PCI_DOMAIN_ID
    (75, 9),         // COMPUTE_CAPABILITY_MAJOR
    (76, 0),         // COMPUTE_CAPABILITY_MINOR
    (83, 1),         // MANAGED_MEMORY
    (89, 1),         // CONCURRENT_MANAGED_ACCESS
    (95, 1),         // COOPERATIVE_LAUNCH
    (97, 232448),    // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    (102, 1),        // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    (115, 1),        // MEMORY_POOLS_SUPPORTED
];
/// `CU_DEVICE_ATTRIBUTE_MAX` in CUDA 12.2.
pub const DEVICE_ATTRIBUTE_MAX: c_int = 134;

/// Allocation granularity of `cuMemCreate`/`cuMemAddressReserve` (2 MiB, as on real GPUs).
pub const GRANULARITY: u64 = 2 << 20;
/// Alignment of `cuMemAlloc*` addresses and of the pitch of `cuMemAllocPitch`.
pub const ALLOC_ALIGN: u64 = 512;

/// Result codes with their `cuGetErrorName` and `cuGetErrorString` texts.
pub const ERRORS: &[(CUresult, &std::ffi::CStr, &std::ffi::CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];
