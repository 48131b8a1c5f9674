//! The options of the eBPF probes, in plain data that the commands fill in from their flags and
//! hand to the collector, which starts the probes with them (commands never drive the probes
//! themselves).

use std::{path::PathBuf, time::Duration};

use crate::{host::HostPaths, model::probing::LaunchProbes};

/// What the probes attach, sample and write: the collector starts its probe session with these.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// Libraries to attach besides the discovered ones.
    pub extra_libcuda: Vec<PathBuf>,
    pub launches: LaunchProbes,
    pub calibrate: bool,
    pub host: HostPaths,
    /// Span events for sampled calls (`None`: the probes write none).
    pub spans: Option<SpanSampling>,
    /// Sample launches (unless they are `Off` or `On`), synchronisations and copies in windows
    /// under this cost budget (`probes::sampling` keeps to it).
    pub budget: Option<Budget>,
    /// The shares of the kernel maps one process or cgroup may hold.
    pub quotas: MapQuotas,
}

/// Which calls the probes write span events for (`SPANS` ring buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanSampling {
    /// Calls at least this slow, ns (0: none by latency). NCCL calls are always written.
    pub slow_ns: u64,
    /// One in this many of the other calls, per CPU (0: none).
    pub sample_every: u64,
}

/// The shares of the kernel maps that all processes share (set at load time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapQuotas {
    /// Live allocations tracked per process (`ALLOC_QUOTA`).
    pub allocs_per_process: u64,
    /// Rows per cgroup in `STATS`, `NCCL_STATS` and `ALLOC_SIZES` together (`ROW_QUOTA`).
    pub rows_per_cgroup: u64,
}

impl Default for MapQuotas {
    fn default() -> MapQuotas {
        MapQuotas {
            allocs_per_process: agent_common::maps::ALLOC_QUOTA_DEFAULT,
            rows_per_cgroup: agent_common::maps::ROW_QUOTA_DEFAULT,
        }
    }
}

/// How much probe cost the sampled kinds may add.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Share of a process's wall time (0.01 = 1%).
    pub share: f64,
    /// How long each window lasts.
    pub window: Duration,
}
