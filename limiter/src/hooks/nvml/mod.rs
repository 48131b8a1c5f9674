//! NVML under the limit: `nvmlDeviceGetMemoryInfo(_v2)` report the limit and the container's
//! usage ([`memory`]), and `nvmlDeviceGetComputeRunningProcesses*` list the container's own
//! processes with what the limiter charges them ([`procs`]), so monitoring inside the container
//! and frameworks that size themselves with NVML see the limit.
//!
//! Reached by direct linking (this library is preloaded) and by `dlsym` through a libnvidia-ml
//! handle (see `hooks::dlsym`). The real functions and the mapping of NVML devices to CUDA
//! ordinals are `platform::nvml`'s.

use std::ffi::c_void;

use super::gate::address;

pub(crate) mod memory;
pub(crate) mod procs;

/// The hook for an NVML name, if we hook it.
pub(crate) fn hook_for(name: &[u8]) -> Option<*mut c_void> {
    let f: *const () = match name {
        b"nvmlDeviceGetMemoryInfo" => memory::nvmlDeviceGetMemoryInfo as *const (),
        b"nvmlDeviceGetMemoryInfo_v2" => memory::nvmlDeviceGetMemoryInfo_v2 as *const (),
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
    Some(address(f))
}
