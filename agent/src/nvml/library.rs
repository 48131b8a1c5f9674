//! The real [`NvmlBackend`]: `libnvidia-ml.so.1` through nvml-wrapper, which `dlopen`s it when
//! NVML is initialised.

use std::{ffi::OsStr, path::Path};

use nvml_wrapper::{
    Nvml, enum_wrappers::device::TemperatureSensor, enums::device::UsedGpuMemory, error::NvmlError,
    struct_wrappers::device::ProcessInfo,
};

use super::backend::{NvmlBackend, ProcessMemory, ProcessSample};

/// The library the driver installs; the unversioned `libnvidia-ml.so` (nvml-wrapper's default)
/// only exists where the development package is installed.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

pub struct NvmlLibrary {
    nvml: Nvml,
}

impl NvmlLibrary {
    /// Loads NVML from `library` (a name the loader searches for, or a path) and initialises it.
    pub fn open(library: &Path) -> Result<NvmlLibrary, NvmlError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library.as_os_str()))
            .init()?;
        Ok(NvmlLibrary { nvml })
    }
}

fn memory_of(p: ProcessInfo) -> ProcessMemory {
    ProcessMemory {
        pid: p.pid,
        used: match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        },
    }
}

impl NvmlBackend for NvmlLibrary {
    fn driver_version(&self) -> Result<String, NvmlError> {
        self.nvml.sys_driver_version()
    }

    fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
        self.nvml.sys_cuda_driver_version()
    }

    fn device_count(&self) -> Result<u32, NvmlError> {
        self.nvml.device_count()
    }

    fn uuid(&self, index: u32) -> Result<String, NvmlError> {
        self.nvml.device_by_index(index)?.uuid()
    }

    fn name(&self, index: u32) -> Result<String, NvmlError> {
        self.nvml.device_by_index(index)?.name()
    }

    fn utilization_pct(&self, index: u32) -> Result<(u32, u32), NvmlError> {
        let u = self.nvml.device_by_index(index)?.utilization_rates()?;
        Ok((u.gpu, u.memory))
    }

    fn memory_used_total(&self, index: u32) -> Result<(u64, u64), NvmlError> {
        let m = self.nvml.device_by_index(index)?.memory_info()?;
        Ok((m.used, m.total))
    }

    fn power_mw(&self, index: u32) -> Result<u32, NvmlError> {
        self.nvml.device_by_index(index)?.power_usage()
    }

    fn power_limit_mw(&self, index: u32) -> Result<u32, NvmlError> {
        self.nvml.device_by_index(index)?.enforced_power_limit()
    }

    fn temperature_c(&self, index: u32) -> Result<u32, NvmlError> {
        self.nvml
            .device_by_index(index)?
            .temperature(TemperatureSensor::Gpu)
    }

    fn compute_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        Ok(device
            .running_compute_processes()?
            .into_iter()
            .map(memory_of)
            .collect())
    }

    fn graphics_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        Ok(device
            .running_graphics_processes()?
            .into_iter()
            .map(memory_of)
            .collect())
    }

    fn process_utilization(
        &self,
        index: u32,
        since: Option<u64>,
    ) -> Result<Vec<ProcessSample>, NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        // nvml-wrapper asks for the count, then the samples: a process that appears in between
        // makes the second call fail with "insufficient size". Ask again, once.
        let samples = match device.process_utilization_stats(since) {
            Err(NvmlError::InsufficientSize(_)) => device.process_utilization_stats(since),
            other => other,
        }?;
        Ok(samples
            .into_iter()
            .map(|s| ProcessSample {
                pid: s.pid,
                timestamp_us: s.timestamp,
                sm_util_pct: s.sm_util,
                mem_util_pct: s.mem_util,
            })
            .collect())
    }
}
