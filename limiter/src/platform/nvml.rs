//! NVML's side of the platform: the symbol table of the real library, its types, and the mapping
//! from an NVML device to a CUDA ordinal. The hooks that answer NVML calls under the limit live in
//! `hooks::nvml`; the per-process utilisation the SM feedback loop reads, in [`sampler`].
//!
//! The real functions come from `dlopen(VGPU_REAL_LIBNVML | "libnvidia-ml.so.1")`, which finds the
//! copy the application already loaded.
//!
//! Devices: NVML indexes all GPUs of the machine (or container), CUDA ordinals follow
//! `CUDA_VISIBLE_DEVICES` and its ordering (HAMi #225 came from mixing them). A handle is mapped
//! to a CUDA ordinal by UUID (`nvmlDeviceGetUUID` against `cuDeviceGetUuid_v2` of every CUDA
//! device); a GPU that CUDA does not see keeps the driver's figures. Before `cuInit` (CUDA cannot
//! enumerate yet) or without `nvmlDeviceGetUUID`, the NVML index is taken as the CUDA ordinal.

use std::{
    ffi::{CStr, CString, c_char, c_uint, c_void},
    os::unix::ffi::OsStrExt,
};

pub(crate) mod sampler;

use super::{
    cuda::CUDA_SUCCESS,
    driver::{DlsymFn, Driver, sym},
};

pub(crate) type NvmlReturn = c_uint;
pub(crate) type NvmlDevice = *mut c_void;
pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_UNINITIALIZED`: what the hooks answer when the real library cannot be bound.
pub(crate) const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub(crate) const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
/// `NVML_ERROR_NOT_FOUND`: no sample since the timestamp given.
pub(crate) const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
/// `NVML_ERROR_INSUFFICIENT_SIZE`: `*count` then holds the entries needed.
pub(crate) const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `NVML_VALUE_NOT_AVAILABLE`, NVML's instance ids outside MIG.
pub(crate) const NOT_AVAILABLE: c_uint = c_uint::MAX;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvmlMemory {
    pub(crate) total: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvmlMemoryV2 {
    pub(crate) version: c_uint,
    pub(crate) total: u64,
    pub(crate) reserved: u64,
    pub(crate) free: u64,
    pub(crate) used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvmlProcessInfoV1 {
    pub(crate) pid: c_uint,
    pub(crate) used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t`, also `nvmlProcessInfo_t` of `_v3`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvmlProcessInfo {
    pub(crate) pid: c_uint,
    pub(crate) used_gpu_memory: u64,
    pub(crate) gpu_instance_id: c_uint,
    pub(crate) compute_instance_id: c_uint,
}

const _: () = assert!(size_of::<NvmlProcessInfoV1>() == 16);
const _: () = assert!(size_of::<NvmlProcessInfo>() == 24);

pub(crate) type PfnMemoryInfo = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
pub(crate) type PfnMemoryInfoV2 = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;
pub(crate) type PfnProcessesV1 =
    unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfoV1) -> NvmlReturn;
pub(crate) type PfnProcesses =
    unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;
type PfnUuid = unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
type PfnIndex = unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn;
// For the SM feedback loop's sampler.
pub(crate) type PfnInit = unsafe extern "C" fn() -> NvmlReturn;
pub(crate) type PfnHandleByUuid =
    unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
pub(crate) type PfnHandleByIndex = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
pub(crate) type PfnProcessUtilization =
    unsafe extern "C" fn(NvmlDevice, *mut ProcessSample, *mut c_uint, u64) -> NvmlReturn;

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProcessSample {
    pub(crate) pid: c_uint,
    /// CPU timestamp in microseconds.
    pub(crate) time_stamp: u64,
    pub(crate) sm_util: c_uint,
    pub(crate) mem_util: c_uint,
    pub(crate) enc_util: c_uint,
    pub(crate) dec_util: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessSample>() == 32);
const _: () = assert!(std::mem::offset_of!(ProcessSample, time_stamp) == 8);
const _: () = assert!(std::mem::offset_of!(ProcessSample, sm_util) == 16);

/// The real NVML functions the limiter uses (`None`: the library lacks it).
#[derive(Debug)]
pub(crate) struct Nvml {
    pub(crate) memory_info: Option<PfnMemoryInfo>,
    pub(crate) memory_info_v2: Option<PfnMemoryInfoV2>,
    pub(crate) processes_v1: Option<PfnProcessesV1>,
    pub(crate) processes_v2: Option<PfnProcesses>,
    pub(crate) processes_v3: Option<PfnProcesses>,
    uuid: Option<PfnUuid>,
    index: Option<PfnIndex>,
    /// For the SM feedback loop ([`sampler`]).
    init: Option<PfnInit>,
    by_uuid: Option<PfnHandleByUuid>,
    by_index: Option<PfnHandleByIndex>,
    process_utilization: Option<PfnProcessUtilization>,
}

impl Nvml {
    /// Opens the real NVML (`VGPU_REAL_LIBNVML`, else `libnvidia-ml.so.1`) with glibc's `dlsym`;
    /// `None` if it cannot be opened.
    pub(crate) fn open(dlsym: DlsymFn) -> Option<Nvml> {
        let path = match std::env::var_os(limiter_core::config::REAL_LIBNVML) {
            Some(p) if !p.is_empty() => CString::new(p.as_bytes()).ok()?,
            _ => c"libnvidia-ml.so.1".to_owned(),
        };
        // SAFETY: a NUL-terminated path; RTLD_NODELETE keeps the resolved pointers valid.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
        if handle.is_null() {
            return None;
        }
        let get = |name: &CStr| {
            // SAFETY: a valid handle and a NUL-terminated name; glibc's dlsym.
            let p = unsafe { dlsym(handle, name.as_ptr()) };
            (!p.is_null()).then_some(p as usize)
        };
        // SAFETY: each name is resolved in libnvidia-ml, whose nvml.h signature is the target type
        // of its transmute (all of them); `usize` and function pointers have the same size.
        unsafe {
            Some(Nvml {
                memory_info: get(c"nvmlDeviceGetMemoryInfo")
                    .map(|p| std::mem::transmute::<usize, PfnMemoryInfo>(p)),
                memory_info_v2: get(c"nvmlDeviceGetMemoryInfo_v2")
                    .map(|p| std::mem::transmute::<usize, PfnMemoryInfoV2>(p)),
                processes_v1: get(c"nvmlDeviceGetComputeRunningProcesses")
                    .map(|p| std::mem::transmute::<usize, PfnProcessesV1>(p)),
                processes_v2: get(c"nvmlDeviceGetComputeRunningProcesses_v2")
                    .map(|p| std::mem::transmute::<usize, PfnProcesses>(p)),
                processes_v3: get(c"nvmlDeviceGetComputeRunningProcesses_v3")
                    .map(|p| std::mem::transmute::<usize, PfnProcesses>(p)),
                uuid: get(c"nvmlDeviceGetUUID").map(|p| std::mem::transmute::<usize, PfnUuid>(p)),
                index: get(c"nvmlDeviceGetIndex")
                    .map(|p| std::mem::transmute::<usize, PfnIndex>(p)),
                init: get(c"nvmlInit_v2").map(|p| std::mem::transmute::<usize, PfnInit>(p)),
                by_uuid: get(c"nvmlDeviceGetHandleByUUID")
                    .map(|p| std::mem::transmute::<usize, PfnHandleByUuid>(p)),
                by_index: get(c"nvmlDeviceGetHandleByIndex_v2")
                    .map(|p| std::mem::transmute::<usize, PfnHandleByIndex>(p)),
                process_utilization: get(c"nvmlDeviceGetProcessUtilization")
                    .map(|p| std::mem::transmute::<usize, PfnProcessUtilization>(p)),
            })
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's spelling of a CUDA UUID.
pub(crate) fn uuid_string(u: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// Where an NVML device lands among CUDA ordinals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ordinal {
    Cuda(usize),
    /// CUDA enumerates devices but not this one.
    NotVisible,
}

/// Maps an NVML device to a CUDA ordinal: by UUID when both sides can tell, else by index.
pub(crate) fn ordinal(driver: &Driver, nvml: &Nvml, dev: NvmlDevice) -> Option<Ordinal> {
    if let (Some(uuid_fn), Some(count_fn), Some(cu_uuid)) = (
        nvml.uuid,
        driver.get::<sym::DeviceGetCount>(),
        driver.get::<sym::DeviceGetUuidV2>(),
    ) {
        let mut buf = [0 as c_char; 96];
        let mut count = 0;
        // SAFETY: a 96-byte buffer (NVML_DEVICE_UUID_V2_BUFFER_SIZE) and valid out-pointers.
        let (nr, cr) = unsafe {
            (
                uuid_fn(dev, buf.as_mut_ptr(), buf.len() as c_uint),
                count_fn(&mut count),
            )
        };
        if nr == NVML_SUCCESS && cr == CUDA_SUCCESS {
            // SAFETY: NVML wrote a NUL-terminated string into `buf` (zeroed, so terminated anyway).
            let want = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes();
            for d in 0..count.max(0) {
                let mut u = [0u8; 16];
                // SAFETY: a 16-byte out-buffer and an ordinal below the device count.
                if unsafe { cu_uuid(&mut u, d) } == CUDA_SUCCESS
                    && uuid_string(&u).as_bytes() == want
                {
                    return Some(Ordinal::Cuda(d as usize));
                }
            }
            return Some(Ordinal::NotVisible);
        }
    }
    let mut index: c_uint = 0;
    // SAFETY: a valid out-pointer.
    (unsafe { nvml.index?(dev, &mut index) } == NVML_SUCCESS)
        .then_some(Ordinal::Cuda(index as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_like_nvml() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(uuid_string(&u), "GPU-12345678-9abc-def0-0123-456789abcdef");
    }
}
