//! Building one snapshot from the raw inputs of a refresh.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use agent_common::{ApiId, hist::HIST_BUCKETS, maps::Health};

use super::{
    processes::ProcessTable,
    regions::{RegionRead, RegionReading},
};
use crate::{
    discovery::FileId,
    identity::{
        CgroupIndex, ProcessFacts,
        container::{ContainerIdentity, ContainerKey},
        runtime_names::RuntimeNames,
    },
    model::{
        AllocSizes, ApiUsage, Communicator, Container, GpuDevice, LimiterProcess, MemoryViews,
        NvmlProcess, Process, ProcessKey, RegionDevice, RegionInfo, RegionUnread, Snapshot, Source,
        probing::ProbeLosses,
    },
    nvml::GpuSnapshot,
    probes::session::{RawReading, Tracer},
};

pub struct Inputs<'a> {
    pub reading: &'a RawReading,
    pub users: &'a [(u32, FileId)],
    pub gpu: &'a GpuSnapshot,
    pub regions: &'a [RegionReading],
    pub tracer: Option<&'a Tracer>,
    pub own_pid: u32,
}

/// Clock ticks per second, for process start times (100, Linux's usual, if unknown).
fn ticks_per_second() -> u64 {
    crate::sys::clock::ticks_per_second().unwrap_or(100)
}

fn container_key(identity: &ContainerIdentity) -> String {
    match identity.key() {
        ContainerKey::Container(id) => id.as_str().to_owned(),
        ContainerKey::Cgroup(path) if path == "/" || path.is_empty() => "host".into(),
        ContainerKey::Cgroup(path) => format!("cgroup:{path}"),
    }
}

/// What the limiter's regions say, per host pid.
struct SlotView {
    region: String,
    slot: u32,
    held: Vec<u64>,
    context: Vec<u64>,
    throttled_ns: u64,
    dropped_records: u64,
    problems: Vec<String>,
    apis: Vec<ApiUsage>,
}

pub(super) fn own_pid_namespace() -> Option<u64> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| super::processes::namespace_inode(&l.to_string_lossy()))
}

pub fn build(
    inp: Inputs<'_>,
    procs: &mut ProcessTable,
    names: &mut RuntimeNames,
    cgroups: &mut CgroupIndex,
    now: Instant,
) -> Snapshot {
    // Every pid that is a GPU process by any source.
    let mut pids: HashSet<u32> = HashSet::new();
    pids.extend(inp.reading.stats.iter().map(|(k, _)| k.tgid));
    pids.extend(inp.reading.live.iter().map(|(t, _)| *t));
    pids.extend(inp.reading.losses.iter().map(|(t, _)| *t));
    pids.extend(inp.reading.nccl_stats.iter().map(|(k, _)| k.tgid));
    pids.extend(inp.reading.nccl_comms.iter().map(|(k, _)| k.tgid));
    pids.extend(inp.users.iter().map(|(p, _)| *p));
    for d in &inp.gpu.devices {
        pids.extend(d.processes.iter().map(|p| p.pid));
    }
    pids.remove(&inp.own_pid);
    for pid in &pids {
        procs.get(*pid);
    }

    // Regions: match slots to host processes; keep the region summaries.
    let my_ns = own_pid_namespace();
    let mut slots: HashMap<u32, SlotView> = HashMap::new();
    let mut region_infos: Vec<(RegionInfo, Vec<u32>)> = Vec::new();
    let mut region_errors = 0;
    let mut regions_unread = Vec::new();
    for RegionReading {
        path,
        read,
        writable_by_others,
    } in inp.regions
    {
        let shown = path.display().to_string();
        let mut info = RegionInfo {
            path: shown.clone(),
            format: String::new(),
            devices: vec![],
            problems: vec![],
            read_retries: 0,
            writable_by_others: writable_by_others.clone(),
        };
        let mut owners = Vec::new();
        match read {
            RegionRead::Failed(format, why) => {
                info.format = format!("{format:?}").to_lowercase();
                info.problems.push(why.clone());
                region_errors += 1;
            }
            RegionRead::Blocked { format, seconds } => {
                info.format = format!("{format:?}").to_lowercase();
                info.problems.push(format!(
                    "not read: a read of it started {seconds:.1}s ago has not returned (blocked file)"
                ));
                regions_unread.push(RegionUnread {
                    path: shown.clone(),
                    reason: "blocked".into(),
                    slots: 0,
                    blocked_seconds: *seconds,
                });
            }
            RegionRead::Vgpu(s) => {
                info.format = "vgpu".into();
                info.read_retries = s.counters.seqlock_retries;
                info.devices = s
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, d)| RegionDevice {
                        index: i as u32,
                        memory_limit: d.memory_limit,
                        sm_limit_pct: d.sm_limit,
                        reserved: d.reserved,
                        denied: d.denied,
                        context_charge: super::context_charge::vgpu(s, i),
                    })
                    .collect();
                // The limiter's regions have room for 16 devices whatever the host has: show the
                // devices that exist (NVML's count), else the ones in use, at least one.
                let active = info
                    .devices
                    .iter()
                    .rposition(|d| d.reserved > 0 || d.denied > 0)
                    .map_or(1, |i| i + 1);
                let keep = if inp.gpu.devices.is_empty() {
                    active
                } else {
                    inp.gpu.devices.len().max(active)
                };
                info.devices.truncate(keep);
                if let Some(u) = &s.unread {
                    let reason = match u.limit {
                        region::reader::BudgetLimit::Time => "time",
                        region::reader::BudgetLimit::Retries => "retries",
                    };
                    info.problems.push(format!(
                        "read budget exhausted ({reason}): {} claimed slot(s) from slot {} not read this snapshot",
                        u.slots, u.first_slot
                    ));
                    regions_unread.push(RegionUnread {
                        path: shown.clone(),
                        reason: reason.into(),
                        slots: u.slots,
                        blocked_seconds: 0.0,
                    });
                }
                if s.counters.shards_skipped > 0 {
                    info.problems.push(format!(
                        "{} statistics shard(s) skipped (stuck or busy writer)",
                        s.counters.shards_skipped
                    ));
                }
                for slot in &s.slots {
                    let host_pid = if Some(slot.pid_ns) == my_ns {
                        Some(slot.pid)
                    } else {
                        procs.find_by_namespace(slot.pid_ns, slot.pid, slot.start_time)
                    };
                    let problems: Vec<String> = slot
                        .shard_problems
                        .iter()
                        .map(|p| {
                            format!(
                                "shard {} {:?} (tid {}, seq {})",
                                p.shard, p.kind, p.tid, p.seq
                            )
                            .to_lowercase()
                        })
                        .collect();
                    let Some(pid) = host_pid else {
                        info.problems.push(format!(
                            "slot {}: pid {} (start {}) matches no process here{}",
                            slot.index,
                            slot.pid,
                            slot.start_time,
                            if slot.alive == Some(false) {
                                " (its writer died)"
                            } else {
                                ""
                            }
                        ));
                        continue;
                    };
                    owners.push(pid);
                    let apis = slot
                        .apis
                        .iter()
                        .filter_map(|a| {
                            let spec = a.api.spec()?;
                            Some(ApiUsage {
                                api: spec.name.into(),
                                kind: spec.kind.name().into(),
                                source: Source::Limiter,
                                calls: a.calls,
                                errors: a.errors,
                                bytes: a.bytes_allocated + a.bytes_freed,
                                total_ns: a.latency_ns,
                                hook_ns: a.hook_ns,
                                denied: a.denied,
                                hist: a.histogram.to_vec(),
                                latency: None,
                            })
                        })
                        .collect();
                    slots.insert(
                        pid,
                        SlotView {
                            region: shown.clone(),
                            slot: slot.index,
                            // The devices shown for the region (what a slot holds is
                            // reserved on its device, so nothing held is cut off).
                            held: slot.held.iter().take(keep).copied().collect(),
                            context: slot.context_bytes.iter().take(keep).copied().collect(),
                            throttled_ns: slot.throttled_ns,
                            dropped_records: slot.dropped_records,
                            problems,
                            apis,
                        },
                    );
                }
            }
            RegionRead::Hami(h) => {
                info.format = "hami".into();
                info.devices = (0..h.device_count)
                    .map(|i| RegionDevice {
                        index: i as u32,
                        memory_limit: h.limit.get(i).copied().unwrap_or(0),
                        sm_limit_pct: h.sm_limit.get(i).copied().unwrap_or(0).min(100) as u8,
                        reserved: h
                            .processes
                            .iter()
                            .map(|p| p.used_total.get(i).copied().unwrap_or(0))
                            .sum(),
                        denied: 0,
                        context_charge: super::context_charge::hami(h, i),
                    })
                    .collect();
                for p in &h.processes {
                    if !p.consistent {
                        info.problems.push(format!(
                            "slot {}: inconsistent read (a writer died mid-update?)",
                            p.slot
                        ));
                    }
                    if p.hostpid > 0 {
                        let pid = p.hostpid as u32;
                        owners.push(pid);
                        slots.insert(
                            pid,
                            SlotView {
                                region: shown.clone(),
                                slot: p.slot as u32,
                                held: p.used_total.clone(),
                                context: p.context_size.clone(),
                                throttled_ns: 0,
                                dropped_records: 0,
                                problems: vec![],
                                apis: vec![],
                            },
                        );
                    } else {
                        info.problems.push(format!(
                            "slot {}: container pid {} has no host pid yet",
                            p.slot, p.pid
                        ));
                    }
                }
            }
        }
        for pid in &owners {
            pids.insert(*pid);
            procs.get(*pid);
        }
        region_infos.push((info, owners));
    }

    // Probe rows per process.
    let mut probe_apis: BTreeMap<u32, BTreeMap<u16, agent_common::maps::ApiStats>> =
        BTreeMap::new();
    for (k, s) in &inp.reading.stats {
        let row = probe_apis
            .entry(k.tgid)
            .or_default()
            .entry(k.api)
            .or_insert(agent_common::maps::ApiStats::ZERO);
        row.calls += s.calls;
        row.errors += s.errors;
        row.bytes += s.bytes;
        row.total_ns += s.total_ns;
        for (a, b) in row.hist.iter_mut().zip(s.hist.iter()) {
            *a += b;
        }
    }
    // NCCL rows are API rows too; per communicator they also add up.
    let mut communicators: BTreeMap<u32, BTreeMap<u64, Communicator>> = BTreeMap::new();
    let new_comm = |comm: u64| Communicator {
        comm: format!("{comm:#x}"),
        comm_id: None,
        rank: None,
        nranks: None,
        created_by: None,
        destroyed: false,
        calls: 0,
        errors: 0,
        bytes: 0,
    };
    for (k, s) in &inp.reading.nccl_stats {
        let row = probe_apis
            .entry(k.tgid)
            .or_default()
            .entry(k.api)
            .or_insert(agent_common::maps::ApiStats::ZERO);
        row.calls += s.calls;
        row.errors += s.errors;
        row.bytes += s.bytes;
        row.total_ns += s.total_ns;
        for (a, b) in row.hist.iter_mut().zip(s.hist.iter()) {
            *a += b;
        }
        if k.comm != 0 {
            let c = communicators
                .entry(k.tgid)
                .or_default()
                .entry(k.comm)
                .or_insert_with(|| new_comm(k.comm));
            c.calls += s.calls;
            c.errors += s.errors;
            c.bytes += s.bytes;
        }
    }
    for (k, info) in &inp.reading.nccl_comms {
        let c = communicators
            .entry(k.tgid)
            .or_default()
            .entry(k.comm)
            .or_insert_with(|| new_comm(k.comm));
        c.rank = Some(info.rank);
        c.nranks = Some(info.nranks);
        c.created_by = Some(ApiId(info.init_api).name().to_owned());
        c.comm_id = (info.comm_id != 0).then(|| format!("{:#x}", info.comm_id));
        c.destroyed = info.destroyed != 0;
    }
    let live: HashMap<u32, (u64, u64)> = inp
        .reading
        .live
        .iter()
        .map(|(t, l)| (*t, (l.bytes, l.allocations)))
        .collect();
    let mut losses: HashMap<u32, ProbeLosses> = HashMap::new();
    for (tgid, l) in &inp.reading.losses {
        let e = losses.entry(*tgid).or_default();
        e.allocations_untracked += l.allocs_untracked;
        e.bytes_untracked += l.bytes_untracked;
        e.calls_unaggregated += l.calls_unaggregated;
    }
    for (tgid, n) in &inp.reading.rows_reset {
        losses.entry(*tgid).or_default().rows_reset += n;
    }
    let user_file: HashMap<u32, FileId> = inp.users.iter().copied().collect();
    let tick_ns = 1_000_000_000 / ticks_per_second();

    let mut processes = Vec::new();
    let mut identities: HashMap<ProcessKey, ContainerIdentity> = HashMap::new();
    let mut sorted: Vec<u32> = pids.into_iter().collect();
    sorted.sort_unstable();
    for pid in sorted {
        let (facts, identity, alive) = match procs.get(pid) {
            Some(info) => (info.facts.clone(), info.identity.clone(), true),
            None => {
                let remembered = inp
                    .tracer
                    .and_then(|t| t.seen_processes().get(&pid).cloned());
                let mut facts = remembered.unwrap_or(ProcessFacts {
                    pid,
                    start_ticks: 0,
                    comm: "?".into(),
                    cmdline: String::new(),
                    cgroup_path: None,
                });
                if facts.cgroup_path.is_none() {
                    // Gone before its cgroup was read: the probes' rows name the cgroup id.
                    let id = inp
                        .reading
                        .stats
                        .iter()
                        .find(|(k, _)| k.tgid == pid)
                        .map(|(k, _)| k.cgroup_id);
                    facts.cgroup_path = id.and_then(|id| cgroups.path_of(id));
                }
                let identity =
                    ContainerIdentity::from_path(facts.cgroup_path.as_deref().unwrap_or("/"));
                (facts, identity, false)
            }
        };
        let key = ProcessKey {
            pid,
            start_ticks: facts.start_ticks,
        };
        let mut apis: Vec<ApiUsage> = probe_apis
            .get(&pid)
            .into_iter()
            .flatten()
            .filter_map(|(&api, s)| {
                let spec = ApiId(api).spec()?;
                Some(ApiUsage {
                    api: spec.name.into(),
                    kind: spec.kind.name().into(),
                    source: Source::Probes,
                    calls: s.calls,
                    errors: s.errors,
                    bytes: s.bytes,
                    total_ns: s.total_ns,
                    hook_ns: 0,
                    denied: 0,
                    hist: s.hist[..HIST_BUCKETS].to_vec(),
                    latency: spec.kind.is_nccl().then(|| "host_enqueue".to_owned()),
                })
            })
            .collect();
        let slot = slots.remove(&pid);
        let nvml: Vec<NvmlProcess> = inp
            .gpu
            .devices
            .iter()
            .flat_map(|d| {
                d.processes
                    .iter()
                    .filter(move |p| p.pid == pid)
                    .map(move |p| super::gpu_use::nvml_process(d, p))
            })
            .collect();
        let probe_losses = losses.get(&pid).copied().unwrap_or_default();
        let probes_complete = match (inp.tracer, user_file.get(&pid)) {
            (Some(t), Some(file)) => t
                .attached_at_boot_ns(*file)
                .is_some_and(|at| facts.start_ticks * tick_ns > at),
            _ => false,
        } && !probe_losses.memory_incomplete();
        let memory = MemoryViews {
            limiter: slot.as_ref().map(|s| s.held.iter().sum()),
            limiter_allocations: slot.as_ref().map(|s| {
                s.held
                    .iter()
                    .sum::<u64>()
                    .saturating_sub(s.context.iter().sum())
            }),
            probes: if inp.tracer.is_some()
                && (live.contains_key(&pid) || probe_apis.contains_key(&pid))
            {
                Some(live.get(&pid).map(|l| l.0).unwrap_or(0))
            } else {
                None
            },
            probes_allocations: live.get(&pid).map(|l| l.1),
            probes_complete,
            nvml: if nvml.iter().any(|n| n.used_memory.is_some()) {
                Some(nvml.iter().filter_map(|n| n.used_memory).sum())
            } else {
                None
            },
            drift: None,
        }
        .reconcile();
        let limiter = slot.map(|s| {
            apis.extend(s.apis);
            LimiterProcess {
                region: s.region,
                slot: s.slot,
                held: s.held,
                context_bytes: s.context,
                throttled_ns: s.throttled_ns,
                dropped_records: s.dropped_records,
                shard_problems: s.problems,
            }
        });
        processes.push(Process {
            key,
            alive,
            comm: facts.comm.clone(),
            cmdline: facts.cmdline.clone(),
            container: container_key(&identity),
            cgroup_path: facts.cgroup_path.clone(),
            memory,
            apis,
            limiter,
            nvml,
            communicators: communicators
                .remove(&pid)
                .map(|m| m.into_values().collect())
                .unwrap_or_default(),
            alloc_sizes: inp
                .reading
                .alloc_sizes
                .iter()
                .filter(|(k, _)| k.tgid == pid)
                .filter_map(|(k, v)| {
                    let name = ApiId(k.api).spec()?.name;
                    Some(AllocSizes {
                        api: name.to_owned(),
                        pool: name.starts_with("cuMemAllocAsync")
                            || name.starts_with("cuMemAllocFromPoolAsync"),
                        log2: k.log2,
                        count: v.count,
                        bytes: v.bytes,
                    })
                })
                .collect(),
            rates: None,
            probe_losses,
        });
        identities.insert(key, identity);
    }

    // Containers, named where the runtime tells.
    let mut containers: BTreeMap<String, Container> = BTreeMap::new();
    for p in &processes {
        let entry = containers.entry(p.container.clone()).or_insert_with(|| {
            let identity = identities
                .get(&p.key)
                .cloned()
                .unwrap_or_else(|| ContainerIdentity::from_path("/"));
            let found = names.lookup(&identity, now);
            Container {
                key: p.container.clone(),
                name: identity.display_name(found.as_ref()),
                containerised: identity.is_containerised(),
                runtime: identity.runtime.map(|r| format!("{r:?}").to_lowercase()),
                container_id: identity
                    .container_id
                    .as_ref()
                    .map(|c| c.as_str().to_owned()),
                pod_uid: identity.pod.as_ref().map(|p| p.uid.as_str().to_owned()),
                pod_name: found
                    .as_ref()
                    .and_then(|n| n.pod.as_ref().map(|p| p.name.clone())),
                namespace: found
                    .as_ref()
                    .and_then(|n| n.pod.as_ref().map(|p| p.namespace.clone())),
                qos: identity
                    .pod
                    .as_ref()
                    .map(|p| format!("{:?}", p.qos).to_lowercase()),
                processes: vec![],
                regions: vec![],
                probe_losses: Default::default(),
            }
        });
        entry.processes.push(p.key);
        entry.probe_losses.add(&p.probe_losses);
    }
    let regions_read = region_infos.len();
    for (info, owners) in region_infos {
        let owner_container = owners
            .iter()
            .find_map(|pid| processes.iter().find(|p| p.key.pid == *pid))
            .map(|p| p.container.clone());
        let key = owner_container.unwrap_or_else(|| format!("region:{}", info.path));
        let entry = containers.entry(key.clone()).or_insert_with(|| Container {
            key: key.clone(),
            // HAMi's host directories are named <podUID>_<container>.
            name: std::path::Path::new(&info.path)
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| info.path.clone()),
            containerised: true,
            runtime: None,
            container_id: None,
            pod_uid: None,
            pod_name: None,
            namespace: None,
            qos: None,
            processes: vec![],
            regions: vec![],
            probe_losses: Default::default(),
        });
        entry.regions.push(info);
    }

    let events_lost = Health::ALL
        .iter()
        .map(|h| (h.name().to_owned(), inp.reading.health[*h as usize]))
        .collect();
    Snapshot {
        schema: String::new(),
        hostname: String::new(),
        taken_at_unix_ms: 0,
        interval_seconds: 0.0,
        driver_version: None,
        cuda_driver_version: None,
        agent: crate::model::AgentStatus {
            events_lost,
            regions_read,
            region_errors,
            regions_unread,
            ..Default::default()
        },
        gpus: inp
            .gpu
            .devices
            .iter()
            .map(|d| GpuDevice {
                index: d.index,
                uuid: d.uuid.clone(),
                name: d.name.clone(),
                utilization_pct: d.utilization_gpu_pct,
                memory_used: d.memory_used,
                memory_total: d.memory_total,
                power_mw: d.power_mw,
                temperature_c: d.temperature_c,
            })
            .collect(),
        containers: containers.into_values().collect(),
        processes,
    }
}
