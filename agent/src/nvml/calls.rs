//! What NVML costs the agent: every query to the driver is timed, per kind of query, so that
//! the cost of watching a GPU can be read off a running daemon (`agent.nvml_calls`, and
//! `vgpu_agent_nvml_call_duration_seconds_total` in /metrics).
//!
//! The kinds are a fixed set ([`NvmlCall::ALL`]): the labels they give /metrics are bounded.

use std::time::{Duration, Instant};

/// One kind of query the agent makes to NVML. A query may be more than one NVML function:
/// every per-device query also looks the device's handle up (`nvmlDeviceGetHandleByIndex_v2`),
/// and the list queries ask for the count first, then the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NvmlCall {
    /// Loading the library and `nvmlInit_v2`.
    Init,
    DriverVersion,
    CudaDriverVersion,
    DeviceCount,
    Uuid,
    Name,
    Utilization,
    Memory,
    Power,
    PowerLimit,
    Temperature,
    ComputeProcesses,
    GraphicsProcesses,
    ProcessUtilization,
}

impl NvmlCall {
    pub const ALL: [NvmlCall; 14] = [
        NvmlCall::Init,
        NvmlCall::DriverVersion,
        NvmlCall::CudaDriverVersion,
        NvmlCall::DeviceCount,
        NvmlCall::Uuid,
        NvmlCall::Name,
        NvmlCall::Utilization,
        NvmlCall::Memory,
        NvmlCall::Power,
        NvmlCall::PowerLimit,
        NvmlCall::Temperature,
        NvmlCall::ComputeProcesses,
        NvmlCall::GraphicsProcesses,
        NvmlCall::ProcessUtilization,
    ];

    /// The name the model and /metrics use.
    pub fn name(self) -> &'static str {
        match self {
            NvmlCall::Init => "init",
            NvmlCall::DriverVersion => "driver_version",
            NvmlCall::CudaDriverVersion => "cuda_driver_version",
            NvmlCall::DeviceCount => "device_count",
            NvmlCall::Uuid => "uuid",
            NvmlCall::Name => "name",
            NvmlCall::Utilization => "utilization",
            NvmlCall::Memory => "memory",
            NvmlCall::Power => "power",
            NvmlCall::PowerLimit => "power_limit",
            NvmlCall::Temperature => "temperature",
            NvmlCall::ComputeProcesses => "compute_processes",
            NvmlCall::GraphicsProcesses => "graphics_processes",
            NvmlCall::ProcessUtilization => "process_utilization",
        }
    }

    /// The NVML functions behind the query (docs/metrics.md lists them; a test checks it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn functions(self) -> &'static str {
        match self {
            NvmlCall::Init => "dlopen, nvmlInit_v2",
            NvmlCall::DriverVersion => "nvmlSystemGetDriverVersion",
            NvmlCall::CudaDriverVersion => "nvmlSystemGetCudaDriverVersion_v2",
            NvmlCall::DeviceCount => "nvmlDeviceGetCount_v2",
            NvmlCall::Uuid => "nvmlDeviceGetUUID",
            NvmlCall::Name => "nvmlDeviceGetName",
            NvmlCall::Utilization => "nvmlDeviceGetUtilizationRates",
            NvmlCall::Memory => "nvmlDeviceGetMemoryInfo_v2",
            NvmlCall::Power => "nvmlDeviceGetPowerUsage",
            NvmlCall::PowerLimit => "nvmlDeviceGetEnforcedPowerLimit",
            NvmlCall::Temperature => "nvmlDeviceGetTemperature",
            NvmlCall::ComputeProcesses => "nvmlDeviceGetComputeRunningProcesses_v3 (twice)",
            NvmlCall::GraphicsProcesses => "nvmlDeviceGetGraphicsRunningProcesses_v3 (twice)",
            NvmlCall::ProcessUtilization => "nvmlDeviceGetProcessUtilization (twice)",
        }
    }

    fn slot(self) -> usize {
        NvmlCall::ALL
            .iter()
            .position(|c| *c == self)
            .expect("every call is in ALL")
    }
}

/// The queries of one kind made so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTally {
    pub calls: u64,
    /// Nanoseconds in all of them, failures included.
    pub total_ns: u64,
    /// The longest one.
    pub max_ns: u64,
}

/// The queries made since the source was created, per kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallTimes([CallTally; NvmlCall::ALL.len()]);

impl CallTimes {
    pub fn add(&mut self, call: NvmlCall, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let t = &mut self.0[call.slot()];
        t.calls += 1;
        t.total_ns = t.total_ns.saturating_add(ns);
        t.max_ns = t.max_ns.max(ns);
    }

    /// Runs `query` and counts the time it took as a `call`.
    pub fn time<T>(&mut self, call: NvmlCall, query: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = query();
        self.add(call, started.elapsed());
        out
    }

    pub fn get(&self, call: NvmlCall) -> CallTally {
        self.0[call.slot()]
    }

    /// Every kind, in [`NvmlCall::ALL`]'s order, those not made yet with zeros.
    pub fn iter(&self) -> impl Iterator<Item = (NvmlCall, CallTally)> + '_ {
        NvmlCall::ALL.iter().map(|c| (*c, self.get(*c)))
    }
}
