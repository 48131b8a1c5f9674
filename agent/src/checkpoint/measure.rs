//! The GPUs' per-process device memory as the agent measures it (NVML), never as a tenant says
//! it: what bounds a freeze's waits and checks its answers (`freeze`'s in-process path). Here,
//! beside the checkpoint API's other NVML reads (`room`), so that the commands reach NVML
//! through this one narrow module.

use std::{path::Path, sync::Arc};

use crate::nvml::{
    NvmlBackend,
    library::{DEFAULT_LIBRARY, NvmlLibrary},
};

/// One GPU as NVML lists it now: its memory and the processes with a context on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    /// Its total memory (`None`: not read).
    pub total: Option<u64>,
    /// Each process (host pid) and the device memory it uses there (`None`: NVML gives no
    /// figure, as under MIG without the rights).
    pub processes: Vec<(u32, Option<u64>)>,
}

/// The GPUs' per-process memory as the agent measures it, never as a tenant says it.
pub trait Measure: Send {
    /// Every GPU now; `None`: not read (no NVML, or a call failed).
    fn read(&self) -> Option<Vec<GpuUse>>;
}

/// [`Measure`] from NVML.
pub struct NvmlUse(pub Arc<dyn NvmlBackend + Send + Sync>);

impl Measure for NvmlUse {
    fn read(&self) -> Option<Vec<GpuUse>> {
        (0..self.0.device_count().ok()?)
            .map(|i| {
                let processes = self.0.compute_processes(i).ok()?;
                Some(GpuUse {
                    total: self.0.memory_used_total(i).ok().map(|(_, t)| t),
                    processes: processes.into_iter().map(|p| (p.pid, p.used)).collect(),
                })
            })
            .collect()
    }
}

/// The host's NVML as a [`Measure`] (`None`: not loaded).
pub fn nvml() -> Option<Box<dyn Measure>> {
    let nvml = NvmlLibrary::open(Path::new(DEFAULT_LIBRARY)).ok()?;
    Some(Box::new(NvmlUse(Arc::new(nvml))))
}
