//! Every metric the agent exports: name, type, unit, labels and help, in one table that the
//! exporter, `docs/metrics.md` and the dashboard tests all read.
//!
//! **How much a node exports.** By default a container's API series go per API kind
//! ([`KINDS`]): calls, errors, bytes and time per (container, kind, source), and the latency
//! distribution per kind for the whole node ([`NODE_LATENCY`]). `--metrics-per-api` adds the
//! `api` label to the API families and a latency histogram per container and API
//! ([`API_LATENCY`]); `--metrics-pid-labels` adds per-process families.
// The names, sources and the whole list are read by the docs and dashboard tests, not the binary.
#![cfg_attr(not(test), allow(dead_code))]

/// The labels every per-container series carries.
pub const CONTAINER_LABELS: &[&str] = &["container", "pod", "namespace"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Bytes,
    Ratio,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Seconds => "seconds",
            Unit::Bytes => "bytes",
            Unit::Ratio => "ratio",
        }
    }
}

/// One metric family.
#[derive(Clone, Copy, Debug)]
pub struct Def {
    /// The family's name without the unit and `_total` suffixes.
    pub base: &'static str,
    pub kind: Type,
    pub unit: Option<Unit>,
    /// Labels besides [`CONTAINER_LABELS`] where `per_container`.
    pub labels: &'static [&'static str],
    pub per_container: bool,
    pub help: &'static str,
    /// Where the figure comes from in the model (for docs/metrics.md).
    pub source: &'static str,
    /// When the family is exported.
    pub only: Only,
}

/// When a family is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// Always.
    Always,
    /// Only with `--metrics-per-api`.
    PerApi,
    /// Only with `--metrics-pid-labels`.
    PidLabels,
}

impl Only {
    /// The flag that turns the family on (for docs/metrics.md).
    pub fn flag(self) -> Option<&'static str> {
        match self {
            Only::Always => None,
            Only::PerApi => Some("--metrics-per-api"),
            Only::PidLabels => Some("--metrics-pid-labels"),
        }
    }
}

impl Def {
    /// The name of the family as exposed (`base` + `_unit`).
    pub fn family(&self) -> String {
        match self.unit {
            Some(u) => format!("{}_{}", self.base, u.as_str()),
            None => self.base.to_owned(),
        }
    }

    /// The sample names Prometheus stores for this family.
    pub fn series_names(&self) -> Vec<String> {
        let f = self.family();
        match self.kind {
            Type::Counter => vec![format!("{f}_total")],
            Type::Gauge => vec![f],
            Type::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{f}{s}"))
                .collect(),
        }
    }
}

const fn def(
    base: &'static str,
    kind: Type,
    unit: Option<Unit>,
    per_container: bool,
    labels: &'static [&'static str],
    help: &'static str,
    source: &'static str,
) -> Def {
    Def {
        base,
        kind,
        unit,
        labels,
        per_container,
        help,
        source,
        only: Only::Always,
    }
}

const fn per_process(d: Def) -> Def {
    Def {
        only: Only::PidLabels,
        ..d
    }
}

const fn per_api(d: Def) -> Def {
    Def {
        only: Only::PerApi,
        ..d
    }
}

/// The label that only `--metrics-per-api` adds (the API families carry it then).
pub const API_LABEL: &str = "api";

/// The values of the `kind` label: the API kinds of `agent_common::api::ApiKind`, with
/// `lifecycle` and `info` (driver and context lifecycle, memory queries) as `other`.
pub const KINDS: &[&str] = &["alloc", "free", "launch", "sync", "copy", "nccl", "other"];

/// The `kind` label of an API kind of the model.
pub fn kind_label(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

use Type::{Counter, Gauge, Histogram};
use Unit::{Bytes, Ratio, Seconds};

const API: &[&str] = &["api", "kind", "source"];
const PID: &[&str] = &["pid", "comm", "api", "kind", "source"];

pub const CONTAINER_MEMORY_USED: Def = def(
    "vgpu_container_memory_used",
    Gauge,
    Some(Bytes),
    true,
    &["device", "view"],
    "GPU memory used by the container's processes, by view: limiter (held in the region, context included), nvml (the driver's per-process usage), probes (live allocations the probes saw; device empty: not known per device).",
    "processes[].limiter.held[device], processes[].nvml[].used_memory, processes[].memory.probes (alive processes)",
);
pub const CONTAINER_MEMORY_LIMIT: Def = def(
    "vgpu_container_memory_limit",
    Gauge,
    Some(Bytes),
    true,
    &["device"],
    "The container's GPU memory limit from its region (absent when unlimited).",
    "containers[].regions[].devices[].memory_limit (> 0)",
);
pub const CONTAINER_MEMORY_RESERVED: Def = def(
    "vgpu_container_memory_reserved",
    Gauge,
    Some(Bytes),
    true,
    &["device"],
    "GPU memory reserved against the container's limit in its region (context included).",
    "containers[].regions[].devices[].reserved",
);
pub const CONTAINER_SM_LIMIT: Def = def(
    "vgpu_container_sm_limit",
    Gauge,
    Some(Ratio),
    true,
    &["device"],
    "The container's SM share limit (0..1; absent when unlimited).",
    "containers[].regions[].devices[].sm_limit_pct / 100",
);
pub const CONTAINER_QOS_ALLOCATED: Def = def(
    "vgpu_container_qos_allocated",
    Gauge,
    Some(Ratio),
    true,
    &["device", "tier"],
    "The share of the device the container's QoS tier is allocated now (0..1; docs/qos.md); absent without a tier.",
    "containers[].regions[].devices[].qos.allocated",
);
pub const CONTAINER_QOS_GUARANTEE: Def = def(
    "vgpu_container_qos_guarantee",
    Gauge,
    Some(Ratio),
    true,
    &["device"],
    "The share of the device guaranteed to the container (0..1; the guaranteed tier only).",
    "containers[].regions[].devices[].qos.guarantee",
);
pub const CONTAINER_QOS_SHORT: Def = def(
    "vgpu_container_qos_guarantee_short",
    Gauge,
    None,
    true,
    &["device"],
    "1 while the container wants its guaranteed share and is allocated less (the guarantees on the device add up to more than it), else 0; the guaranteed tier only.",
    "containers[].regions[].devices[].qos.short",
);
pub const CONTAINER_SM_UTILIZATION: Def = def(
    "vgpu_container_sm_utilization",
    Gauge,
    Some(Ratio),
    true,
    &["device"],
    "Share of the device's time the container's processes kept its SMs busy in the latest NVML sample window (1 = the whole device), with or without a limit; absent where the device gives no per-process utilisation (MIG, vGPU).",
    "sum of processes[].nvml[].sm_util_pct / 100 per device (agent/src/model/gpu_use.rs)",
);
pub const CONTAINER_GPU_BUSY: Def = def(
    "vgpu_container_gpu_busy",
    Gauge,
    Some(Ratio),
    true,
    &["device", "source"],
    "Share of the device's time the container's processes kept it busy, by source: `limiter` (kernel time the limiter timed with sampled event pairs over the latest interval; trust this one on a shared GPU) or `nvml` (NVML's per-process samples, which go to whichever tenant was running when sampled: 16.0% and 34.2% true shares read as 10.1% and 43.3% on an H100).",
    "processes[].limiter.gpu_time[].busy_ratio summed (limiter); as vgpu_container_sm_utilization (nvml)",
);
pub const CONTAINER_KERNEL_TIME: Def = def(
    "vgpu_container_kernel",
    Counter,
    Some(Seconds),
    true,
    &["kernel"],
    "GPU time of the container's kernels as the limiter timed them (sampled, estimated for all launches), its top 8 kernel names by time and the rest as `other` (graph launches as `graph`); names are the tenant's, at most 64 bytes.",
    "processes[].limiter.kernels[].estimated_ns summed by name",
);
pub const CONTAINER_MEMORY_BANDWIDTH_UTILIZATION: Def = def(
    "vgpu_container_memory_bandwidth_utilization",
    Gauge,
    Some(Ratio),
    true,
    &["device"],
    "Share of the device's time the container's processes kept its memory controller busy (memory bandwidth) in the latest NVML sample window.",
    "sum of processes[].nvml[].mem_util_pct / 100 per device",
);
pub const CONTAINER_DENIED: Def = def(
    "vgpu_container_allocations_denied",
    Counter,
    None,
    true,
    &["device"],
    "Allocations the limiter denied to the container, as its region counts them.",
    "containers[].regions[].devices[].denied",
);
pub const CONTAINER_ALLOCATIONS: Def = def(
    "vgpu_container_allocations",
    Gauge,
    None,
    true,
    &[],
    "Live device allocations of the container's processes that the probes track.",
    "processes[].memory.probes_allocations (alive processes)",
);
pub const CONTAINER_PROCESSES: Def = def(
    "vgpu_container_processes",
    Gauge,
    None,
    true,
    &[],
    "GPU processes of the container that are alive.",
    "processes[] with alive",
);
pub const CONTAINER_FROZEN: Def = def(
    "vgpu_container_frozen",
    Gauge,
    None,
    true,
    &[],
    "1 while the container is frozen (vgpu-agent freeze --container, or the daemon's --freeze-after), as a control block of its regions marks it: its device memory is in host memory and its next CUDA call thaws it; 0 for the other containers with a limiter region.",
    "containers[].frozen (present: 1)",
);
pub const CONTAINER_FROZEN_HOST_MEMORY: Def = def(
    "vgpu_container_frozen_host_memory",
    Gauge,
    Some(Bytes),
    true,
    &[],
    "Device bytes a frozen container gave back to the GPU, held in host memory until its thaw (the limiter's count of its processes' memory); frozen containers only.",
    "containers[].frozen.host_bytes",
);
pub const CONTAINER_DRIFT: Def = def(
    "vgpu_container_memory_drift",
    Gauge,
    Some(Bytes),
    true,
    &["between"],
    "Largest disagreement over the drift threshold between two memory views of one process, per pair of views compared for some process of the container (0 when none).",
    "processes[].memory.drift, processes[].memory (the views present)",
);
pub const API_CALLS: Def = def(
    "vgpu_api_calls",
    Counter,
    None,
    true,
    API,
    "CUDA driver and NCCL API calls per kind (NCCL: kind=\"nccl\"); per API with --metrics-per-api.",
    "processes[].apis[].calls (one source per process and API)",
);
pub const API_ERRORS: Def = def(
    "vgpu_api_errors",
    Counter,
    None,
    true,
    API,
    "API calls that returned an error.",
    "processes[].apis[].errors",
);
pub const API_BYTES: Def = def(
    "vgpu_api",
    Counter,
    Some(Bytes),
    true,
    API,
    "Bytes named by API calls: allocation and copy sizes, NCCL payloads (count x datatype size).",
    "processes[].apis[].bytes",
);
pub const API_TIME: Def = def(
    "vgpu_api_time",
    Counter,
    Some(Seconds),
    true,
    API,
    "Time inside API calls (NCCL: the host-side call that enqueues the collective); divided by the calls, the mean latency.",
    "processes[].apis[].total_ns",
);
pub const API_LATENCY: Def = per_api(def(
    "vgpu_api_latency",
    Histogram,
    Some(Seconds),
    true,
    API,
    "Latency of API calls per container and API (NCCL: the host-side call that enqueues the collective).",
    "processes[].apis[].hist (log2 buckets; le = 2^k ns, k = 10, 12, .., 34), total_ns",
));
pub const NODE_LATENCY: Def = def(
    "vgpu_node_api_latency",
    Histogram,
    Some(Seconds),
    false,
    &["kind"],
    "Latency of the node's API calls by kind, every container together (NCCL: the host-side call that enqueues the collective).",
    "processes[].apis[].hist of every container (log2 buckets; le = 2^k ns, k = 10, 12, .., 34), total_ns",
);
pub const API_HOOK: Def = def(
    "vgpu_api_hook",
    Counter,
    Some(Seconds),
    true,
    API,
    "Time the limiter spent inside its own hook on these calls.",
    "processes[].apis[].hook_ns (limiter source)",
);
pub const API_DENIED: Def = def(
    "vgpu_api_denied",
    Counter,
    None,
    true,
    API,
    "Allocation calls the limiter denied (over the limit), as the processes count them.",
    "processes[].apis[].denied (limiter source, kind alloc)",
);
pub const SYNC: Def = def(
    "vgpu_sync",
    Counter,
    Some(Seconds),
    true,
    &[],
    "Time the container's threads spent blocked in synchronisation calls.",
    "sum of processes[].apis[].total_ns of kind sync",
);
pub const THROTTLED: Def = def(
    "vgpu_throttled",
    Counter,
    Some(Seconds),
    true,
    &[],
    "Time the limiter held the container's processes' calls back (SM share; allocations waiting for device memory under VGPU_OOM_WAIT).",
    "processes[].limiter.throttled_ns",
);
pub const PROBE_TIME: Def = def(
    "vgpu_probe_time",
    Counter,
    Some(Seconds),
    true,
    &[],
    "What the agent's eBPF probes cost the container's processes: their probe hits times the calibrated price of a hit in their library (the time the probes added to their calls, budget-sampled or not; `stat`'s probe share).",
    "processes[].probe_seconds",
);
pub const NCCL_COMMUNICATORS: Def = def(
    "vgpu_nccl_communicators",
    Gauge,
    None,
    true,
    &[],
    "NCCL communicators of the container's alive processes that are not destroyed.",
    "processes[].communicators[] (not destroyed)",
);
pub const GPU_MEMORY_USED: Def = def(
    "vgpu_gpu_memory_used",
    Gauge,
    Some(Bytes),
    false,
    &["device"],
    "Device memory used (NVML).",
    "gpus[].memory_used",
);
pub const GPU_MEMORY_TOTAL: Def = def(
    "vgpu_gpu_memory_total",
    Gauge,
    Some(Bytes),
    false,
    &["device"],
    "Device memory (NVML).",
    "gpus[].memory_total",
);
pub const GPU_UTILIZATION: Def = def(
    "vgpu_gpu_utilization",
    Gauge,
    Some(Ratio),
    false,
    &["device"],
    "Device utilisation (NVML, 0..1).",
    "gpus[].utilization_pct / 100",
);
pub const GPU_INFO: Def = def(
    "vgpu_gpu_info",
    Gauge,
    None,
    false,
    &["device", "uuid", "name"],
    "A device (value 1).",
    "gpus[]",
);
pub const FREEZE_HOST_BUDGET: Def = def(
    "vgpu_freeze_host_budget",
    Gauge,
    Some(Bytes),
    false,
    &[],
    "Host bytes frozen containers may hold together (vgpu-agent run --freeze-host-budget); set by vgpu-agent run only.",
    "agent.idle_freeze.host_budget_bytes",
);
pub const FREEZE_HOST_RESERVED: Def = def(
    "vgpu_freeze_host_reserved",
    Gauge,
    Some(Bytes),
    false,
    &[],
    "Host bytes of the freeze budget reserved now: frozen containers' device memory, freezes under way and thaws not yet completed; set by vgpu-agent run only.",
    "agent.idle_freeze.host_reserved_bytes",
);
pub const FREEZE_AFTER: Def = def(
    "vgpu_freeze_after",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "Idle time after which the daemon freezes any container (--freeze-after); absent without it (only containers that ask, by their own VGPU_FREEZE_AFTER, are frozen).",
    "agent.idle_freeze.after_seconds",
);
pub const FREEZE_ON_DEMAND: Def = def(
    "vgpu_freeze_on_demand",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "Idle time after which the daemon may freeze a container to make room for another's allocation waiting for device memory (--freeze-on-demand); absent without it.",
    "agent.idle_freeze.on_demand_seconds",
);
pub const FREEZE_POOL_BYTES: Def = def(
    "vgpu_freeze_pool",
    Gauge,
    Some(Bytes),
    false,
    &["state"],
    "Host bytes of the freeze pool (vgpu-agent run --freeze-pool) by state: target (its size), ready (populated, to lend), lent (out on loans to processes freezing in-process), kept (pages of ended loans their borrowers still pin, charged to the agent and counted against the size); absent without the pool.",
    "agent.freeze_pool.size_bytes, ready_bytes, lent_bytes, kept_bytes",
);
pub const FREEZE_POOL_OPEN_LOANS: Def = def(
    "vgpu_freeze_pool_open_loans",
    Gauge,
    None,
    false,
    &[],
    "Loans of the freeze pool out now (one per process at most); absent without the pool.",
    "agent.freeze_pool.loans",
);
pub const FREEZE_POOL_LOANS: Def = def(
    "vgpu_freeze_pool_loans",
    Counter,
    None,
    false,
    &[],
    "Loans the freeze pool made since the daemon started; absent without the pool.",
    "agent.freeze_pool.loans_total",
);
pub const FREEZE_POOL_REFUSALS: Def = def(
    "vgpu_freeze_pool_refusals",
    Counter,
    None,
    false,
    &["reason"],
    "Freeze pool requests and connections refused, by reason: not_freezing, already_lent, empty, too_much, unknown (the reply's status), bad_request, timeout, busy (closed at the connection caps); absent without the pool.",
    "agent.freeze_pool.refusals",
);
pub const AGENT_UP: Def = def(
    "vgpu_agent_probes_up",
    Gauge,
    None,
    false,
    &[],
    "1 when the eBPF probes run, 0 when they cannot (see the daemon's log and the model's agent.probes_unavailable).",
    "agent.probes_unavailable",
);
pub const AGENT_PROBES: Def = def(
    "vgpu_agent_probes_attached",
    Gauge,
    None,
    false,
    &[],
    "Symbols the probes are attached to, over all probed libraries.",
    "agent.libraries[].symbols_attached",
);
pub const AGENT_LIBRARIES: Def = def(
    "vgpu_agent_probed_libraries",
    Gauge,
    None,
    false,
    &[],
    "Driver and NCCL library files the probes are attached to.",
    "agent.libraries[]",
);
pub const AGENT_PROBE_COST: Def = def(
    "vgpu_agent_probe_cost",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "Measured added cost of one probed call (entry and return probe), at start.",
    "agent.probe_cost.per_hit_ns",
);
pub const AGENT_LAUNCH_PROBE: Def = def(
    "vgpu_agent_launch_probes",
    Counter,
    Some(Seconds),
    false,
    &[],
    "Time the kernel-launch probes were attached.",
    "agent.launch_probe_seconds",
);
pub const AGENT_EVENTS_LOST: Def = def(
    "vgpu_agent_events_lost",
    Counter,
    None,
    false,
    &["cause"],
    "Lost or unmatched probe events, by cause.",
    "agent.events_lost",
);
pub const AGENT_REGIONS: Def = def(
    "vgpu_agent_regions",
    Gauge,
    None,
    false,
    &[],
    "Limiter regions read.",
    "agent.regions_read",
);
pub const AGENT_REGION_ERRORS: Def = def(
    "vgpu_agent_region_errors",
    Gauge,
    None,
    false,
    &[],
    "Regions with problems (corrupt, hostile, dead writers).",
    "agent.region_errors",
);
pub const AGENT_MAP_ENTRIES: Def = def(
    "vgpu_agent_map_entries",
    Gauge,
    None,
    false,
    &["map"],
    "Entries in the probes' kernel maps.",
    "agent.map_entries",
);
pub const AGENT_WARNINGS: Def = def(
    "vgpu_agent_warnings",
    Gauge,
    None,
    false,
    &[],
    "Warnings in the latest snapshot (probe poll or map read failures, ...).",
    "agent.warnings",
);
pub const AGENT_WARNINGS_SUPPRESSED: Def = def(
    "vgpu_agent_warnings_suppressed",
    Gauge,
    None,
    false,
    &["tenant"],
    "Warnings not kept because their tenant (or all together) reached the bound, since the agent started.",
    "agent.warnings_suppressed",
);
pub const AGENT_LIBRARIES_SKIPPED: Def = def(
    "vgpu_agent_libraries_skipped",
    Gauge,
    None,
    false,
    &["tenant", "reason"],
    "Driver-named files that tenants' processes map and that are not attached, by reason (not_a_driver, tenant_cap, total_cap, attach_failed, mappings).",
    "agent.libraries_skipped",
);
pub const AGENT_MAPS_DEFERRED: Def = def(
    "vgpu_agent_maps_deferred",
    Gauge,
    None,
    false,
    &["tenant"],
    "Processes whose maps were left to a later cycle of the maps scan (its byte and time budget, no free reader, or the tenant's two reads running), by tenant.",
    "agent.maps_scan.deferred_by_tenant",
);
pub const AGENT_MAPS_BLOCKED: Def = def(
    "vgpu_agent_maps_blocked",
    Gauge,
    None,
    false,
    &["tenant"],
    "Processes whose maps read has not returned (it holds a reader until it does), by tenant.",
    "agent.maps_scan.blocked",
);
pub const AGENT_SLOTS_REFUSED: Def = def(
    "vgpu_agent_region_slots_refused",
    Gauge,
    None,
    false,
    &[],
    "Region slots not counted for the process they name in the latest snapshot (it does not run with the slot's start time, map the region, or belong to the region's container).",
    "agent.slots_refused",
);
pub const AGENT_REGION_FILES_SKIPPED: Def = def(
    "vgpu_agent_region_listing_files_skipped",
    Gauge,
    None,
    false,
    &[],
    "Files of region directories (and shared files of processes' maps) not looked at for regions at their last listing, past the bounds per subdirectory and in all.",
    "agent.region_listing_cuts[].files_skipped",
);
pub const AGENT_SNAPSHOT_TIME: Def = def(
    "vgpu_agent_snapshot_timestamp",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "When the snapshot behind this exposition was taken (Unix time).",
    "taken_at_unix_ms",
);
pub const AGENT_SNAPSHOT_AGE: Def = def(
    "vgpu_agent_snapshot_age",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "Seconds since the snapshot behind this exposition was taken, at the time of the scrape (grows when the agent stops refreshing).",
    "taken_at_unix_ms, against the clock at each scrape",
);
pub const AGENT_SNAPSHOT_STALE: Def = def(
    "vgpu_agent_snapshot_stale",
    Gauge,
    None,
    false,
    &[],
    "1 when the collector has not finished a snapshot for more than two intervals: this exposition repeats the last one.",
    "agent.stale",
);
pub const AGENT_COLLECT_TIME: Def = def(
    "vgpu_agent_snapshot_collect_duration",
    Gauge,
    Some(Seconds),
    false,
    &[],
    "How long the snapshot behind this exposition took to collect.",
    "agent.collect_seconds",
);
pub const AGENT_NVML_CALLS: Def = def(
    "vgpu_agent_nvml_calls",
    Counter,
    None,
    false,
    &["call"],
    "NVML queries the agent made since it started, by kind (call: init, driver_version, cuda_driver_version, device_count, uuid, name, utilization, memory, power, power_limit, temperature, compute_processes, graphics_processes, process_utilization), failed ones included.",
    "agent.nvml_calls.*.calls",
);
pub const AGENT_NVML_CALL_TIME: Def = def(
    "vgpu_agent_nvml_call_duration",
    Counter,
    Some(Seconds),
    false,
    &["call"],
    "Seconds the agent spent in NVML queries since it started, by kind (as vgpu_agent_nvml_calls_total): what watching the GPUs costs the agent, and where the driver's time goes.",
    "agent.nvml_calls.*.seconds",
);
pub const AGENT_NVML_CALL_MAX: Def = def(
    "vgpu_agent_nvml_call_max_duration",
    Gauge,
    Some(Seconds),
    false,
    &["call"],
    "The longest single NVML query of each kind since the agent started.",
    "agent.nvml_calls.*.max_seconds",
);
pub const AGENT_REGIONS_UNREAD: Def = def(
    "vgpu_agent_regions_unread",
    Gauge,
    None,
    false,
    &["reason"],
    "Regions the snapshot did not read whole, by reason: time or retries (the region's read budget ran out), blocked (a read of it started earlier has not returned).",
    "agent.regions_unread",
);
pub const AGENT_HTTP_DROPPED: Def = def(
    "vgpu_agent_http_connections_dropped",
    Counter,
    None,
    false,
    &["reason"],
    "/metrics connections the server closed or refused, by reason: header_timeout, deadline, evicted (idle, to make room at the connection cap), refused (at the cap).",
    "agent.http_dropped",
);
pub const AGENT_SPANS: Def = def(
    "vgpu_agent_spans_exported",
    Counter,
    None,
    false,
    &[],
    "Spans handed to the OTLP exporter.",
    "the span pipeline (agent/src/export/otlp.rs)",
);
pub const AGENT_SPANS_DROPPED: Def = def(
    "vgpu_agent_spans_dropped",
    Counter,
    None,
    false,
    &["reason"],
    "Sampled calls that did not become exported spans: reason=ring_full (the kernel ring buffer was full), container_rate (a span over its container's rate for its kind, per container in vgpu_container_spans_dropped_total), queue_full (the exporter's bounded queue was full), export_failed (the OTLP endpoint refused or did not answer).",
    "agent.events_lost.ring_full and the span pipeline (agent/src/export/otlp.rs)",
);
pub const CONTAINER_PROBE_LOSSES: Def = def(
    "vgpu_container_probe_losses",
    Counter,
    None,
    true,
    &["reason"],
    "What the probes could not record for the container's processes, by reason: allocation_untracked (a successful allocation past its process's share of the kernel's allocation table, --probe-alloc-quota, or the table full: the live-memory figure is short), call_unaggregated (a call whose new row its cgroup had no room for, --probe-row-quota, or the map full: not counted), row_reset (a row whose counters went back; the agent keeps the earlier counts).",
    "processes[].probe_losses",
);
pub const CONTAINER_PROBES_INCOMPLETE: Def = def(
    "vgpu_container_probes_incomplete",
    Gauge,
    None,
    true,
    &[],
    "1 when an alive process of the container lost probe data (its probe figures are incomplete, not exact), else 0.",
    "processes[].probe_losses not empty (alive processes)",
);
pub const CONTAINER_API_ESTIMATED: Def = def(
    "vgpu_container_api_estimated",
    Gauge,
    None,
    true,
    &["kind"],
    "1 when a probe budget (--probe-budget) sampled this kind of call in an alive process of the container: its vgpu_container_api_* figures of the kind are then estimates of the whole from the calls probed, else 0. For the kinds a budget samples (launch, sync, copy, nccl) that the container's processes made calls of; processes under the limiter are never sampled (it records their calls exactly).",
    "processes[].apis[].probed (present on estimated rows)",
);
pub const CONTAINER_SPANS_DROPPED: Def = def(
    "vgpu_container_spans_dropped",
    Counter,
    None,
    true,
    &["sampled_by", "reason"],
    "Spans of the container's calls that were not exported, by kind (sampled_by: nccl, slow, rate) and reason: container_rate (over the container's rate for that kind: --trace-container-event-rate for nccl and slow, --trace-container-rate for rate), queue_full (the exporter's bounded queue was full).",
    "the span pipeline (agent/src/export/otlp.rs, agent/src/export/sampling.rs)",
);
pub const HOST_PROCESS_SM_UTILIZATION: Def = def(
    "vgpu_host_process_sm_utilization",
    Gauge,
    Some(Ratio),
    false,
    &["pid", "comm", "device"],
    "SM busy share of a GPU process outside any container (a host service or session, which no container series names), in the latest NVML sample window.",
    "processes[].nvml[].sm_util_pct / 100 of processes whose container is not containerised",
);
pub const HOST_PROCESS_MEMORY_BANDWIDTH_UTILIZATION: Def = def(
    "vgpu_host_process_memory_bandwidth_utilization",
    Gauge,
    Some(Ratio),
    false,
    &["pid", "comm", "device"],
    "Memory-bandwidth busy share of a GPU process outside any container, in the latest NVML sample window.",
    "processes[].nvml[].mem_util_pct / 100 of processes whose container is not containerised",
);
pub const PROCESS_API_CALLS: Def = per_process(def(
    "vgpu_process_api_calls",
    Counter,
    None,
    true,
    PID,
    "API calls per process (only with --metrics-pid-labels).",
    "processes[].apis[].calls",
));
pub const PROCESS_API_ERRORS: Def = per_process(def(
    "vgpu_process_api_errors",
    Counter,
    None,
    true,
    PID,
    "API errors per process (only with --metrics-pid-labels).",
    "processes[].apis[].errors",
));
pub const PROCESS_MEMORY_USED: Def = per_process(def(
    "vgpu_process_memory_used",
    Gauge,
    Some(Bytes),
    true,
    &["pid", "comm", "view"],
    "GPU memory used per process and view, all devices (only with --metrics-pid-labels).",
    "processes[].memory",
));

/// Every family, in exposition order.
pub const ALL: &[Def] = &[
    CONTAINER_MEMORY_USED,
    CONTAINER_MEMORY_LIMIT,
    CONTAINER_MEMORY_RESERVED,
    CONTAINER_SM_LIMIT,
    CONTAINER_QOS_ALLOCATED,
    CONTAINER_QOS_GUARANTEE,
    CONTAINER_QOS_SHORT,
    CONTAINER_SM_UTILIZATION,
    CONTAINER_GPU_BUSY,
    CONTAINER_KERNEL_TIME,
    CONTAINER_MEMORY_BANDWIDTH_UTILIZATION,
    CONTAINER_DENIED,
    CONTAINER_ALLOCATIONS,
    CONTAINER_PROCESSES,
    CONTAINER_FROZEN,
    CONTAINER_FROZEN_HOST_MEMORY,
    FREEZE_HOST_BUDGET,
    FREEZE_HOST_RESERVED,
    FREEZE_AFTER,
    FREEZE_ON_DEMAND,
    FREEZE_POOL_BYTES,
    FREEZE_POOL_OPEN_LOANS,
    FREEZE_POOL_LOANS,
    FREEZE_POOL_REFUSALS,
    CONTAINER_DRIFT,
    API_CALLS,
    API_ERRORS,
    API_BYTES,
    API_TIME,
    API_LATENCY,
    NODE_LATENCY,
    API_HOOK,
    API_DENIED,
    SYNC,
    THROTTLED,
    PROBE_TIME,
    NCCL_COMMUNICATORS,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_UTILIZATION,
    GPU_INFO,
    AGENT_UP,
    AGENT_PROBES,
    AGENT_LIBRARIES,
    AGENT_PROBE_COST,
    AGENT_LAUNCH_PROBE,
    AGENT_EVENTS_LOST,
    AGENT_REGIONS,
    AGENT_REGION_ERRORS,
    AGENT_MAP_ENTRIES,
    AGENT_WARNINGS,
    AGENT_WARNINGS_SUPPRESSED,
    AGENT_LIBRARIES_SKIPPED,
    AGENT_MAPS_DEFERRED,
    AGENT_MAPS_BLOCKED,
    AGENT_SLOTS_REFUSED,
    AGENT_REGION_FILES_SKIPPED,
    AGENT_SNAPSHOT_TIME,
    AGENT_SNAPSHOT_AGE,
    AGENT_SNAPSHOT_STALE,
    AGENT_COLLECT_TIME,
    AGENT_NVML_CALLS,
    AGENT_NVML_CALL_TIME,
    AGENT_NVML_CALL_MAX,
    AGENT_REGIONS_UNREAD,
    AGENT_HTTP_DROPPED,
    AGENT_SPANS,
    AGENT_SPANS_DROPPED,
    CONTAINER_PROBE_LOSSES,
    CONTAINER_PROBES_INCOMPLETE,
    CONTAINER_API_ESTIMATED,
    CONTAINER_SPANS_DROPPED,
    HOST_PROCESS_SM_UTILIZATION,
    HOST_PROCESS_MEMORY_BANDWIDTH_UTILIZATION,
    PROCESS_API_CALLS,
    PROCESS_API_ERRORS,
    PROCESS_MEMORY_USED,
];

/// Every series name the agent can expose (`_total`, `_bucket`, `_sum`, `_count` included).
pub fn metric_names() -> Vec<String> {
    ALL.iter().flat_map(Def::series_names).collect()
}

/// All label names a family can carry, container labels first (`api` included: see
/// [`labels_in`]).
pub fn label_names(d: &Def) -> Vec<&'static str> {
    let mut v: Vec<&str> = if d.per_container {
        CONTAINER_LABELS.to_vec()
    } else {
        vec![]
    };
    v.extend(d.labels);
    v
}

/// The label names a family carries as exported: without `api` unless `per_api`.
pub fn labels_in(d: &Def, per_api: bool) -> Vec<&'static str> {
    let mut v = label_names(d);
    if !per_api {
        v.retain(|l| *l != API_LABEL);
    }
    v
}

/// The latency histogram's bucket bounds: 2^k ns for these k, a factor of 4 apart (1.024 us ..
/// 17.2 s; docs/metrics.md says why not every power of 2).
pub const LATENCY_BUCKET_EXPONENTS: [usize; 13] =
    [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34];
