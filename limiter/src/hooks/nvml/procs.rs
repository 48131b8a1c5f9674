//! NVML's per-process list under the limit: `nvmlDeviceGetComputeRunningProcesses` (and `_v2`,
//! `_v3`) answer, for a device the container is limited on, the container's own processes with
//! what the limiter charges them (allocations and context), taken from the region's live slots.
//!
//! Why not filter the driver's list: NVML reports host pids, which a process in a container's
//! pid namespace cannot map to its own, and the list would show other tenants' processes. The
//! region knows every limited process of the container by the pid the container sees, and its
//! charge is what the limit counts, so `nvidia-smi` inside the container adds up to the `used` of
//! `nvmlDeviceGetMemoryInfo`. Processes of the container that run without the limiter are not
//! listed (the agent flags them as bypassing it). Slots of another pid namespace are left out:
//! their pids mean nothing here. Devices without a limit pass the driver's answer through.

use std::ffi::c_uint;

use limiter_core::accounting::Accounting as _;

use crate::{
    hooks::gate::with_nvml,
    platform::nvml::{
        NOT_AVAILABLE, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT,
        NVML_ERROR_UNINITIALIZED, NVML_SUCCESS, Nvml, NvmlDevice, NvmlProcessInfo,
        NvmlProcessInfoV1, NvmlReturn, Ordinal, ordinal,
    },
    runtime::{self, process::Process, state::State},
};

/// The container's processes on the CUDA device behind `dev`, as `(pid, charged bytes)`;
/// `None` when that device has no memory limit (the driver's list stands).
fn container_processes(
    state: &State,
    process: Option<&Process>,
    nvml: &Nvml,
    dev: NvmlDevice,
) -> Option<Vec<(u32, u64)>> {
    let Ordinal::Cuda(d) = ordinal(state.driver, nvml, dev)? else {
        return None;
    };
    match (state.region(), process) {
        (Some(region), _) => {
            let device = u32::try_from(d).ok()?;
            if region.limit(device) == 0 {
                return None;
            }
            let own_ns = tenant_fs::own_pid_namespace().unwrap_or(0);
            Some(
                region
                    .holdings(device)
                    .into_iter()
                    .filter(|h| h.pid_ns == own_ns || h.pid_ns == 0 || own_ns == 0)
                    .map(|h| (h.pid, h.held))
                    .collect(),
            )
        }
        (None, Some(p)) => {
            p.ledger.limit(d)?;
            let used = p.ledger.used(d);
            Some(if used > 0 {
                vec![(std::process::id(), used)]
            } else {
                Vec::new()
            })
        }
        (None, None) => {
            state.config.memory_limit.get(d).copied()??;
            Some(Vec::new())
        }
    }
}

/// Answers the list call: asks the driver first (its errors, such as an invalid handle, stand),
/// then replaces the entries with the container's when the device is limited.
///
/// # Safety
/// `count` and `infos` follow NVML's contract: `*count` entries writable at `infos`.
unsafe fn answer<T: Copy>(
    dev: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    real: unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut T) -> NvmlReturn,
    entry: impl Fn(u32, u64, Option<&T>) -> T,
) -> NvmlReturn {
    if count.is_null() {
        // SAFETY: forwards the caller's arguments; the driver answers the invalid argument.
        return unsafe { real(dev, count, infos) };
    }
    // SAFETY: the caller's valid `count`.
    let capacity = unsafe { *count };
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(dev, count, infos) };
    if r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE {
        return r;
    }
    let Some(Some(list)) = with_nvml(|s, p, n| container_processes(s, p, n, dev)) else {
        return r;
    };
    // The driver's first entry (if it wrote one) lends its MIG instance ids to ours.
    // SAFETY: on success the driver wrote `*count` (<= capacity) entries at `infos`.
    let template =
        (r == NVML_SUCCESS && !infos.is_null() && unsafe { *count } > 0).then(|| unsafe { *infos });
    let needed = list.len() as c_uint;
    // SAFETY: the caller's valid `count`.
    unsafe { *count = needed };
    if needed > capacity {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if needed > 0 && infos.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (i, &(pid, bytes)) in list.iter().enumerate() {
        // SAFETY: i < needed <= capacity entries the caller provided.
        unsafe { infos.add(i).write(entry(pid, bytes, template.as_ref())) };
    }
    NVML_SUCCESS
}

fn entry_v1(pid: u32, bytes: u64, _: Option<&NvmlProcessInfoV1>) -> NvmlProcessInfoV1 {
    NvmlProcessInfoV1 {
        pid,
        used_gpu_memory: bytes,
    }
}

fn entry_v2(pid: u32, bytes: u64, template: Option<&NvmlProcessInfo>) -> NvmlProcessInfo {
    NvmlProcessInfo {
        pid,
        used_gpu_memory: bytes,
        gpu_instance_id: template.map_or(NOT_AVAILABLE, |t| t.gpu_instance_id),
        compute_instance_id: template.map_or(NOT_AVAILABLE, |t| t.compute_instance_id),
    }
}

macro_rules! process_list_hook {
    ($name:ident, $field:ident, $info:ty, $entry:ident) => {
        /// # Safety
        /// The caller follows the contract of NVML's function of this name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            device: NvmlDevice,
            count: *mut c_uint,
            infos: *mut $info,
        ) -> NvmlReturn {
            let Some(real) = runtime::get().nvml().and_then(|n| n.$field) else {
                return NVML_ERROR_UNINITIALIZED;
            };
            // SAFETY: the caller's arguments under NVML's contract, as `answer` requires.
            unsafe { answer(device, count, infos, real, $entry) }
        }
    };
}

process_list_hook!(
    nvmlDeviceGetComputeRunningProcesses,
    processes_v1,
    NvmlProcessInfoV1,
    entry_v1
);
process_list_hook!(
    nvmlDeviceGetComputeRunningProcesses_v2,
    processes_v2,
    NvmlProcessInfo,
    entry_v2
);
process_list_hook!(
    nvmlDeviceGetComputeRunningProcesses_v3,
    processes_v3,
    NvmlProcessInfo,
    entry_v2
);
