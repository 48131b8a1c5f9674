//! Per-process SM utilisation from the real NVML (`nvmlDeviceGetProcessUtilization`), for the SM
//! feedback loop (`runtime::sm_feedback`). Only the loop's thread calls this; the hooks never do.

use std::ffi::{CString, c_uint};

use super::{
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND, NVML_SUCCESS, Nvml, NvmlDevice, NvmlReturn,
    PfnProcessUtilization, ProcessSample, uuid_string,
};
use crate::platform::driver::Driver;

/// At most this many samples are read per call (NVML keeps a short per-device buffer).
const MAX_SAMPLES: usize = 1024;

/// Why per-process utilisation cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UtilError {
    #[error("the real NVML library could not be loaded")]
    NoLibrary,
    #[error("NVML lacks {0}")]
    NoSymbol(&'static str),
    #[error("nvmlInit_v2 failed ({0})")]
    Init(NvmlReturn),
    #[error("nvmlDeviceGetProcessUtilization failed ({0})")]
    Sample(NvmlReturn),
}

/// An NVML device handle obtained from [`Sampler::handle`] (so it is one NVML gave out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle(NvmlDevice);

/// The bound, initialised NVML.
#[derive(Debug)]
pub(crate) struct Sampler {
    nvml: Nvml,
    utilization: PfnProcessUtilization,
}

impl Sampler {
    /// Binds the real NVML and initialises it (`nvmlInit_v2` is reference-counted: the
    /// application's own init and shutdown are not disturbed).
    pub(crate) fn open(nvml: Option<Nvml>) -> Result<Sampler, UtilError> {
        let nvml = nvml.ok_or(UtilError::NoLibrary)?;
        let utilization = nvml
            .process_utilization
            .ok_or(UtilError::NoSymbol("nvmlDeviceGetProcessUtilization"))?;
        let init = nvml.init.ok_or(UtilError::NoSymbol("nvmlInit_v2"))?;
        // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
        let r = unsafe { init() };
        if r != NVML_SUCCESS {
            return Err(UtilError::Init(r));
        }
        Ok(Sampler { nvml, utilization })
    }

    /// The NVML handle of CUDA device `device`: by UUID (`cuDeviceGetUuid_v2`), else by index.
    pub(crate) fn handle(&self, driver: &Driver, device: usize) -> Option<Handle> {
        let mut h: NvmlDevice = std::ptr::null_mut();
        if let (Some(u), Some(by_uuid)) = (driver.uuid(device), self.nvml.by_uuid) {
            let name = CString::new(uuid_string(&u)).ok()?;
            // SAFETY: a NUL-terminated UUID and a valid out-pointer.
            if unsafe { by_uuid(name.as_ptr(), &mut h) } == NVML_SUCCESS && !h.is_null() {
                return Some(Handle(h));
            }
        }
        let by_index = self.nvml.by_index?;
        // SAFETY: a valid out-pointer.
        let r = unsafe { by_index(c_uint::try_from(device).ok()?, &mut h) };
        (r == NVML_SUCCESS && !h.is_null()).then_some(Handle(h))
    }

    /// Appends the samples newer than `last_seen` (microseconds; 0: all NVML holds) to `out`.
    pub(crate) fn samples(
        &self,
        Handle(dev): Handle,
        last_seen: u64,
        out: &mut Vec<ProcessSample>,
    ) -> Result<(), UtilError> {
        let mut count: c_uint = 0;
        // SAFETY: a handle NVML gave out; NULL samples asks for the count only; `count` is a valid
        // out-pointer.
        let r = unsafe { (self.utilization)(dev, std::ptr::null_mut(), &mut count, last_seen) };
        match r {
            NVML_ERROR_NOT_FOUND => return Ok(()),
            NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => {}
            e => return Err(UtilError::Sample(e)),
        }
        // Room for processes that appear between the two calls.
        let mut room = (count as usize + 8).min(MAX_SAMPLES);
        for _ in 0..2 {
            let start = out.len();
            out.resize(start + room, ProcessSample::default());
            let mut n = room as c_uint;
            // SAFETY: a handle NVML gave out; `n` entries of writable, initialised samples at
            // `out[start..]`.
            let r =
                unsafe { (self.utilization)(dev, out[start..].as_mut_ptr(), &mut n, last_seen) };
            match r {
                NVML_SUCCESS => {
                    out.truncate(start + (n as usize).min(room));
                    return Ok(());
                }
                NVML_ERROR_NOT_FOUND => {
                    out.truncate(start);
                    return Ok(());
                }
                NVML_ERROR_INSUFFICIENT_SIZE => {
                    out.truncate(start);
                    room = (n as usize + 8).min(MAX_SAMPLES);
                }
                e => {
                    out.truncate(start);
                    return Err(UtilError::Sample(e));
                }
            }
        }
        Err(UtilError::Sample(NVML_ERROR_INSUFFICIENT_SIZE))
    }
}
