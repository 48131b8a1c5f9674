//! The GPU figures a snapshot carries per process: NVML's busy time and the window its latest
//! percentages cover, and the GPU time the limiter measured (see `gpu_use` for what is made of
//! them).

use serde::{Deserialize, Serialize};

/// The span of time one reading covers, CPU time (`CLOCK_REALTIME`) in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UseWindow {
    pub from_unix_us: u64,
    pub to_unix_us: u64,
    /// The driver's sample period as estimated (see the module documentation).
    pub sample_period_us: u64,
}

impl UseWindow {
    pub fn micros(&self) -> u64 {
        self.to_unix_us.saturating_sub(self.from_unix_us)
    }
}

/// Cumulative busy time of a process on a device while the agent watched it, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    /// SM busy time (utilisation x time).
    pub sm_us: u64,
    /// Memory-controller busy time (memory bandwidth utilisation x time).
    pub mem_us: u64,
    /// Time the device's samples covered while the process was watched.
    pub observed_us: u64,
}

impl Busy {
    /// The difference `self - earlier` (saturating: the counters never go back).
    pub fn since(&self, earlier: Option<&Busy>) -> Busy {
        let e = earlier.copied().unwrap_or_default();
        Busy {
            sm_us: self.sm_us.saturating_sub(e.sm_us),
            mem_us: self.mem_us.saturating_sub(e.mem_us),
            observed_us: self.observed_us.saturating_sub(e.observed_us),
        }
    }

    pub fn add(&mut self, o: &Busy) {
        self.sm_us += o.sm_us;
        self.mem_us += o.mem_us;
        self.observed_us += o.observed_us;
    }
}

/// GPU time one process's launches took on one device, as the limiter measured it
/// (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimiterGpuTime {
    pub device: u32,
    /// All launches' GPU time, estimated from the samples, ns.
    pub estimated_ns: u64,
    /// The sampled launches' own GPU time, ns.
    pub sampled_ns: u64,
    pub samples: u64,
    /// Launches the samples stand for.
    pub launches: u64,
    /// Share of the latest interval between snapshots the process kept the device busy
    /// (`None`: the first snapshot it is in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_ratio: Option<f64>,
}

impl LimiterGpuTime {
    /// The difference `self - earlier` (saturating).
    pub fn since(&self, earlier: Option<&LimiterGpuTime>) -> LimiterGpuTime {
        let e = earlier.copied().unwrap_or_default();
        LimiterGpuTime {
            device: self.device,
            estimated_ns: self.estimated_ns.saturating_sub(e.estimated_ns),
            sampled_ns: self.sampled_ns.saturating_sub(e.sampled_ns),
            samples: self.samples.saturating_sub(e.samples),
            launches: self.launches.saturating_sub(e.launches),
            busy_ratio: self.busy_ratio,
        }
    }
}

/// GPU time of one kernel name in a process (cumulative), as the limiter measured it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelTime {
    /// The kernel's name as the driver gave it (at most 64 bytes, made inert; `"graph"` for
    /// graph launches; `"other"` for kernels past the limiter's table).
    pub name: String,
    /// The driver's name was longer and is cut.
    #[serde(default)]
    pub truncated: bool,
    pub estimated_ns: u64,
    pub samples: u64,
    pub launches: u64,
}
