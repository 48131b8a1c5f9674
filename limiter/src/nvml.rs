//! NVML memory information under the limit: `nvmlDeviceGetMemoryInfo` and
//! `nvmlDeviceGetMemoryInfo_v2` report `total = min(limit, device total)`, `used` = what the
//! container has reserved on that device (the region's counter; this process's with in-process
//! accounting) and `free = total - used` (saturating), so monitoring inside the container and
//! frameworks that size themselves with NVML see the limit. The per-process list
//! (`nvmlDeviceGetComputeRunningProcesses*`, in [`procs`]) shows the container's own processes
//! with what the limiter charges them.
//!
//! Reached by direct linking (this library is preloaded) and by `dlsym` through a libnvidia-ml
//! handle (see `dlsym.rs`). The real functions come from `dlopen(VGPU_REAL_LIBNVML |
//! "libnvidia-ml.so.1")`, which finds the copy the application already loaded.
//!
//! Devices: NVML indexes all GPUs of the machine (or container), CUDA ordinals follow
//! `CUDA_VISIBLE_DEVICES` and its ordering (HAMi #225 came from mixing them). A handle is mapped
//! to a CUDA ordinal by UUID (`nvmlDeviceGetUUID` against `cuDeviceGetUuid_v2` of every CUDA
//! device); a GPU that CUDA does not see keeps the driver's figures. Before `cuInit` (CUDA cannot
//! enumerate yet) or without `nvmlDeviceGetUUID`, the NVML index is taken as the CUDA ordinal.

use std::{
    ffi::{CStr, CString, c_char, c_uint, c_void},
    os::unix::ffi::OsStrExt,
    sync::OnceLock,
};

mod procs;
pub mod util;

use crate::{
    accounting::Accounting as _,
    cuda::CUDA_SUCCESS,
    guard::{Reentry, shield},
    process,
    real_driver::{self, sym},
    state::{self, State},
};

pub type NvmlReturn = c_uint;
pub type NvmlDevice = *mut c_void;
const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_UNINITIALIZED`: what the hooks answer when the real library cannot be bound.
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

type PfnMemoryInfo = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
type PfnMemoryInfoV2 = unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;
type PfnUuid = unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
type PfnIndex = unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn;

/// The real NVML functions the hooks need.
#[derive(Debug)]
struct Nvml {
    memory_info: Option<PfnMemoryInfo>,
    memory_info_v2: Option<PfnMemoryInfoV2>,
    processes_v1: Option<procs::PfnProcessesV1>,
    processes_v2: Option<procs::PfnProcesses>,
    processes_v3: Option<procs::PfnProcesses>,
    uuid: Option<PfnUuid>,
    index: Option<PfnIndex>,
    /// For the SM feedback loop (`util.rs`).
    init: Option<util::PfnInit>,
    by_uuid: Option<util::PfnHandleByUuid>,
    by_index: Option<util::PfnHandleByIndex>,
    process_utilization: Option<util::PfnProcessUtilization>,
}

static NVML: OnceLock<Option<Nvml>> = OnceLock::new();

fn bind() -> Option<&'static Nvml> {
    NVML.get_or_init(|| {
        let dlsym = real_driver::real_dlsym()?;
        let path = match std::env::var_os(crate::config::REAL_LIBNVML) {
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
                    .map(|p| std::mem::transmute::<usize, procs::PfnProcessesV1>(p)),
                processes_v2: get(c"nvmlDeviceGetComputeRunningProcesses_v2")
                    .map(|p| std::mem::transmute::<usize, procs::PfnProcesses>(p)),
                processes_v3: get(c"nvmlDeviceGetComputeRunningProcesses_v3")
                    .map(|p| std::mem::transmute::<usize, procs::PfnProcesses>(p)),
                uuid: get(c"nvmlDeviceGetUUID").map(|p| std::mem::transmute::<usize, PfnUuid>(p)),
                index: get(c"nvmlDeviceGetIndex")
                    .map(|p| std::mem::transmute::<usize, PfnIndex>(p)),
                init: get(c"nvmlInit_v2").map(|p| std::mem::transmute::<usize, util::PfnInit>(p)),
                by_uuid: get(c"nvmlDeviceGetHandleByUUID")
                    .map(|p| std::mem::transmute::<usize, util::PfnHandleByUuid>(p)),
                by_index: get(c"nvmlDeviceGetHandleByIndex_v2")
                    .map(|p| std::mem::transmute::<usize, util::PfnHandleByIndex>(p)),
                process_utilization: get(c"nvmlDeviceGetProcessUtilization")
                    .map(|p| std::mem::transmute::<usize, util::PfnProcessUtilization>(p)),
            })
        }
    })
    .as_ref()
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's spelling of a CUDA UUID.
pub fn uuid_string(u: &[u8; 16]) -> String {
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
pub enum Ordinal {
    Cuda(usize),
    /// CUDA enumerates devices but not this one.
    NotVisible,
}

/// Maps an NVML device to a CUDA ordinal: by UUID when both sides can tell, else by index.
fn ordinal(state: &State, nvml: &Nvml, dev: NvmlDevice) -> Option<Ordinal> {
    if let (Some(uuid_fn), Some(count_fn), Some(cu_uuid)) = (
        nvml.uuid,
        state.driver.get::<sym::DeviceGetCount>(),
        state.driver.get::<sym::DeviceGetUuidV2>(),
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

/// `(total, free, used)` under the limit of the CUDA device behind `dev`, if it has one.
fn limited(state: &State, nvml: &Nvml, dev: NvmlDevice, total: u64) -> Option<(u64, u64, u64)> {
    let Ordinal::Cuda(d) = ordinal(state, nvml, dev)? else {
        return None;
    };
    let (limit, used) = match (state.region(), process::ready()) {
        (Some(r), _) => {
            let l = r.limit(u32::try_from(d).ok()?);
            (l, r.reserved(d as u32))
        }
        (None, Some(p)) => (p.ledger.limit(d)?, p.ledger.used(d)),
        (None, None) => (state.config.memory_limit.get(d).copied()??, 0),
    };
    if limit == 0 {
        return None;
    }
    let total = limit.min(total);
    Some((total, total.saturating_sub(used), used))
}

/// Runs `f` with the state and the bound NVML, unless the thread is already inside the limiter or
/// either is unavailable (then `None`: the caller passes the call through).
fn with_state<T>(f: impl FnOnce(&'static State, &'static Nvml) -> T) -> Option<T> {
    let guard = Reentry::enter()?;
    shield(|| {
        let state = state::get(&guard).ok()?;
        Some(f(state, bind()?))
    })
    .flatten()
}

/// # Safety
/// The caller follows the contract of NVML's `nvmlDeviceGetMemoryInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    let Some(real) = bind().and_then(|n| n.memory_info) else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(device, memory) };
    if r == NVML_SUCCESS && !memory.is_null() {
        // SAFETY: NVML succeeded and filled the caller's struct.
        let total = unsafe { (*memory).total };
        if let Some(Some((t, f, u))) = with_state(|s, n| limited(s, n, device, total)) {
            // SAFETY: the caller's struct, just written by NVML.
            unsafe {
                memory.write(NvmlMemory {
                    total: t,
                    free: f,
                    used: u,
                })
            };
        }
    }
    r
}

/// # Safety
/// The caller follows the contract of NVML's `nvmlDeviceGetMemoryInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    let Some(real) = bind().and_then(|n| n.memory_info_v2) else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(device, memory) };
    if r == NVML_SUCCESS && !memory.is_null() {
        // SAFETY: NVML succeeded and filled the caller's struct.
        let total = unsafe { (*memory).total };
        if let Some(Some((t, f, u))) = with_state(|s, n| limited(s, n, device, total)) {
            // SAFETY: the caller's struct, just written by NVML; `version` and `reserved` are kept.
            unsafe {
                (*memory).total = t;
                (*memory).free = f;
                (*memory).used = u;
            }
        }
    }
    r
}

/// The hook for an NVML name, if we hook it.
pub fn hook_for(name: &[u8]) -> Option<*mut c_void> {
    let f: *const () = match name {
        b"nvmlDeviceGetMemoryInfo" => nvmlDeviceGetMemoryInfo as *const (),
        b"nvmlDeviceGetMemoryInfo_v2" => nvmlDeviceGetMemoryInfo_v2 as *const (),
        b"nvmlDeviceGetComputeRunningProcesses" => {
            procs::nvmlDeviceGetComputeRunningProcesses as *const ()
        }
        b"nvmlDeviceGetComputeRunningProcesses_v2" => {
            procs::nvmlDeviceGetComputeRunningProcesses_v2 as *const ()
        }
        b"nvmlDeviceGetComputeRunningProcesses_v3" => {
            procs::nvmlDeviceGetComputeRunningProcesses_v3 as *const ()
        }
        _ => return None,
    };
    Some(f.cast_mut().cast())
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
