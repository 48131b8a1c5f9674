//! The `stat` report: per process and per cgroup, per API. Built from one reading of the kernel
//! maps plus what procfs says about each process. Its JSON form is documented in
//! docs/stat-json.md and versioned by `schema`.

use std::collections::{BTreeMap, HashMap};

use agent_common::{
    ApiId,
    hist::{HIST_BUCKETS, quantile_ns},
    maps::{ApiStats, Health},
};
use serde::Serialize;

use crate::{
    identity::{CgroupIndex, ProcessFacts},
    probes::{AttachMode, calibrate::ProbeCost},
    trace::{LaunchProbes, RawReading},
};

pub const SCHEMA: &str = "vgpu-agent.stat/v1";

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ApiRow {
    pub api: &'static str,
    pub kind: &'static str,
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub total_ns: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// Log2 latency buckets: `hist[i]` counts calls that took [2^i, 2^(i+1)) ns.
    pub hist: Vec<u64>,
    /// What the latency measures, where it is not the call's whole effect: `host_enqueue` for
    /// NCCL (collectives are asynchronous: the time is the host-side call that enqueues them on
    /// a stream, not the transfer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<&'static str>,
}

/// One NCCL communicator of a process.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CommRow {
    /// The `ncclComm_t` (an address in the process), as `0x...`.
    pub comm: String,
    /// This process's rank and the communicator's size, as the successful ncclCommInit* call that
    /// created it said (`null` if it was created before the agent started).
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    /// The API that created it, if seen.
    pub created_by: Option<&'static str>,
    /// ncclCommDestroy or ncclCommAbort succeeded on it.
    pub destroyed: bool,
    /// NCCL calls that named it (collectives, point-to-point, its creation and destruction).
    pub calls: u64,
    pub errors: u64,
    /// Sum of `count x datatype size` of those calls.
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    pub pid: u32,
    /// Still running when the report was made.
    pub alive: bool,
    pub comm: Option<String>,
    pub cmdline: Option<String>,
    pub start_ticks: Option<u64>,
    /// The cgroup the process is in now (alive) or made most calls from (exited).
    pub cgroup_id: u64,
    pub cgroup_path: Option<String>,
    /// Device memory allocated through the traced APIs and not yet freed, as the probes saw it.
    pub live_bytes: u64,
    pub live_allocations: u64,
    pub apis: Vec<ApiRow>,
    /// NCCL communicators the process created or used while traced.
    pub communicators: Vec<CommRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CgroupRow {
    pub cgroup_id: u64,
    pub cgroup_path: Option<String>,
    pub pids: Vec<u32>,
    pub live_bytes: u64,
    pub apis: Vec<ApiRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LibraryRow {
    pub path: String,
    pub attach_path: String,
    pub dev: u64,
    pub inode: u64,
    pub found_by: crate::discovery::FoundBy,
    pub symbols_attached: usize,
    pub symbols_missing: Vec<&'static str>,
    /// First instruction of the probed functions, by kind of instruction (decides the probe cost).
    pub prologues: BTreeMap<String, usize>,
    pub kinds_attached: Vec<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProbeInfo {
    pub attach_mode: AttachMode,
    pub launch_probes: LaunchProbes,
    /// Seconds the launch probes were attached during the run.
    pub launch_probe_seconds: f64,
    pub cost: Option<ProbeCost>,
    pub libraries: Vec<LibraryRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatReport {
    pub schema: &'static str,
    pub duration_seconds: f64,
    pub probes: ProbeInfo,
    /// Lost or inconsistent events, by cause (see docs/stat-json.md).
    pub health: BTreeMap<&'static str, u64>,
    pub warnings: Vec<String>,
    pub processes: Vec<ProcessRow>,
    pub cgroups: Vec<CgroupRow>,
}

fn add_stats(into: &mut ApiStats, s: &ApiStats) {
    into.calls += s.calls;
    into.errors += s.errors;
    into.bytes += s.bytes;
    into.total_ns += s.total_ns;
    for (a, b) in into.hist.iter_mut().zip(s.hist.iter()) {
        *a += b;
    }
}

fn rows(per_api: &BTreeMap<u16, ApiStats>) -> Vec<ApiRow> {
    per_api
        .iter()
        .filter_map(|(&api, s)| {
            let spec = ApiId(api).spec()?;
            let hist: &[u64; HIST_BUCKETS] = &s.hist;
            Some(ApiRow {
                api: spec.name,
                kind: spec.kind.name(),
                calls: s.calls,
                errors: s.errors,
                bytes: s.bytes,
                total_ns: s.total_ns,
                p50_ns: quantile_ns(hist, 0.50),
                p99_ns: quantile_ns(hist, 0.99),
                hist: s.hist.to_vec(),
                latency: spec.kind.is_nccl().then_some("host_enqueue"),
            })
        })
        .collect()
}

/// Process facts, looked up once per pid (gone processes have none).
pub trait ProcessLookup {
    /// What is known of a process, and whether it is still running.
    fn facts(&mut self, pid: u32) -> (Option<ProcessFacts>, bool);
    fn cgroup_path(&mut self, id: u64) -> Option<String>;
    /// The id of a cgroup path, for processes that are alive.
    fn cgroup_id(&mut self, path: &str) -> Option<u64>;
}

/// Looks processes up in procfs and cgroups in the cgroup2 tree.
pub struct HostLookup<'a> {
    pub proc: &'a std::path::Path,
    pub cgroups: CgroupIndex,
    /// Facts remembered from processes that may have exited since.
    pub remembered: &'a HashMap<u32, ProcessFacts>,
}

impl ProcessLookup for HostLookup<'_> {
    fn facts(&mut self, pid: u32) -> (Option<ProcessFacts>, bool) {
        let now = ProcessFacts::read(self.proc, pid);
        match (now, self.remembered.get(&pid)) {
            (Some(now), _) => (Some(now), true),
            (None, Some(old)) => (
                Some(ProcessFacts {
                    cgroup_path: None,
                    ..old.clone()
                }),
                false,
            ),
            (None, None) => (None, false),
        }
    }
    fn cgroup_path(&mut self, id: u64) -> Option<String> {
        self.cgroups.path_of(id)
    }
    fn cgroup_id(&mut self, path: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let mount = self.cgroups.mount()?;
        std::fs::metadata(mount.join(path.trim_start_matches('/')))
            .ok()
            .map(|m| m.ino())
    }
}

/// Builds the report. `own_pid` (the agent) is left out.
pub fn build(
    reading: &RawReading,
    lookup: &mut dyn ProcessLookup,
    probes: ProbeInfo,
    duration_seconds: f64,
    warnings: Vec<String>,
    own_pid: u32,
) -> StatReport {
    // (tgid) -> cgroup -> api -> stats
    let mut by_proc: BTreeMap<u32, BTreeMap<u64, BTreeMap<u16, ApiStats>>> = BTreeMap::new();
    for (k, s) in &reading.stats {
        if k.tgid == own_pid {
            continue;
        }
        let slot = by_proc
            .entry(k.tgid)
            .or_default()
            .entry(k.cgroup_id)
            .or_default();
        add_stats(slot.entry(k.api).or_insert(ApiStats::ZERO), s);
    }
    // (tgid) -> comm -> row
    let mut comms: BTreeMap<u32, BTreeMap<u64, CommRow>> = BTreeMap::new();
    let comm_row = |comm: u64| CommRow {
        comm: format!("{comm:#x}"),
        rank: None,
        nranks: None,
        created_by: None,
        destroyed: false,
        calls: 0,
        errors: 0,
        bytes: 0,
    };
    for (k, s) in &reading.nccl_stats {
        if k.tgid == own_pid {
            continue;
        }
        let slot = by_proc
            .entry(k.tgid)
            .or_default()
            .entry(k.cgroup_id)
            .or_default();
        add_stats(slot.entry(k.api).or_insert(ApiStats::ZERO), s);
        if k.comm != 0 {
            let c = comms
                .entry(k.tgid)
                .or_default()
                .entry(k.comm)
                .or_insert_with(|| comm_row(k.comm));
            c.calls += s.calls;
            c.errors += s.errors;
            c.bytes += s.bytes;
        }
    }
    for (k, info) in &reading.nccl_comms {
        if k.tgid == own_pid {
            continue;
        }
        by_proc.entry(k.tgid).or_default();
        let c = comms
            .entry(k.tgid)
            .or_default()
            .entry(k.comm)
            .or_insert_with(|| comm_row(k.comm));
        c.rank = Some(info.rank);
        c.nranks = Some(info.nranks);
        c.created_by = Some(ApiId(info.init_api).name());
        c.destroyed = info.destroyed != 0;
    }
    let live: HashMap<u32, _> = reading.live.iter().map(|(t, l)| (*t, *l)).collect();
    for &tgid in live.keys() {
        if tgid != own_pid {
            by_proc.entry(tgid).or_default();
        }
    }

    let mut processes = Vec::new();
    let mut cgroups: BTreeMap<u64, CgroupRow> = BTreeMap::new();
    let mut cgroup_apis: BTreeMap<u64, BTreeMap<u16, ApiStats>> = BTreeMap::new();
    for (tgid, per_cgroup) in by_proc {
        let (facts, alive) = lookup.facts(tgid);
        let mut merged: BTreeMap<u16, ApiStats> = BTreeMap::new();
        let mut busiest = (0u64, 0u64);
        for (&cg, apis) in &per_cgroup {
            let calls: u64 = apis.values().map(|s| s.calls).sum();
            if calls >= busiest.1 {
                busiest = (cg, calls);
            }
            let cg_apis = cgroup_apis.entry(cg).or_default();
            for (&api, s) in apis {
                add_stats(merged.entry(api).or_insert(ApiStats::ZERO), s);
                add_stats(cg_apis.entry(api).or_insert(ApiStats::ZERO), s);
            }
            let row = cgroups.entry(cg).or_insert_with(|| CgroupRow {
                cgroup_id: cg,
                cgroup_path: None,
                pids: Vec::new(),
                live_bytes: 0,
                apis: Vec::new(),
            });
            row.pids.push(tgid);
        }
        // Where the process is now, if it is alive; else where it made most calls.
        let current = facts
            .as_ref()
            .and_then(|f| f.cgroup_path.clone())
            .and_then(|p| lookup.cgroup_id(&p));
        let cgroup_id = current.unwrap_or(busiest.0);
        let l = live.get(&tgid).copied();
        let live_bytes = l.map(|l| l.bytes).unwrap_or(0);
        let cg_row = cgroups.entry(cgroup_id).or_insert_with(|| CgroupRow {
            cgroup_id,
            cgroup_path: None,
            pids: Vec::new(),
            live_bytes: 0,
            apis: Vec::new(),
        });
        cg_row.live_bytes += live_bytes;
        if !cg_row.pids.contains(&tgid) {
            cg_row.pids.push(tgid);
        }
        processes.push(ProcessRow {
            pid: tgid,
            alive,
            comm: facts.as_ref().map(|f| f.comm.clone()),
            cmdline: facts.as_ref().map(|f| f.cmdline.clone()),
            start_ticks: facts.as_ref().map(|f| f.start_ticks),
            cgroup_id,
            cgroup_path: lookup.cgroup_path(cgroup_id),
            live_bytes,
            live_allocations: l.map(|l| l.allocations).unwrap_or(0),
            apis: rows(&merged),
            communicators: comms
                .remove(&tgid)
                .map(|m| m.into_values().collect())
                .unwrap_or_default(),
        });
    }
    for (id, row) in cgroups.iter_mut() {
        row.cgroup_path = lookup.cgroup_path(*id);
        row.apis = cgroup_apis.get(id).map(rows).unwrap_or_default();
        row.pids.sort_unstable();
    }
    let health = Health::ALL
        .iter()
        .map(|h| (h.name(), reading.health[*h as usize]))
        .collect();
    StatReport {
        schema: SCHEMA,
        duration_seconds,
        probes,
        health,
        warnings,
        processes,
        cgroups: cgroups.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::{hist::bucket_of, maps::StatsKey};

    struct Fake;
    impl ProcessLookup for Fake {
        fn facts(&mut self, pid: u32) -> (Option<ProcessFacts>, bool) {
            let f = (pid == 100).then(|| ProcessFacts {
                pid,
                start_ticks: 5,
                comm: "python3".into(),
                cmdline: "python3 train.py".into(),
                cgroup_path: Some("/b".into()),
            });
            let alive = f.is_some();
            (f, alive)
        }
        fn cgroup_path(&mut self, id: u64) -> Option<String> {
            Some(format!("/{}", (b'a' + id as u8 - 1) as char))
        }
        fn cgroup_id(&mut self, path: &str) -> Option<u64> {
            Some((path.as_bytes()[1] - b'a' + 1) as u64)
        }
    }

    fn stats(calls: u64, errors: u64, bytes: u64, latency: u64) -> ApiStats {
        let mut s = ApiStats::ZERO;
        s.calls = calls;
        s.errors = errors;
        s.bytes = bytes;
        s.total_ns = calls * latency;
        s.hist[bucket_of(latency)] = calls;
        s
    }

    fn probe_info() -> ProbeInfo {
        ProbeInfo {
            attach_mode: AttachMode::Multi,
            launch_probes: LaunchProbes::Off,
            launch_probe_seconds: 0.0,
            cost: None,
            libraries: vec![],
        }
    }

    #[test]
    fn splits_by_process_and_cgroup_and_follows_a_moved_process() {
        let alloc = ApiId::from_name("cuMemAlloc_v2").unwrap().0;
        let sync = ApiId::from_name("cuStreamSynchronize").unwrap().0;
        let key = |cg, tgid, api| StatsKey {
            cgroup_id: cg,
            tgid,
            api,
            _pad: 0,
        };
        let reading = RawReading {
            stats: vec![
                // pid 100 made calls in cgroup 1 (/a), then moved to cgroup 2 (/b).
                (key(1, 100, alloc), stats(3, 0, 3 << 20, 5_000)),
                (key(2, 100, alloc), stats(2, 1, 2 << 20, 5_000)),
                (key(2, 100, sync), stats(10, 0, 0, 200_000)),
                // pid 200 exited; it ran in cgroup 1.
                (key(1, 200, alloc), stats(1, 0, 1 << 20, 5_000)),
                // The agent's own rows are dropped.
                (key(1, 7, alloc), stats(1, 0, 0, 1)),
            ],
            live: vec![(
                100,
                agent_common::maps::LiveMem {
                    bytes: 4 << 20,
                    allocations: 4,
                },
            )],
            nccl_stats: vec![],
            nccl_comms: vec![],
            health: [0; Health::COUNT as usize],
        };
        let r = build(&reading, &mut Fake, probe_info(), 1.0, vec![], 7);
        assert_eq!(r.processes.len(), 2);
        let p = &r.processes[0];
        assert_eq!(
            (p.pid, p.alive, p.cgroup_id, p.live_bytes),
            (100, true, 2, 4 << 20)
        );
        let a = p.apis.iter().find(|a| a.api == "cuMemAlloc_v2").unwrap();
        assert_eq!((a.calls, a.errors, a.bytes), (5, 1, 5 << 20));
        let s = p
            .apis
            .iter()
            .find(|a| a.api == "cuStreamSynchronize")
            .unwrap();
        assert_eq!(bucket_of(s.p99_ns.unwrap()), bucket_of(200_000));
        let gone = &r.processes[1];
        assert_eq!((gone.pid, gone.alive, gone.cgroup_id), (200, false, 1));

        let cg_a = r.cgroups.iter().find(|c| c.cgroup_id == 1).unwrap();
        assert_eq!(cg_a.cgroup_path.as_deref(), Some("/a"));
        assert_eq!(cg_a.pids, vec![100, 200]);
        assert_eq!(
            cg_a.apis[0].calls, 4,
            "3 calls of pid 100 before the move + 1 of pid 200"
        );
        assert_eq!(cg_a.live_bytes, 0);
        let cg_b = r.cgroups.iter().find(|c| c.cgroup_id == 2).unwrap();
        assert_eq!(cg_b.live_bytes, 4 << 20, "live memory follows the process");
        assert_eq!(cg_b.apis.iter().map(|a| a.calls).sum::<u64>(), 12);
        assert!(p.communicators.is_empty());
        assert!(a.latency.is_none());
    }

    #[test]
    fn nccl_rows_are_api_rows_and_communicators_are_listed_per_process() {
        use agent_common::maps::{NcclCommInfo, NcclCommKey, NcclStatsKey};
        let id = |n| ApiId::from_name(n).unwrap().0;
        let key = |tgid, api, comm| NcclStatsKey {
            cgroup_id: 2,
            tgid,
            api,
            _pad: 0,
            comm,
        };
        let comm = 0x5555_0000_1000u64;
        let reading = RawReading {
            nccl_stats: vec![
                (
                    key(100, id("ncclCommInitRankConfig"), comm),
                    stats(1, 0, 0, 50_000_000),
                ),
                (
                    key(100, id("ncclAllReduce"), comm),
                    stats(50, 0, 50 << 22, 8_000),
                ),
                (key(100, id("ncclAllReduce"), 0), stats(2, 2, 0, 1_000)),
                (key(100, id("ncclGroupStart"), 0), stats(3, 0, 0, 100)),
                (key(7, id("ncclAllReduce"), comm), stats(1, 0, 4, 1)),
            ],
            nccl_comms: vec![
                (
                    NcclCommKey {
                        tgid: 100,
                        _pad: 0,
                        comm,
                    },
                    NcclCommInfo {
                        rank: 1,
                        nranks: 2,
                        init_api: id("ncclCommInitRankConfig"),
                        destroyed: 0,
                        _pad: 0,
                    },
                ),
                (
                    NcclCommKey {
                        tgid: 100,
                        _pad: 0,
                        comm: 0x77,
                    },
                    NcclCommInfo {
                        rank: 0,
                        nranks: 1,
                        init_api: id("ncclCommInitAll"),
                        destroyed: 1,
                        _pad: 0,
                    },
                ),
            ],
            ..RawReading::default()
        };
        let r = build(&reading, &mut Fake, probe_info(), 1.0, vec![], 7);
        assert_eq!(r.processes.len(), 1, "the agent's own rows are dropped");
        let p = &r.processes[0];
        let ar = p.apis.iter().find(|a| a.api == "ncclAllReduce").unwrap();
        assert_eq!(
            (ar.kind, ar.calls, ar.errors, ar.bytes),
            ("nccl", 52, 2, 50 << 22)
        );
        assert_eq!(ar.latency, Some("host_enqueue"));
        assert_eq!(
            p.communicators,
            vec![
                CommRow {
                    comm: "0x77".into(),
                    rank: Some(0),
                    nranks: Some(1),
                    created_by: Some("ncclCommInitAll"),
                    destroyed: true,
                    calls: 0,
                    errors: 0,
                    bytes: 0,
                },
                CommRow {
                    comm: "0x555500001000".into(),
                    rank: Some(1),
                    nranks: Some(2),
                    created_by: Some("ncclCommInitRankConfig"),
                    destroyed: false,
                    calls: 51,
                    errors: 0,
                    bytes: 50 << 22,
                },
            ]
        );
        let cg = r.cgroups.iter().find(|c| c.cgroup_id == 2).unwrap();
        assert_eq!(cg.apis.iter().map(|a| a.calls).sum::<u64>(), 56);
    }
}
