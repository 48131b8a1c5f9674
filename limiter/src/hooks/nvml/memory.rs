//! `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2` under the limit: `total = min(limit,
//! device total)`, `used` = what the container has reserved on that device (the region's counter;
//! this process's with in-process accounting), context charges included from the moment the
//! contexts exist, plus the calling process's own context charge where the limit had no room for
//! it, and `free = total - used` (saturating): what can still be allocated. `_v2`'s
//! `version` and `reserved` are left as NVML wrote them.

use limiter_core::{accounting::Accounting as _, info::nvml_memory};

use crate::{
    hooks::gate::with_nvml,
    platform::nvml::{
        NVML_ERROR_UNINITIALIZED, NVML_SUCCESS, Nvml, NvmlDevice, NvmlMemory, NvmlMemoryV2,
        NvmlReturn, Ordinal, ordinal,
    },
    runtime::{self, process::Process, state::State},
};

/// `(total, free, used)` under the limit of the CUDA device behind `dev`, if it has one.
fn limited(
    state: &State,
    process: Option<&Process>,
    nvml: &Nvml,
    dev: NvmlDevice,
    total: u64,
) -> Option<(u64, u64, u64)> {
    let Ordinal::Cuda(d) = ordinal(state.driver, nvml, dev)? else {
        return None;
    };
    let pending = process.map_or(0, |p| p.context_pending(d));
    let (limit, used) = match (state.region(), process) {
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
    Some(nvml_memory(limit, used.saturating_add(pending), total))
}

/// # Safety
/// The caller follows the contract of NVML's `nvmlDeviceGetMemoryInfo`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    let Some(real) = runtime::get().nvml().and_then(|n| n.memory_info) else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(device, memory) };
    if r == NVML_SUCCESS && !memory.is_null() {
        // SAFETY: NVML succeeded and filled the caller's struct.
        let total = unsafe { (*memory).total };
        if let Some(Some((t, f, u))) = with_nvml(|s, p, n| limited(s, p, n, device, total)) {
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
pub(crate) unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    let Some(real) = runtime::get().nvml().and_then(|n| n.memory_info_v2) else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwards the caller's arguments unchanged.
    let r = unsafe { real(device, memory) };
    if r == NVML_SUCCESS && !memory.is_null() {
        // SAFETY: NVML succeeded and filled the caller's struct.
        let total = unsafe { (*memory).total };
        if let Some(Some((t, f, u))) = with_nvml(|s, p, n| limited(s, p, n, device, total)) {
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
