//! The agent's one model of every GPU process: a typed, serialisable snapshot that `stat`, `top`,
//! the exporters and `attribute` all read. Collection produces it (`crate::collector`); views
//! never change it.
//!
//! Counters are cumulative (since the probes were attached, or for limiter data since the process
//! started); views take differences between two snapshots. A process is identified by its pid
//! *and* start time, so a reused pid is a different process.

pub mod api_sums;
pub mod by_device;
mod drift;
mod gpu_time;
pub mod gpu_use;
pub mod nccl;
pub mod probing;
mod rates;
pub mod skips;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use drift::MemoryViews;

pub const SCHEMA: &str = "vgpu-agent.model/v1";

/// Per-second rates of a process over the interval between two snapshots (`Rates::between`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub allocations_per_s: f64,
    pub launches_per_s: f64,
    pub calls_per_s: f64,
    pub nccl_bytes_per_s: f64,
    /// Share of the interval this process's threads spent blocked in synchronisation calls.
    pub sync_share: f64,
    /// Share of the interval spent throttled by the limiter.
    pub throttled_share: f64,
    pub denied_per_s: f64,
}

/// A process, unique for the life of the boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessKey {
    /// Host pid.
    pub pid: u32,
    /// Start time, clock ticks after boot.
    pub start_ticks: u64,
}

/// Where a figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// eBPF uprobes on the driver library.
    Probes,
    /// The limiter's region (in-process accounting).
    Limiter,
}

/// Cumulative statistics of one API in one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiUsage {
    pub api: String,
    pub kind: String,
    pub source: Source,
    pub calls: u64,
    pub errors: u64,
    /// Bytes named by the calls (allocation sizes, copy sizes, NCCL payloads).
    pub bytes: u64,
    pub total_ns: u64,
    /// Limiter self-time inside its hook, ns (limiter source only).
    pub hook_ns: u64,
    /// Allocations the limiter denied (limiter source only).
    pub denied: u64,
    /// Log2 latency histogram (`agent_common::hist`).
    pub hist: Vec<u64>,
    /// What the latency measures where it is not the call's whole effect: `host_enqueue` for
    /// NCCL (collectives are asynchronous: the time is the host-side call that enqueues them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// Where a probe budget sampled this API's kind in this process: what the probes saw. The
    /// figures above are then estimates of the whole (what they saw scaled by the sampling's
    /// estimate of the kind's calls: see `probing::Exposure`), cumulative and never going back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed: Option<Probed>,
}

/// The figures the probes saw of a sampled API (see [`ApiUsage::probed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Probed {
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub total_ns: u64,
}

impl ApiUsage {
    /// Whether the figures are estimates (a probe budget sampled the API's kind).
    pub fn is_estimated(&self) -> bool {
        self.probed.is_some()
    }

    /// The row with the figures the probes saw in place of the estimates, if it has any (for
    /// estimators of their own: `attribute`).
    pub fn as_probed(&self) -> ApiUsage {
        match self.probed {
            Some(p) => ApiUsage {
                calls: p.calls,
                errors: p.errors,
                bytes: p.bytes,
                total_ns: p.total_ns,
                probed: None,
                ..self.clone()
            },
            None => self.clone(),
        }
    }

    /// The difference `self - earlier` (saturating: counters never go back).
    pub fn since(&self, earlier: Option<&ApiUsage>) -> ApiUsage {
        let Some(e) = earlier else {
            return self.clone();
        };
        ApiUsage {
            calls: self.calls.saturating_sub(e.calls),
            errors: self.errors.saturating_sub(e.errors),
            bytes: self.bytes.saturating_sub(e.bytes),
            total_ns: self.total_ns.saturating_sub(e.total_ns),
            hook_ns: self.hook_ns.saturating_sub(e.hook_ns),
            denied: self.denied.saturating_sub(e.denied),
            hist: self
                .hist
                .iter()
                .zip(e.hist.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            probed: self.probed.map(|p| {
                // An earlier reading before the sampling began saw everything it counted.
                let b = e.probed.unwrap_or(Probed {
                    calls: e.calls,
                    errors: e.errors,
                    bytes: e.bytes,
                    total_ns: e.total_ns,
                });
                Probed {
                    calls: p.calls.saturating_sub(b.calls),
                    errors: p.errors.saturating_sub(b.errors),
                    bytes: p.bytes.saturating_sub(b.bytes),
                    total_ns: p.total_ns.saturating_sub(b.total_ns),
                }
            }),
            ..self.clone()
        }
    }

    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let mut h = [0u64; agent_common::hist::HIST_BUCKETS];
        for (d, s) in h.iter_mut().zip(&self.hist) {
            *d = *s;
        }
        agent_common::hist::quantile_ns(&h, q)
    }
}

/// What the limiter's region says about one process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimiterProcess {
    pub region: String,
    pub slot: u32,
    /// Bytes held per device (reserved against the container's limit), context included.
    pub held: Vec<u64>,
    pub context_bytes: Vec<u64>,
    pub throttled_ns: u64,
    pub dropped_records: u64,
    /// Statistics shards that could not be read consistently (stuck or dead writer).
    pub shard_problems: Vec<String>,
    /// GPU time the limiter measured per device with sampled event pairs (cumulative; devices
    /// with samples only). The figure to trust on a shared GPU (see `gpu_use` for NVML's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_time: Vec<gpu_time::LimiterGpuTime>,
    /// GPU time per kernel name (cumulative), largest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<gpu_time::KernelTime>,
    /// Samples whose event calls failed, and samples not taken (cumulative).
    #[serde(default)]
    pub sample_errors: u64,
    #[serde(default)]
    pub samples_skipped: u64,
    /// An allocation of the process waiting for device memory the GPU has no room for
    /// (`VGPU_OOM_WAIT`), as its slot says (the tenant's words); absent when none waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_memory: Option<WaitingForMemory>,
}

/// An allocation waiting for device memory, as the process's slot says (the tenant's words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingForMemory {
    /// The device index the limiter wrote (the process's CUDA ordinal; unchecked).
    pub device: u64,
    /// Bytes it waits for.
    pub bytes: u64,
    /// The process's number for the wait: another wait has another number.
    pub wait: u64,
}

/// Successful allocations of one API in one size class (cumulative, from the probes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocSizes {
    pub api: String,
    /// Allocated from a stream-ordered pool (cuMemAllocAsync, cuMemAllocFromPoolAsync) rather
    /// than directly.
    pub pool: bool,
    /// Sizes in [2^log2, 2^(log2+1)) bytes.
    pub log2: u8,
    pub count: u64,
    pub bytes: u64,
}

/// What NVML says about a process on one device (`gpu_use` for the utilisation figures).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvmlProcess {
    pub device: u32,
    pub used_memory: Option<u64>,
    /// Share of the device's time the process kept its SMs busy in the latest window, percent
    /// (`None`: not measured: the first snapshot, or the device gives no per-process
    /// utilisation, see `use_unavailable`).
    pub sm_util_pct: Option<f64>,
    /// The same for the memory controller (memory bandwidth).
    #[serde(default)]
    pub mem_util_pct: Option<f64>,
    /// The span (CPU time) the latest percentages cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_window: Option<gpu_time::UseWindow>,
    /// Why the device gives no per-process utilisation (MIG, vGPU, an older GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_unavailable: Option<String>,
    /// Busy time since the agent first saw the process on the device (cumulative).
    #[serde(default)]
    pub busy: gpu_time::Busy,
}

/// A NCCL communicator as the probes saw it (cumulative).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Communicator {
    /// The `ncclComm_t` (an address in the process), as `0x...`.
    pub comm: String,
    /// NCCL's communicator id (`0x...`, as `NCCL_DEBUG=INFO` prints `commId`): the same in every
    /// rank of the communicator, whichever process holds it. Hashed from the `ncclUniqueId` the
    /// creating call was given; `None` when not seen (created before the probes were attached,
    /// or by ncclCommInitAll, whose id NCCL makes inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_id: Option<String>,
    /// This process's rank and the communicator's size, from the ncclCommInit* call that created
    /// it (`None` if it was created before the probes were attached).
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    /// The API that created it, if seen.
    pub created_by: Option<String>,
    /// ncclCommDestroy or ncclCommAbort succeeded on it.
    pub destroyed: bool,
    /// NCCL calls that named it.
    pub calls: u64,
    pub errors: u64,
    /// Sum of `count x datatype size` of those calls.
    pub bytes: u64,
    /// Where a probe budget sampled NCCL's calls in the process: the calls the probes saw
    /// (`calls`, `errors` and `bytes` are then estimates of the whole, scaled as the process's
    /// NCCL API rows are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed_calls: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub key: ProcessKey,
    pub alive: bool,
    pub comm: String,
    pub cmdline: String,
    /// The container (see [`Container::key`]).
    pub container: String,
    pub cgroup_path: Option<String>,
    pub memory: MemoryViews,
    pub apis: Vec<ApiUsage>,
    pub limiter: Option<LimiterProcess>,
    pub nvml: Vec<NvmlProcess>,
    pub communicators: Vec<Communicator>,
    /// Allocations by size class (probes).
    #[serde(default)]
    pub alloc_sizes: Vec<AllocSizes>,
    /// Per-second rates over the last interval (absent in the first snapshot).
    pub rates: Option<Rates>,
    /// What the probes could not record for it: while not empty its probe figures are
    /// incomplete (`memory.probes_complete` is false once an allocation went untracked).
    #[serde(default, skip_serializing_if = "probing::ProbeLosses::is_empty")]
    pub probe_losses: probing::ProbeLosses,
    /// What the probes' hits cost it since the agent first saw it, seconds: its probed calls
    /// (hits, not the estimates of a budget) times the calibrated price of a hit in its library
    /// (cumulative; absent while never hit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_seconds: Option<f64>,
}

/// A container's region (limiter or HAMi-core).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionInfo {
    pub path: String,
    /// `vgpu` (this project's limiter) or `hami` (HAMi-core v1).
    pub format: String,
    /// Per device: limit (0 = unlimited), reserved, denied.
    pub devices: Vec<RegionDevice>,
    /// Problems reading it (corrupt, hostile, dead writers): shown, never hidden.
    pub problems: Vec<String>,
    /// Seqlock retries while reading (a sign of contention).
    pub read_retries: u64,
    /// Why a uid other than the container's could have written the region (its mode lets group
    /// or others write it, or its owner is not the uid of its users), so its figures may not be
    /// the container's own. `None`: only its owner could.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_by_others: Option<String>,
    /// The idle time after which the container asks to be frozen (its limiter's
    /// `VGPU_FREEZE_AFTER`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_after_seconds: Option<f64>,
}

/// A part of a region directory (a subdirectory, one container's in HAMi's layout, or the
/// files directly in it), or a process's maps, whose files were not all looked at for regions:
/// its bounds (docs/security.md) were reached. The others were listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionListingCut {
    /// The directory, or `/proc/<pid>/maps`.
    pub path: String,
    /// Regular files found there (shared files mapped, for a process) and not looked at.
    pub files_skipped: u64,
    /// Directories below it not entered.
    pub dirs_skipped: u64,
    /// A directory there had more entries than are read (those were not counted).
    pub entries_unread: bool,
}

impl RegionListingCut {
    /// How the cut is said to people.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        if self.files_skipped > 0 {
            parts.push(format!("{} file(s) not looked at", self.files_skipped));
        }
        if self.dirs_skipped > 0 {
            parts.push(format!("{} directories not entered", self.dirs_skipped));
        }
        if self.entries_unread {
            parts.push("a directory's entries past the first 4,096 not read".to_owned());
        }
        format!(
            "regions listed in part (the bounds per subdirectory or process reached): {}: {}",
            self.path,
            parts.join(", ")
        )
    }
}

/// A region this snapshot did not read whole (docs/security.md); its
/// [`RegionInfo::problems`] say so too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionUnread {
    /// The region (as [`RegionInfo::path`]).
    pub path: String,
    /// `time` or `retries`: that part of the region's read budget ran out; `blocked`: a read of
    /// the file started earlier has not returned (nothing of it was read this time).
    pub reason: String,
    /// Claimed slots not read (0 when blocked: not known).
    pub slots: u32,
    /// For `blocked`: seconds since the read started.
    #[serde(default)]
    pub blocked_seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionDevice {
    pub index: u32,
    pub memory_limit: u64,
    pub sm_limit_pct: u8,
    pub reserved: u64,
    pub denied: u64,
    /// One process's context charge on the device, where the region shows it (held by a
    /// process, or refused to one: see `collector::context_charge`). A limit below it denies
    /// every allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_charge: Option<u64>,
    /// The container's QoS tier on the device (docs/qos.md), as its limiter publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<RegionQos>,
}

/// A container's QoS tier on one device and what it is allocated now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionQos {
    /// `latency`, `guaranteed` or `best-effort`.
    pub tier: String,
    /// The guaranteed share (0..1; 0 for the other tiers).
    pub guarantee: f64,
    /// The share it is allocated now (0..1).
    pub allocated: f64,
    /// Its allocation held it back over the last tick (it wants more).
    pub held: bool,
    /// Guaranteed, it wants its guarantee and is allocated less: the guarantees of the tenants
    /// on the device add up to more than it.
    pub short: bool,
}

impl RegionQos {
    /// `guaranteed 30%, allocated 70% (held back)`: the tier and what it has now, as the views
    /// say it.
    pub fn summary(&self) -> String {
        let tier = if self.tier == "guaranteed" {
            format!("guaranteed {:.0}%", self.guarantee * 100.0)
        } else {
            self.tier.clone()
        };
        let mut notes = Vec::new();
        if self.held {
            notes.push("held back");
        }
        if self.short {
            notes.push("short of its guarantee: the guarantees on the GPU add up to more");
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        format!("{tier}, allocated {:.0}%{notes}", self.allocated * 100.0)
    }
}

impl RegionDevice {
    /// The limit is smaller than one process's context charge: nothing can be allocated.
    pub fn limit_below_context(&self) -> bool {
        self.memory_limit > 0 && self.context_charge.is_some_and(|c| c > self.memory_limit)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// The container id when known, else `cgroup:<path>`; `host` for host processes.
    pub key: String,
    pub name: String,
    /// In a container or pod (not a host service or session).
    pub containerised: bool,
    pub runtime: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub qos: Option<String>,
    pub processes: Vec<ProcessKey>,
    pub regions: Vec<RegionInfo>,
    /// The sum of its processes' [`Process::probe_losses`]: its probe figures are incomplete
    /// while not empty.
    #[serde(default, skip_serializing_if = "probing::ProbeLosses::is_empty")]
    pub probe_losses: probing::ProbeLosses,
    /// Frozen (`vgpu-agent freeze --container`, or the daemon's idle freeze): a control block
    /// of one of its regions marks it freezing or frozen, or the daemon's thaw watcher found it
    /// frozen; absent while running (docs/oversubscription.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen: Option<Frozen>,
}

/// A frozen container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Frozen {
    /// Device bytes its processes gave back to the GPU, held in host memory until the thaw (the
    /// limiter's count of their memory).
    pub host_bytes: u64,
    /// Frozen by its processes themselves (the limiter's in-process path, the control block's
    /// mark `InProcess`), not by the driver's checkpoint API; absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_process: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub utilization_pct: Option<u32>,
    pub memory_used: Option<u64>,
    pub memory_total: Option<u64>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
}

/// How a library was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum FoundBy {
    /// Named on the command line.
    Configured,
    /// The host's loader cache or a driver directory.
    Host,
    /// Mapped by a running process.
    Process { pid: u32 },
}

/// A probed library file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LibraryStatus {
    pub path: String,
    pub attach_path: String,
    pub dev: u64,
    pub inode: u64,
    pub found_by: FoundBy,
    pub symbols_attached: usize,
    pub symbols_missing: Vec<String>,
    /// First instruction of the probed functions, by kind (decides the probe cost).
    pub prologues: BTreeMap<String, usize>,
    pub kinds_attached: Vec<String>,
    /// Where processes under the limiter use the library: the only processes its launches,
    /// synchronisations and copies are probed in (the limiter records those of its own
    /// processes). Absent: probed in every process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_scoped: Option<Vec<u32>>,
}

/// The incremental reading of processes' maps (`/proc/<pid>/maps`), done off the collector's
/// thread within a byte and time budget per cycle, new processes first and each tenant its share.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MapsScanStatus {
    /// Processes known to the scan.
    pub processes: usize,
    /// Maps read in the last finished cycle, and their bytes.
    pub read: usize,
    pub bytes: u64,
    /// Processes due for a read that the last cycle left for later (over its budget).
    pub deferred: usize,
    /// The same, by tenant (container id or cgroup path).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deferred_by_tenant: BTreeMap<String, usize>,
    /// Processes whose maps read has not returned (a read that blocks: the process holds its
    /// memory-map lock); each is read again only once its read returns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<MapsBlocked>,
    /// Seconds the last finished cycle took.
    pub cycle_seconds: f64,
    /// Polls at which the cycle had not finished in time (its results came at a later poll).
    pub late_polls: u64,
}

/// A process whose maps read has not returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapsBlocked {
    pub pid: u32,
    pub tenant: String,
    /// Seconds its read has run.
    pub seconds: f64,
}

/// What one kind of NVML query cost the agent since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvmlCallCost {
    /// Queries made, failed ones included.
    pub calls: u64,
    /// Seconds spent in them, all together.
    pub seconds: f64,
    /// The longest one.
    pub max_seconds: f64,
}

/// The agent's own state: what it could and could not do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// Why the probes are not running, if they are not.
    pub probes_unavailable: Option<String>,
    pub attach_mode: Option<probing::AttachMode>,
    pub libraries: Vec<LibraryStatus>,
    pub launch_probes: probing::LaunchProbes,
    /// Seconds the launch probes were attached since the agent started.
    pub launch_probe_seconds: f64,
    pub probe_cost: Option<probing::ProbeCost>,
    /// With a probe budget (`attribute`): what was sampled, how often, and each process's
    /// exposure to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<probing::SamplingStatus>,
    /// Lost or unmatched events by cause.
    pub events_lost: BTreeMap<String, u64>,
    pub regions_read: usize,
    pub region_errors: usize,
    /// Entries in the probes' kernel maps (`allocs` is counted when exited processes are
    /// removed), to show that nothing leaks.
    pub map_entries: BTreeMap<String, usize>,
    pub nvml_problems: Vec<String>,
    /// What the NVML queries cost the agent since it started, by kind: the fixed set of kinds
    /// of query the agent makes (docs/model.md), each present once NVML is used; empty without
    /// NVML.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nvml_calls: BTreeMap<String, NvmlCallCost>,
    /// The agent's warnings: deduplicated (one made again says how often) and bounded per
    /// tenant and in all.
    pub warnings: Vec<String>,
    /// Warnings not kept because their tenant (or all together) reached the bound, by tenant
    /// (`agent` for the agent's own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub warnings_suppressed: BTreeMap<String, u64>,
    /// Libraries that tenants' processes map and that were not attached, by tenant and reason
    /// (`not_a_driver`, `tenant_cap`, `total_cap`, `mappings`: more driver-named mappings in one
    /// process than are considered).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub libraries_skipped: BTreeMap<String, BTreeMap<String, u64>>,
    /// Reading processes' maps to find libraries.
    #[serde(default)]
    pub maps_scan: MapsScanStatus,
    /// Seconds this snapshot took to collect.
    #[serde(default)]
    pub collect_seconds: f64,
    /// Region slots not counted for the process they name this snapshot: the process does not
    /// run with the slot's start time, does not map the region, or is not of the region's
    /// container (each is said in its region's problems).
    #[serde(default)]
    pub slots_refused: u64,
    /// What tenants claimed that was not believed, one line each (at most 64, then a count):
    /// region slots not counted, cgroup paths that name a container or pod below their own
    /// container's cgroup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims_refused: Vec<String>,
    /// Parts of the region directories, and processes' maps, not looked at whole for regions
    /// (at their last listing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub region_listing_cuts: Vec<RegionListingCut>,
    /// Regions not read whole this snapshot.
    #[serde(default)]
    pub regions_unread: Vec<RegionUnread>,
    /// Set by the daemon when it serves this snapshot again because its collector has not
    /// finished a new one for more than two intervals: what it shows is stale.
    #[serde(default)]
    pub stale: bool,
    /// Seconds from when the snapshot was taken to when it was served (the daemon's socket,
    /// `/metrics`); 0 in-process.
    #[serde(default)]
    pub age_seconds: f64,
    /// `/metrics` connections the server dropped, by reason (the daemon only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub http_dropped: BTreeMap<String, u64>,
    /// The daemon's freeze of idle containers (`--freeze-after`), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_freeze: Option<IdleFreezeStatus>,
    /// The daemon's freeze pool (`--freeze-pool`), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_pool: Option<FreezePoolStatus>,
}

/// The daemon's freeze of idle containers: its TTL and its host-memory budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleFreezeStatus {
    /// Idle time after which a container is frozen, seconds (`None`: only containers that ask
    /// for it, after their own time).
    pub after_seconds: Option<f64>,
    /// Host bytes frozen containers may hold together (`--freeze-host-budget`).
    pub host_budget_bytes: u64,
    /// Host bytes reserved now: those of frozen containers, of freezes under way, and of thaws
    /// not yet completed.
    pub host_reserved_bytes: u64,
    /// Idle time after which a container may be frozen to make room for another's allocation
    /// waiting for device memory, seconds (`--freeze-on-demand`; `None`: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_seconds: Option<f64>,
}

/// The daemon's freeze pool (`--freeze-pool`): host memory it keeps populated and lends to
/// processes freezing in-process (docs/oversubscription.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FreezePoolStatus {
    /// Host bytes the pool keeps, ready and lent together (`--freeze-pool`).
    pub size_bytes: u64,
    /// Bytes populated and ready to lend.
    pub ready_bytes: u64,
    /// Bytes out on loans now.
    pub lent_bytes: u64,
    /// Bytes of ended loans that their borrowers still hold: pages they pinned, freed from the
    /// chunks but charged to the agent until they let go or exit, as the agent's memory cgroup
    /// shows them (0 where it cannot tell). They count against `size_bytes`.
    #[serde(default)]
    pub kept_bytes: u64,
    /// Loans out now (one per process at most).
    pub loans: u64,
    /// Loans made since the daemon started.
    pub loans_total: u64,
    /// Requests and connections refused since the daemon started, by reason: `not_freezing`,
    /// `already_lent`, `empty`, `too_much`, `unknown` (the reply's status), `bad_request` (not
    /// a request), `timeout` (no whole request within the exchange's time), `busy` (closed at
    /// the connection caps).
    pub refusals: BTreeMap<String, u64>,
    /// Why the pool does not populate now, if it does not (the host short of memory, a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub schema: String,
    pub hostname: String,
    pub taken_at_unix_ms: u64,
    /// Seconds since the previous snapshot (0 for the first).
    pub interval_seconds: f64,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub agent: AgentStatus,
    pub gpus: Vec<GpuDevice>,
    pub containers: Vec<Container>,
    pub processes: Vec<Process>,
}

impl Default for AgentStatus {
    fn default() -> AgentStatus {
        AgentStatus {
            probes_unavailable: None,
            attach_mode: None,
            libraries: vec![],
            launch_probes: probing::LaunchProbes::Off,
            launch_probe_seconds: 0.0,
            probe_cost: None,
            sampling: None,
            events_lost: BTreeMap::new(),
            regions_read: 0,
            region_errors: 0,
            map_entries: BTreeMap::new(),
            nvml_problems: vec![],
            nvml_calls: BTreeMap::new(),
            warnings: vec![],
            warnings_suppressed: BTreeMap::new(),
            libraries_skipped: BTreeMap::new(),
            maps_scan: MapsScanStatus::default(),
            collect_seconds: 0.0,
            slots_refused: 0,
            claims_refused: vec![],
            region_listing_cuts: vec![],
            regions_unread: vec![],
            stale: false,
            age_seconds: 0.0,
            http_dropped: BTreeMap::new(),
            idle_freeze: None,
            freeze_pool: None,
        }
    }
}

impl Process {
    /// One entry per API: the limiter's where it counts the API (it sees the whole life of the
    /// process), else the probes'.
    pub fn effective_apis(&self) -> Vec<&ApiUsage> {
        let mut out: Vec<&ApiUsage> = self
            .apis
            .iter()
            .filter(|a| a.source == Source::Limiter)
            .collect();
        for a in self.apis.iter().filter(|a| a.source == Source::Probes) {
            if !out.iter().any(|o| o.api == a.api) {
                out.push(a);
            }
        }
        out
    }
}

impl Snapshot {
    pub fn process(&self, key: ProcessKey) -> Option<&Process> {
        self.processes.iter().find(|p| p.key == key)
    }

    /// Seconds from when this snapshot was taken to `now_unix_ms` (0 if the clock went back).
    pub fn age_at(&self, now_unix_ms: u64) -> f64 {
        now_unix_ms.saturating_sub(self.taken_at_unix_ms) as f64 / 1e3
    }

    /// Whether what it shows is stale at `now_unix_ms` for a reader refreshing every `interval`:
    /// the daemon said so, or it is older than two intervals (of the reader's or the daemon's,
    /// whichever is longer).
    pub fn is_stale_at(&self, now_unix_ms: u64, interval: std::time::Duration) -> bool {
        let period = interval.as_secs_f64().max(self.interval_seconds);
        self.agent.stale || self.age_at(now_unix_ms) > 2.0 * period
    }

    /// Marks frozen the containers `frozen` names, the others not, each with the device bytes
    /// the limiter counts for its alive processes: what the freeze moved to host memory. The
    /// one place those bytes are counted, for the collector (from the control blocks' marks)
    /// and the daemon (from its thaw watcher) alike. Whether a container was frozen in-process
    /// is kept as its control blocks said it.
    pub fn mark_frozen(&mut self, frozen: impl Fn(&Container) -> bool) {
        for c in &mut self.containers {
            let in_process = c.frozen.as_ref().is_some_and(|f| f.in_process);
            c.frozen = frozen(c).then(|| Frozen {
                in_process,
                host_bytes: self
                    .processes
                    .iter()
                    .filter(|p| p.alive && c.processes.contains(&p.key))
                    .filter_map(|p| p.memory.limiter)
                    .sum(),
            });
        }
    }
}

/// Now, as `taken_at_unix_ms` counts.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
impl Process {
    /// A process of the host with these API rows and nothing else (unit tests' fixture).
    pub(crate) fn with_apis(apis: Vec<ApiUsage>) -> Process {
        Process {
            key: ProcessKey {
                pid: 1,
                start_ticks: 1,
            },
            alive: true,
            comm: "x".into(),
            cmdline: String::new(),
            container: "host".into(),
            cgroup_path: None,
            memory: MemoryViews::default(),
            apis,
            limiter: None,
            nvml: vec![],
            communicators: vec![],
            alloc_sizes: vec![],
            rates: None,
            probe_losses: Default::default(),
            probe_seconds: None,
        }
    }
}
