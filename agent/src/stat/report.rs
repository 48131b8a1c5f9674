//! The `stat` report: per process, per cgroup and per container, per API, over the window between
//! two model snapshots. Its JSON form is documented in docs/stat-json.md and versioned by
//! `schema`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{
    ApiUsage, Communicator, LibraryStatus, MapsScanStatus, MemoryViews, NvmlCallCost, Process,
    RegionInfo, RegionUnread, Snapshot, Source,
    api_sums::ApiSums,
    by_device::DeviceMemory,
    gpu_use::{GpuBusy, KernelShare, WindowUse, busy_over, top_kernels, window_use},
    skips::{self, TenantSkips},
};

pub const SCHEMA: &str = "vgpu-agent.stat/v1";

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ApiRow {
    pub api: String,
    pub kind: String,
    /// `probes` (eBPF) or `limiter` (the region of a process under the limiter).
    pub source: Source,
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub total_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// Log2 latency buckets: `hist[i]` counts calls that took [2^i, 2^(i+1)) ns.
    pub hist: Vec<u64>,
    /// `host_enqueue` for NCCL: collectives are asynchronous, the latency is the host-side call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// A probe budget sampled the API's kind: `calls`, `errors`, `bytes` and `total_ns` are
    /// estimates of the whole from the `probed_calls` the probes saw (the histogram and
    /// quantiles are those calls').
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probed_calls: Option<u64>,
}

impl ApiRow {
    fn from_usage(u: &ApiUsage) -> ApiRow {
        ApiRow {
            api: u.api.clone(),
            kind: u.kind.clone(),
            source: u.source,
            calls: u.calls,
            errors: u.errors,
            bytes: u.bytes,
            total_ns: u.total_ns,
            p50_ns: u.quantile_ns(0.50),
            p99_ns: u.quantile_ns(0.99),
            hist: u.hist.clone(),
            latency: u.latency.clone(),
            estimated: u.is_estimated(),
            probed_calls: u.probed.map(|p| p.calls),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    pub pid: u32,
    /// Still running when the report was made.
    pub alive: bool,
    pub comm: Option<String>,
    pub cmdline: Option<String>,
    pub start_ticks: Option<u64>,
    pub container: String,
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<String>,
    /// Device memory allocated through the traced APIs and not yet freed, as the probes saw it.
    pub live_bytes: u64,
    pub live_allocations: u64,
    /// The three views of the process's memory (limiter, probes, NVML) and any drift.
    pub memory: MemoryViews,
    /// Per device at the end of the window: bytes held in the limiter's region and NVML's used
    /// memory.
    pub memory_by_device: Vec<DeviceMemory>,
    pub apis: Vec<ApiRow>,
    /// NCCL communicators the process created or used while traced (calls, errors and bytes
    /// within the window; rank, size, creator and state as last seen).
    pub communicators: Vec<Communicator>,
    /// Per device, the process's SM and memory-bandwidth use over the window (NVML).
    pub gpu_use: Vec<WindowUse>,
    /// Per device and source, the share of the window the process kept the GPU busy: the
    /// limiter's own timing (`limiter`, trusted on a shared GPU) beside NVML's samples (`nvml`).
    pub gpu_busy: Vec<GpuBusy>,
    /// The kernels the limiter timed in the window, largest first (top ones, the rest as
    /// `other`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelShare>,
    /// What the probes could not record for it, as last seen (cumulative): while not empty its
    /// probe figures are incomplete, not exact.
    #[serde(skip_serializing_if = "crate::model::probing::ProbeLosses::is_empty")]
    pub probe_losses: crate::model::probing::ProbeLosses,
    /// An allocation of the process waiting for GPU memory under `VGPU_OOM_WAIT` at the end of
    /// the window (its limiter's slot says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for_memory: Option<crate::model::WaitingForMemory>,
    /// The share of the window the probes' hits cost the process (its hits in the window at the
    /// calibrated price of a hit in its library: what a probe budget is held to); absent when
    /// the probes never hit it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_share: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CgroupRow {
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<String>,
    pub pids: Vec<u32>,
    pub live_bytes: u64,
    pub apis: Vec<ApiRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ContainerRow {
    pub key: String,
    pub name: String,
    pub pids: Vec<u32>,
    pub regions: Vec<RegionInfo>,
    /// The sum of its processes' probe losses, as last seen: while not empty its probe figures
    /// are incomplete.
    #[serde(skip_serializing_if = "crate::model::probing::ProbeLosses::is_empty")]
    pub probe_losses: crate::model::probing::ProbeLosses,
    /// Per device at the end of the window, the container's processes' memory summed.
    pub memory_by_device: Vec<DeviceMemory>,
    /// Per device, the container's processes' SM and memory-bandwidth use over the window,
    /// summed (NVML).
    pub gpu_use: Vec<WindowUse>,
    /// Per device and source, the container's GPU busy share (as the processes').
    pub gpu_busy: Vec<GpuBusy>,
    /// Frozen at the end of the window (docs/oversubscription.md): known where the daemon
    /// answered (its thaw watcher knows the marks); absent while running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen: Option<crate::model::Frozen>,
    /// The container's top kernels in the window (its processes' merged by name).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelShare>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProbeInfo {
    /// Why there are no probe figures, if there are none.
    pub unavailable: Option<String>,
    pub attach_mode: Option<crate::model::probing::AttachMode>,
    pub launch_probes: crate::model::probing::LaunchProbes,
    /// Seconds the launch probes were attached during the window.
    pub launch_probe_seconds: f64,
    pub cost: Option<crate::model::probing::ProbeCost>,
    pub libraries: Vec<LibraryStatus>,
    /// The probe budget and what it sampled, as last seen (absent with `--probe-budget off`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetInfo>,
}

/// A probe budget at work: the share of each process's time its probes may take, and each
/// sampled kind's duty (1: probed whole, its figures exact).
#[derive(Clone, Debug, Serialize)]
pub struct BudgetInfo {
    pub share: f64,
    pub window_seconds: f64,
    pub kinds: Vec<crate::model::probing::KindSampling>,
}

/// The window's last snapshot: how fresh it was and what it could not read.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotStatus {
    /// Seconds from when it was taken to when the report was made.
    pub age_seconds: f64,
    /// Older than two intervals when the report was made, or served again by a daemon whose
    /// collector is late: the figures may not be current.
    pub stale: bool,
    /// Seconds it took to collect.
    pub collect_seconds: f64,
    /// Regions it did not read whole (read budget exhausted, or a read that blocked).
    pub regions_unread: Vec<RegionUnread>,
    /// The maps scan as last seen (`late_polls` counted within the window).
    pub maps_scan: MapsScanStatus,
    /// What each tenant made the agent skip, as last seen: libraries not attached, warnings
    /// not kept, processes whose maps were not read.
    pub skipped_by_tenant: Vec<TenantSkips>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatReport {
    pub schema: &'static str,
    /// `in_process` (this command loaded the probes) or `daemon` (read from `vgpu-agent run`).
    pub source: &'static str,
    pub duration_seconds: f64,
    pub probes: ProbeInfo,
    /// Lost or unmatched events during the window, by cause (see docs/stat-json.md).
    pub health: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    pub snapshot: SnapshotStatus,
    /// NVML queries by kind: `calls` and `seconds` within the window, `max_seconds` the longest
    /// one since the agent started. Absent without NVML.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub nvml_calls: BTreeMap<String, NvmlCallCost>,
    /// The daemon's freeze of idle containers, as its last snapshot says (absent when it is
    /// off, or in-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_freeze: Option<crate::model::IdleFreezeStatus>,
    /// The daemon's freeze pool, as its last snapshot says (absent when it is off, or
    /// in-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freeze_pool: Option<crate::model::FreezePoolStatus>,
    pub processes: Vec<ProcessRow>,
    pub cgroups: Vec<CgroupRow>,
    pub containers: Vec<ContainerRow>,
}

/// Per cgroup path: pids, live bytes, and calls merged per (API, source).
type CgroupAccumulator = (Vec<u32>, u64, ApiSums);

/// The process's calls during the window (APIs without calls in it are left out).
fn window_apis(p: &Process, before: Option<&Process>) -> Vec<ApiUsage> {
    p.apis_since(before).filter(|a| a.calls > 0).collect()
}

/// The NVML queries made between `first` and `last`, by kind (a daemon restarted in between
/// counts from 0, never below).
fn window_nvml_calls(first: &Snapshot, last: &Snapshot) -> BTreeMap<String, NvmlCallCost> {
    last.agent
        .nvml_calls
        .iter()
        .map(|(call, l)| {
            let f = first
                .agent
                .nvml_calls
                .get(call)
                .copied()
                .unwrap_or_default();
            let cost = NvmlCallCost {
                calls: l.calls.saturating_sub(f.calls),
                seconds: (l.seconds - f.seconds).max(0.0),
                max_seconds: l.max_seconds,
            };
            (call.clone(), cost)
        })
        .collect()
}

/// Builds the report of the window `first..last`. `cgroup_id` maps a cgroup path to its id.
pub fn build(
    first: &Snapshot,
    last: &Snapshot,
    source: &'static str,
    duration_seconds: f64,
    mut cgroup_id: impl FnMut(&str) -> Option<u64>,
) -> StatReport {
    // The window the GPU busy shares are of: between the two snapshots.
    let seconds = match last.taken_at_unix_ms.saturating_sub(first.taken_at_unix_ms) {
        0 => duration_seconds,
        ms => ms as f64 / 1000.0,
    };
    let mut processes = Vec::new();
    let mut cgroups: BTreeMap<String, CgroupAccumulator> = BTreeMap::new();
    for p in &last.processes {
        let apis = window_apis(p, first.process(p.key));
        let live_bytes = p.memory.probes.unwrap_or(0);
        let before = first.process(p.key);
        let communicators: Vec<Communicator> = p
            .communicators
            .iter()
            .map(|c| {
                let earlier =
                    before.and_then(|b| b.communicators.iter().find(|e| e.comm == c.comm));
                Communicator {
                    calls: c.calls - earlier.map(|e| e.calls).unwrap_or(0).min(c.calls),
                    errors: c.errors - earlier.map(|e| e.errors).unwrap_or(0).min(c.errors),
                    bytes: c.bytes - earlier.map(|e| e.bytes).unwrap_or(0).min(c.bytes),
                    ..c.clone()
                }
            })
            .collect();
        if apis.is_empty()
            && live_bytes == 0
            && p.limiter.is_none()
            && p.nvml.is_empty()
            && communicators.is_empty()
        {
            continue;
        }
        let path = p.cgroup_path.clone();
        let group = cgroups.entry(path.clone().unwrap_or_default()).or_default();
        group.0.push(p.key.pid);
        group.1 += live_bytes;
        for a in &apis {
            group.2.add(a);
        }
        let nvml_use = window_use(first, last, &[p.key]);
        processes.push(ProcessRow {
            pid: p.key.pid,
            alive: p.alive,
            comm: Some(p.comm.clone()).filter(|c| c != "?"),
            cmdline: Some(p.cmdline.clone()).filter(|c| !c.is_empty()),
            start_ticks: Some(p.key.start_ticks).filter(|t| *t > 0),
            container: p.container.clone(),
            cgroup_id: path.as_deref().and_then(&mut cgroup_id),
            cgroup_path: path,
            live_bytes,
            live_allocations: p.memory.probes_allocations.unwrap_or(0),
            memory: p.memory.clone(),
            memory_by_device: p.memory_by_device(),
            apis: apis.iter().map(ApiRow::from_usage).collect(),
            communicators,
            gpu_busy: busy_over(first, last, &[p.key], seconds, &nvml_use),
            gpu_use: nvml_use,
            kernels: top_kernels(first, last, &[p.key]),
            probe_losses: p.probe_losses,
            waiting_for_memory: p.limiter.as_ref().and_then(|l| l.waiting_for_memory),
            probe_share: p.probe_seconds.map(|now| {
                let before = first
                    .processes
                    .iter()
                    .find(|q| q.key == p.key)
                    .and_then(|q| q.probe_seconds)
                    .unwrap_or(0.0);
                (now - before).max(0.0) / seconds.max(1e-9)
            }),
        });
    }
    let reported: Vec<u32> = processes.iter().map(|p| p.pid).collect();
    let containers = last
        .containers
        .iter()
        .map(|c| ContainerRow {
            key: c.key.clone(),
            name: c.name.clone(),
            pids: c
                .processes
                .iter()
                .map(|k| k.pid)
                .filter(|p| reported.contains(p))
                .collect(),
            regions: c.regions.clone(),
            probe_losses: c.probe_losses,
            memory_by_device: last.memory_by_device(&c.processes),
            gpu_use: window_use(first, last, &c.processes),
            gpu_busy: busy_over(
                first,
                last,
                &c.processes,
                seconds,
                &window_use(first, last, &c.processes),
            ),
            kernels: top_kernels(first, last, &c.processes),
            frozen: c.frozen.clone(),
        })
        .filter(|c| !c.pids.is_empty() || !c.regions.is_empty())
        .collect();
    let health = last
        .agent
        .events_lost
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(first.agent.events_lost.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    let a = &last.agent;
    let mut warnings = a.warnings.clone();
    warnings.extend(
        a.nvml_problems
            .iter()
            .filter(|p| p.as_str() != "NVML disabled")
            .map(|p| format!("NVML: {p}")),
    );
    warnings.extend(
        a.claims_refused
            .iter()
            .map(|c| format!("not believed: {c}")),
    );
    warnings.dedup();
    StatReport {
        schema: SCHEMA,
        source,
        duration_seconds,
        probes: ProbeInfo {
            unavailable: a.probes_unavailable.clone(),
            attach_mode: a.attach_mode,
            launch_probes: a.launch_probes,
            launch_probe_seconds: (a.launch_probe_seconds - first.agent.launch_probe_seconds)
                .max(0.0),
            cost: a.probe_cost.clone(),
            libraries: a.libraries.clone(),
            budget: a.sampling.as_ref().map(|s| BudgetInfo {
                share: s.budget_share,
                window_seconds: s.window_seconds,
                kinds: s.kinds.clone(),
            }),
        },
        health,
        warnings,
        snapshot: SnapshotStatus {
            age_seconds: a.age_seconds,
            stale: a.stale,
            collect_seconds: a.collect_seconds,
            regions_unread: a.regions_unread.clone(),
            maps_scan: MapsScanStatus {
                late_polls: a
                    .maps_scan
                    .late_polls
                    .saturating_sub(first.agent.maps_scan.late_polls),
                ..a.maps_scan.clone()
            },
            skipped_by_tenant: skips::by_tenant(a),
        },
        nvml_calls: window_nvml_calls(first, last),
        idle_freeze: a.idle_freeze.clone(),
        freeze_pool: a.freeze_pool.clone(),
        processes,
        cgroups: cgroups
            .into_iter()
            .map(|(path, (mut pids, live_bytes, apis))| {
                pids.sort_unstable();
                let path = Some(path).filter(|p| !p.is_empty());
                CgroupRow {
                    cgroup_id: path.as_deref().and_then(&mut cgroup_id),
                    cgroup_path: path,
                    pids,
                    live_bytes,
                    apis: apis.rows().map(ApiRow::from_usage).collect(),
                }
            })
            .collect(),
        containers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AgentStatus, ProcessKey};
    use agent_common::hist::{HIST_BUCKETS, bucket_of};

    fn usage(api: &str, calls: u64, latency: u64) -> ApiUsage {
        let mut hist = vec![0; HIST_BUCKETS];
        hist[bucket_of(latency)] = calls;
        ApiUsage {
            api: api.into(),
            kind: "alloc".into(),
            source: Source::Probes,
            calls,
            errors: 0,
            bytes: calls << 20,
            total_ns: calls * latency,
            hook_ns: 0,
            denied: 0,
            hist,
            latency: None,
            probed: None,
        }
    }

    fn process(pid: u32, start: u64, cgroup: &str, apis: Vec<ApiUsage>, live: u64) -> Process {
        Process {
            key: ProcessKey {
                pid,
                start_ticks: start,
            },
            alive: true,
            comm: "python3".into(),
            cmdline: "python3 x.py".into(),
            container: "host".into(),
            cgroup_path: Some(cgroup.into()),
            memory: MemoryViews {
                probes: Some(live),
                probes_allocations: Some(live >> 20),
                ..Default::default()
            },
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

    fn snapshot(processes: Vec<Process>) -> Snapshot {
        Snapshot {
            schema: crate::model::SCHEMA.into(),
            hostname: "h".into(),
            taken_at_unix_ms: 0,
            interval_seconds: 0.0,
            driver_version: None,
            cuda_driver_version: None,
            agent: AgentStatus::default(),
            gpus: vec![],
            containers: vec![],
            processes,
        }
    }

    #[test]
    fn reports_the_window_per_process_and_cgroup_and_never_merges_a_reused_pid() {
        let first = snapshot(vec![
            process(
                100,
                5,
                "/a",
                vec![usage("cuMemAlloc_v2", 3, 5_000)],
                3 << 20,
            ),
            // pid 200, first life: exits before the window ends.
            process(200, 7, "/a", vec![usage("cuMemAlloc_v2", 50, 5_000)], 0),
        ]);
        let last = snapshot(vec![
            process(
                100,
                5,
                "/a",
                vec![
                    usage("cuMemAlloc_v2", 8, 5_000),
                    usage("cuStreamSynchronize", 10, 200_000),
                ],
                8 << 20,
            ),
            // pid 200 reused by another process: its calls are all in the window.
            process(
                200,
                9,
                "/b",
                vec![usage("cuMemAlloc_v2", 2, 5_000)],
                2 << 20,
            ),
        ]);
        let r = build(&first, &last, "in_process", 1.0, |p| Some(p.len() as u64));
        let p = r.processes.iter().find(|p| p.pid == 100).unwrap();
        let alloc = p.apis.iter().find(|a| a.api == "cuMemAlloc_v2").unwrap();
        assert_eq!(
            (alloc.calls, alloc.bytes),
            (5, 5 << 20),
            "only the window's calls"
        );
        let sync = p
            .apis
            .iter()
            .find(|a| a.api == "cuStreamSynchronize")
            .unwrap();
        assert_eq!(bucket_of(sync.p99_ns.unwrap()), bucket_of(200_000));
        assert_eq!((p.live_bytes, p.live_allocations), (8 << 20, 8));
        let reused = r.processes.iter().find(|p| p.pid == 200).unwrap();
        assert_eq!(
            reused.apis[0].calls, 2,
            "a new process with the old pid is not subtracted from the old one"
        );
        let a = r
            .cgroups
            .iter()
            .find(|c| c.cgroup_path.as_deref() == Some("/a"))
            .unwrap();
        assert_eq!(a.pids, vec![100]);
        assert_eq!(a.cgroup_id, Some(2));
        let b = r
            .cgroups
            .iter()
            .find(|c| c.cgroup_path.as_deref() == Some("/b"))
            .unwrap();
        assert_eq!((b.pids.clone(), b.live_bytes), (vec![200], 2 << 20));
    }

    /// The NVML queries of the window: calls and seconds between the first and the last
    /// snapshot, the longest one as the agent last said; absent without NVML.
    #[test]
    fn nvml_calls_of_the_window() {
        let cost = |calls, seconds, max_seconds| crate::model::NvmlCallCost {
            calls,
            seconds,
            max_seconds,
        };
        let mut first = snapshot(vec![]);
        first.agent.nvml_calls = BTreeMap::from([
            ("process_utilization".to_owned(), cost(20, 0.5, 0.04)),
            ("uuid".to_owned(), cost(2, 0.001, 0.0006)),
        ]);
        let mut last = snapshot(vec![]);
        last.agent.nvml_calls = BTreeMap::from([
            ("process_utilization".to_owned(), cost(40, 1.25, 0.05)),
            ("uuid".to_owned(), cost(2, 0.001, 0.0006)),
            ("init".to_owned(), cost(1, 0.2, 0.2)),
        ]);
        let r = build(&first, &last, "daemon", 10.0, |_| None);
        assert_eq!(r.nvml_calls["process_utilization"], cost(20, 0.75, 0.05));
        assert_eq!(r.nvml_calls["uuid"], cost(0, 0.0, 0.0006));
        assert_eq!(r.nvml_calls["init"], cost(1, 0.2, 0.2), "new in the window");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["nvml_calls"]["process_utilization"]["calls"], 20);
        // A daemon restarted within the window counts from 0, never below.
        let r = build(&last, &first, "daemon", 10.0, |_| None);
        assert_eq!(r.nvml_calls["process_utilization"], cost(0, 0.0, 0.04));
        let none = build(&snapshot(vec![]), &snapshot(vec![]), "daemon", 1.0, |_| {
            None
        });
        assert!(
            serde_json::to_value(&none)
                .unwrap()
                .get("nvml_calls")
                .is_none()
        );
    }

    fn on_gpu(mut p: Process, sm_us: u64, observed_us: u64) -> Process {
        p.nvml = vec![crate::model::NvmlProcess {
            device: 0,
            used_memory: Some(1 << 30),
            sm_util_pct: None,
            mem_util_pct: None,
            use_window: None,
            use_unavailable: None,
            busy: crate::model::gpu_use::Busy {
                sm_us,
                mem_us: sm_us / 2,
                observed_us,
            },
        }];
        p
    }

    #[test]
    fn gpu_use_over_the_window_per_process_and_container() {
        let first = snapshot(vec![
            on_gpu(process(1, 5, "/a", vec![], 0), 1_000_000, 2_000_000),
            on_gpu(process(2, 5, "/a", vec![], 0), 0, 2_000_000),
        ]);
        // 10 s later: process 1 busy 9 s of them, process 2 3 s; process 3 on a device that
        // gives no per-process utilisation (nothing observed).
        let mut last = snapshot(vec![
            on_gpu(process(1, 5, "/a", vec![], 0), 10_000_000, 12_000_000),
            on_gpu(process(2, 5, "/a", vec![], 0), 3_000_000, 12_000_000),
            on_gpu(process(3, 5, "/b", vec![], 0), 0, 0),
        ]);
        last.processes[2].nvml[0].device = 1;
        last.containers = vec![crate::model::Container {
            key: "c".into(),
            name: "c".into(),
            containerised: true,
            runtime: None,
            container_id: None,
            pod_uid: None,
            pod_name: None,
            namespace: None,
            qos: None,
            processes: last.processes[..2].iter().map(|p| p.key).collect(),
            regions: vec![],
            probe_losses: Default::default(),
            frozen: None,
        }];
        let r = build(&first, &last, "in_process", 10.0, |_| None);
        let row = |pid: u32| r.processes.iter().find(|p| p.pid == pid).unwrap();
        let u1 = &row(1).gpu_use[0];
        assert_eq!((u1.device, u1.sm_util_pct), (0, Some(90.0)));
        assert_eq!((u1.sm_busy_seconds, u1.observed_seconds), (9.0, 10.0));
        assert_eq!(u1.mem_util_pct, Some(45.0));
        assert_eq!(row(2).gpu_use[0].sm_util_pct, Some(30.0));
        assert_eq!(
            row(3).gpu_use[0].sm_util_pct,
            None,
            "not measured is null, never 0"
        );
        let c = &r.containers[0].gpu_use;
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].sm_util_pct, Some(120.0), "the processes summed");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["processes"][2]["gpu_use"][0]["sm_util_pct"],
            serde_json::Value::Null
        );
        assert_eq!(json["containers"][0]["gpu_use"][0]["sm_busy_seconds"], 12.0);
    }
}
