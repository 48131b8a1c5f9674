//! The NVML calls the agent makes, as a trait the real library and the tests' fakes implement.

use nvml_wrapper::error::NvmlError;

/// One process's memory on a device, as NVML's running-process lists give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub used: Option<u64>,
}

/// One process utilisation sample, as the limiter's SM correction reads them too.
pub use limiter_core::sm::samples::ProcessSample;

/// The NVML calls the agent makes, by device index.
pub trait NvmlBackend {
    fn driver_version(&self) -> Result<String, NvmlError>;
    /// As NVML encodes it: 1000 * major + 10 * minor.
    fn cuda_driver_version(&self) -> Result<i32, NvmlError>;
    fn device_count(&self) -> Result<u32, NvmlError>;
    fn uuid(&self, index: u32) -> Result<String, NvmlError>;
    fn name(&self, index: u32) -> Result<String, NvmlError>;
    /// (GPU, memory) utilisation in percent.
    fn utilization_pct(&self, index: u32) -> Result<(u32, u32), NvmlError>;
    /// (used, total) bytes.
    fn memory_used_total(&self, index: u32) -> Result<(u64, u64), NvmlError>;
    fn power_mw(&self, index: u32) -> Result<u32, NvmlError>;
    fn power_limit_mw(&self, index: u32) -> Result<u32, NvmlError>;
    fn temperature_c(&self, index: u32) -> Result<u32, NvmlError>;
    fn compute_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError>;
    fn graphics_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError>;
    /// Samples taken after `since` (all buffered samples for `None`); `NVML_ERROR_NOT_FOUND`
    /// when there are none.
    fn process_utilization(
        &self,
        index: u32,
        since: Option<u64>,
    ) -> Result<Vec<ProcessSample>, NvmlError>;
}
