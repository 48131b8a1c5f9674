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
    /// The processes whose maps the region scan has listed.
    pub listed: &'a HashSet<u32>,
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

/// Claims shown at most in [`crate::model::AgentStatus::claims_refused`] (each refused slot is
/// also in its region's problems; the count is whole).
const MAX_CLAIM_LINES: usize = 64;

/// What tenants claimed that was not believed, this snapshot.
#[derive(Default)]
struct ClaimsRefused {
    slots: u64,
    lines: Vec<String>,
    left_out: usize,
}

impl ClaimsRefused {
    fn refuse(&mut self, line: String) {
        if self.lines.len() < MAX_CLAIM_LINES {
            self.lines.push(line);
        } else {
            self.left_out += 1;
            let more = format!("... and {} more", self.left_out);
            if self.left_out == 1 {
                self.lines.push(more);
            } else if let Some(last) = self.lines.last_mut() {
                *last = more;
            }
        }
    }

    /// A region slot not counted for the process it names: said in the region's problems and
    /// in the agent's claims.
    fn refuse_slot(&mut self, region: &str, info: &mut RegionInfo, why: String) {
        self.slots += 1;
        self.refuse(format!("region {region}: {why}"));
        info.problems.push(why);
    }
}

/// Running processes as this snapshot found them (container key, start ticks), each read once
/// however many regions and slots name it.
struct Seen<'a> {
    procs: &'a mut ProcessTable,
    memo: HashMap<u32, Option<(String, u64)>>,
}

impl Seen<'_> {
    fn get(&mut self, pid: u32) -> Option<&(String, u64)> {
        let procs = &mut *self.procs;
        self.memo
            .entry(pid)
            .or_insert_with(|| {
                procs
                    .get(pid)
                    .map(|p| (container_key(&p.identity), p.facts.start_ticks))
            })
            .as_ref()
    }
}

/// The container that owns a region: that of the GPU processes that map it (`mapped_by`); when
/// processes of several containers map it, the one most of them are in (the lowest pid's on a
/// tie), with a problem that says so. `None` when no process is seen mapping it (then none of
/// its slots counts).
fn region_owner(mapped_by: &[u32], seen: &mut Seen<'_>) -> (Option<String>, Option<String>) {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for &pid in mapped_by {
        let Some((key, _)) = seen.get(pid) else {
            continue;
        };
        match counts.iter_mut().find(|(k, _)| k == key) {
            Some((_, n)) => *n += 1,
            None => counts.push((key.clone(), 1)),
        }
    }
    let most = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let owner = counts
        .iter()
        .find(|(_, n)| *n == most)
        .map(|(k, _)| k.clone());
    let shared = (counts.len() > 1).then(|| {
        let all: Vec<&str> = counts.iter().map(|(k, _)| k.as_str()).collect();
        format!(
            "mapped by processes of {} containers ({}): its slots count only for processes of {}",
            counts.len(),
            all.join(", "),
            owner.as_deref().unwrap_or("?")
        )
    });
    (owner, shared)
}

/// Whether a region's slot counts for the process it names.
enum Belongs {
    Yes,
    /// The process's maps have not been listed yet (it is not a GPU process the scan lists):
    /// not counted this time; the next scan lists it.
    NotListedYet,
    /// Why not, for people.
    No(String),
}

/// Whether slot `index` of a region may count for host process `pid`: the process maps the
/// region and is of the region's container.
fn slot_belongs(
    index: u32,
    pid: u32,
    mapped_by: &[u32],
    owner: Option<&str>,
    listed: &HashSet<u32>,
    seen: &mut Seen<'_>,
) -> Belongs {
    if !mapped_by.contains(&pid) {
        if !listed.contains(&pid) {
            return Belongs::NotListedYet;
        }
        return Belongs::No(format!(
            "slot {index}: claims pid {pid}, which does not map this region (not counted)"
        ));
    }
    match (seen.get(pid).map(|(c, _)| c.as_str()), owner) {
        (Some(c), Some(o)) if c == o => Belongs::Yes,
        (c, o) => Belongs::No(format!(
            "slot {index}: claims pid {pid} of container {}, not of the region's container {} (not counted)",
            c.unwrap_or("?"),
            o.unwrap_or("?")
        )),
    }
}

/// Processes named by region slots whose maps the region scan is asked to list, at most (the
/// GPU processes are listed anyway; these are limiter processes not seen using the driver yet,
/// or what a forged slot names).
pub const MAX_CLAIMED_LISTINGS: usize = 64;

/// Asks the next scan to list `pid` (within [`MAX_CLAIMED_LISTINGS`]).
fn claim_listing(to_list: &mut Vec<u32>, pid: u32) {
    if to_list.len() < MAX_CLAIMED_LISTINGS && !to_list.contains(&pid) {
        to_list.push(pid);
    }
}

/// Builds the snapshot. `to_list` gets the processes that region slots name whose maps have not
/// been listed (at most [`MAX_CLAIMED_LISTINGS`]): the next scan is to list them.
pub fn build(
    inp: Inputs<'_>,
    procs: &mut ProcessTable,
    names: &mut RuntimeNames,
    cgroups: &mut CgroupIndex,
    to_list: &mut Vec<u32>,
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
    let my_ns = tenant_fs::own_pid_namespace();
    let mut slots: HashMap<u32, SlotView> = HashMap::new();
    let mut region_infos: Vec<(RegionInfo, Option<String>)> = Vec::new();
    let mut region_errors = 0;
    let mut regions_unread = Vec::new();
    let mut claims = ClaimsRefused::default();
    let mut seen = Seen {
        procs,
        memo: HashMap::new(),
    };
    for RegionReading {
        path,
        read,
        writable_by_others,
        mapped_by,
    } in inp.regions
    {
        let shown = path.display().to_string();
        let (owner, shared) = region_owner(mapped_by, &mut seen);
        let mut info = RegionInfo {
            path: shown.clone(),
            format: String::new(),
            devices: vec![],
            problems: vec![],
            read_retries: 0,
            writable_by_others: writable_by_others.clone(),
        };
        if let Some(why) = shared {
            info.problems.push(why);
        }
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
                        // The agent's own pid namespace: the slot names a host pid, which
                        // counts only with its start time.
                        match seen.get(slot.pid).map(|(_, start)| *start) {
                            Some(start) if start == slot.start_time => Some(slot.pid),
                            Some(start) => {
                                let why = format!(
                                    "slot {}: claims pid {} started at {}, but pid {} started at {start} (reused, or a forged slot)",
                                    slot.index, slot.pid, slot.start_time, slot.pid
                                );
                                claims.refuse_slot(&shown, &mut info, why);
                                continue;
                            }
                            None => None,
                        }
                    } else {
                        seen.procs
                            .find_by_namespace(slot.pid_ns, slot.pid, slot.start_time)
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
                    match slot_belongs(
                        slot.index,
                        pid,
                        mapped_by,
                        owner.as_deref(),
                        inp.listed,
                        &mut seen,
                    ) {
                        Belongs::Yes => {}
                        Belongs::NotListedYet => {
                            claim_listing(to_list, pid);
                            continue;
                        }
                        Belongs::No(why) => {
                            claims.refuse_slot(&shown, &mut info, why);
                            continue;
                        }
                    }
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
                                bytes: a.bytes_allocated + a.bytes_freed + a.bytes_moved,
                                total_ns: a.latency_ns,
                                hook_ns: a.hook_ns,
                                denied: a.denied,
                                hist: a.histogram.to_vec(),
                                latency: None,
                                probed: None,
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
                        // HAMi's slots carry no start time: the process must run, map the
                        // region and be of its container.
                        let belongs = if seen.get(pid).is_some() {
                            slot_belongs(
                                p.slot as u32,
                                pid,
                                mapped_by,
                                owner.as_deref(),
                                inp.listed,
                                &mut seen,
                            )
                        } else {
                            Belongs::No(format!(
                                "slot {}: claims host pid {pid}, which matches no process here",
                                p.slot
                            ))
                        };
                        match belongs {
                            Belongs::Yes => {}
                            Belongs::NotListedYet => {
                                claim_listing(to_list, pid);
                                continue;
                            }
                            Belongs::No(why) => {
                                claims.refuse_slot(&shown, &mut info, why);
                                continue;
                            }
                        }
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
        pids.extend(owners.iter().copied());
        region_infos.push((info, owner));
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
                    probed: None,
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
        if let Some(claim) = &identity.nested_claim {
            claims.refuse(format!(
                "process {pid} ({}): its cgroup names `{claim}` below its container's own cgroup: counted as {}'s",
                facts.comm,
                container_key(&identity)
            ));
        }
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
    for (info, owner_container) in region_infos {
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
            slots_refused: claims.slots,
            claims_refused: claims.lines,
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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use region::{
        RegionConfig,
        reader::{RegionReader, RegionSnapshot},
    };
    use tenant_fs::{Access, open_no_links};

    use super::*;
    use crate::identity::runtime_names::{NameLookupConfig, NameSources};

    const GIB: u64 = 1 << 30;
    const VICTIM: &str = "abb37780fc913b3720641a4039186adb06f5d1de0229de0e8707f12e2fde5a21";
    const ATTACKER: &str = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
    /// The victim container's pid namespace (any inode other than the agent's).
    const VICTIM_NS: u64 = 4_026_599_999;

    /// A process in a fake `/proc`: its stat (comm `p<pid>`, start time), cgroup, status (its pid
    /// in its own namespace) and pid-namespace link.
    fn fake_process(proc: &Path, pid: u32, start: u64, cgroup: &str, ns: u64, ns_pid: u32) {
        let d = proc.join(pid.to_string());
        std::fs::create_dir_all(d.join("ns")).unwrap();
        std::fs::write(
            d.join("stat"),
            format!(
                "{pid} (p{pid}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10\n"
            ),
        )
        .unwrap();
        std::fs::write(d.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        std::fs::write(d.join("cmdline"), format!("p{pid}\0")).unwrap();
        std::fs::write(
            d.join("status"),
            format!("Name:\tp{pid}\nNSpid:\t{pid}\t{ns_pid}\n"),
        )
        .unwrap();
        std::os::unix::fs::symlink(format!("pid:[{ns}]"), d.join("ns/pid")).unwrap();
    }

    /// A region with one claimed slot holding `held` bytes on device 0, read back.
    fn region_holding(path: &Path, held: u64) -> RegionSnapshot {
        let (region, _) =
            region::Region::open_or_create(path, &RegionConfig::unlimited(1)).unwrap();
        let slot = region.claim_slot().unwrap();
        region.try_reserve(&slot, 0, held).unwrap();
        let file = open_no_links(path, Access::Read).unwrap();
        let snap = RegionReader::from_file(file).unwrap().snapshot().unwrap();
        assert_eq!(snap.slots.len(), 1);
        snap
    }

    /// Slot 0 of `snap` as process `pid` of namespace `ns` started at `start` would write it.
    fn own(snap: &mut RegionSnapshot, ns: u64, pid: u32, start: u64) {
        let s = &mut snap.slots[0];
        (s.pid_ns, s.pid, s.start_time) = (ns, pid, start);
    }

    /// A slot a tenant wrote into its own region: any index, any claim, any figures.
    fn forge(snap: &mut RegionSnapshot, index: u32, ns: u64, pid: u32, start: u64, held: u64) {
        let mut s = snap.slots[0].clone();
        (s.index, s.pid_ns, s.pid, s.start_time) = (index, ns, pid, start);
        s.held = vec![held];
        snap.slots.push(s);
    }

    struct World {
        _dir: tempfile::TempDir,
        proc: PathBuf,
        regions: PathBuf,
        names: RuntimeNames,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let regions = dir.path().join("regions");
        std::fs::create_dir_all(&regions).unwrap();
        let none = dir.path().join("none");
        let names = RuntimeNames::new(
            NameSources {
                docker_socket: none.join("docker.sock"),
                pod_logs_dir: none.clone(),
                containerd_tasks_dir: none.clone(),
                crio_containers_dir: none.clone(),
                container_storage: none,
            },
            NameLookupConfig::default(),
        );
        World {
            _dir: dir,
            proc,
            regions,
            names,
        }
    }

    /// The snapshot of `regions`, the processes in `listed` having had their maps listed;
    /// with the processes the next scan is asked to list.
    fn assemble_listed(
        w: &mut World,
        regions: &[RegionReading],
        listed: &[u32],
    ) -> (Snapshot, Vec<u32>) {
        let mut procs = ProcessTable::new(&w.proc);
        let mut cgroups = CgroupIndex::new();
        let mut to_list = Vec::new();
        let listed: HashSet<u32> = listed.iter().copied().collect();
        let snap = build(
            Inputs {
                reading: &RawReading::default(),
                users: &[],
                gpu: &GpuSnapshot::default(),
                regions,
                listed: &listed,
                tracer: None,
                own_pid: 1,
            },
            &mut procs,
            &mut w.names,
            &mut cgroups,
            &mut to_list,
            Instant::now(),
        );
        (snap, to_list)
    }

    /// As [`assemble_listed`], every process named by the regions having been listed.
    fn assemble(w: &mut World, regions: &[RegionReading]) -> Snapshot {
        let (snap, to_list) = assemble_listed(w, regions, &[100, 200, 201]);
        assert_eq!(to_list, [] as [u32; 0]);
        snap
    }

    fn reading(path: PathBuf, snap: RegionSnapshot, mapped_by: Vec<u32>) -> RegionReading {
        RegionReading {
            path,
            read: RegionRead::Vgpu(Box::new(snap)),
            writable_by_others: None,
            mapped_by,
        }
    }

    fn held(s: &Snapshot, pid: u32) -> Option<(String, Vec<u64>)> {
        s.processes
            .iter()
            .find(|p| p.key.pid == pid)?
            .limiter
            .as_ref()
            .map(|l| (l.region.clone(), l.held.clone()))
    }

    fn container_regions(s: &Snapshot, key: &str) -> Vec<String> {
        s.containers
            .iter()
            .find(|c| c.key == key)
            .map(|c| c.regions.iter().map(|r| r.path.clone()).collect())
            .unwrap_or_default()
    }

    /// A tenant rewrites slots of its own region to name a victim: the victim's host pid with the
    /// agent's pid namespace, the victim's pid in its own namespace, a reused start time. None
    /// counts: the victim's figures and regions are its own, the attacker's region stays the
    /// attacker's, and each forged slot is said (region problems, `claims_refused`, the count).
    #[test]
    fn a_forged_slot_naming_another_containers_process_is_not_counted() {
        let mut w = world();
        let host_ns = tenant_fs::own_pid_namespace().expect("the agent's pid namespace");
        // The victim: host pid 100, pid 7 in its container's namespace; the attacker: host pid
        // 200 in the agent's namespace.
        fake_process(
            &w.proc,
            100,
            5000,
            &format!("/docker/{VICTIM}"),
            VICTIM_NS,
            7,
        );
        fake_process(
            &w.proc,
            200,
            6000,
            &format!("/docker/{ATTACKER}"),
            host_ns,
            200,
        );
        let victim_path = w.regions.join("victim.cache");
        let mut victim = region_holding(&victim_path, GIB);
        own(&mut victim, VICTIM_NS, 7, 5000);
        let attacker_path = w.regions.join("attacker.cache");
        let mut attacker = region_holding(&attacker_path, 2 * GIB);
        own(&mut attacker, host_ns, 200, 6000);
        forge(&mut attacker, 1, host_ns, 100, 5000, 60 * GIB);
        forge(&mut attacker, 2, VICTIM_NS, 7, 5000, 60 * GIB);
        forge(&mut attacker, 3, host_ns, 100, 4999, 60 * GIB);
        let snap = assemble(
            &mut w,
            &[
                reading(victim_path.clone(), victim, vec![100]),
                reading(attacker_path.clone(), attacker, vec![200]),
            ],
        );
        let (v, a) = (
            victim_path.display().to_string(),
            attacker_path.display().to_string(),
        );
        assert_eq!(
            held(&snap, 100),
            Some((v.clone(), vec![GIB])),
            "the victim's own"
        );
        assert_eq!(held(&snap, 200), Some((a.clone(), vec![2 * GIB])));
        assert_eq!(container_regions(&snap, VICTIM), [v]);
        assert_eq!(container_regions(&snap, ATTACKER), std::slice::from_ref(&a));
        let problems = &snap
            .containers
            .iter()
            .flat_map(|c| &c.regions)
            .find(|r| r.path == a)
            .unwrap()
            .problems;
        for want in [
            "slot 1: claims pid 100, which does not map this region",
            "slot 2: claims pid 100, which does not map this region",
            "slot 3: claims pid 100 started at 4999, but pid 100 started at 5000",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(want)),
                "{want}: {problems:?}"
            );
        }
        assert_eq!(snap.agent.slots_refused, 3);
        assert_eq!(
            snap.agent.claims_refused.len(),
            3,
            "{:?}",
            snap.agent.claims_refused
        );
        assert!(snap.agent.claims_refused.iter().all(|c| c.contains(&a)));
    }

    /// A slot naming a host process whose maps were not listed yet (a limiter process that has
    /// not loaded the driver, say) is not counted and not called forged: the next scan is asked
    /// to list that process, and then it counts.
    #[test]
    fn a_slot_of_a_process_not_listed_yet_waits_for_its_listing() {
        let mut w = world();
        let host_ns = tenant_fs::own_pid_namespace().expect("the agent's pid namespace");
        fake_process(&w.proc, 300, 7000, "/user.slice/job.service", host_ns, 300);
        let path = w.regions.join("job.cache");
        let mut region = region_holding(&path, GIB);
        own(&mut region, host_ns, 300, 7000);
        let snap_of = || region.clone();
        let (first, to_list) =
            assemble_listed(&mut w, &[reading(path.clone(), snap_of(), vec![])], &[]);
        assert_eq!(to_list, [300]);
        assert_eq!(held(&first, 300), None);
        assert_eq!(first.agent.slots_refused, 0);
        let (second, to_list) = assemble_listed(
            &mut w,
            &[reading(path.clone(), snap_of(), vec![300])],
            &[300],
        );
        assert_eq!(to_list, [] as [u32; 0]);
        assert_eq!(
            held(&second, 300),
            Some((path.display().to_string(), vec![GIB]))
        );
    }

    /// A region mapped by processes of two containers is its most common container's: a slot
    /// naming a process of the other container (which maps it) is not counted, and the region
    /// says it is shared. A region no listed process maps counts for nobody.
    #[test]
    fn a_slot_counts_only_for_a_process_of_the_regions_container() {
        let mut w = world();
        let host_ns = tenant_fs::own_pid_namespace().expect("the agent's pid namespace");
        fake_process(
            &w.proc,
            100,
            5000,
            &format!("/docker/{VICTIM}"),
            host_ns,
            100,
        );
        fake_process(
            &w.proc,
            200,
            6000,
            &format!("/docker/{ATTACKER}"),
            host_ns,
            200,
        );
        fake_process(
            &w.proc,
            201,
            6001,
            &format!("/docker/{ATTACKER}"),
            host_ns,
            201,
        );
        let shared_path = w.regions.join("shared.cache");
        let mut shared = region_holding(&shared_path, GIB);
        own(&mut shared, host_ns, 200, 6000);
        forge(&mut shared, 1, host_ns, 100, 5000, 60 * GIB);
        let lone_path = w.regions.join("lone.cache");
        let mut lone = region_holding(&lone_path, GIB);
        own(&mut lone, host_ns, 201, 6001);
        let snap = assemble(
            &mut w,
            &[
                reading(shared_path.clone(), shared, vec![100, 200, 201]),
                reading(lone_path.clone(), lone, vec![]),
            ],
        );
        let s = shared_path.display().to_string();
        assert_eq!(held(&snap, 200), Some((s.clone(), vec![GIB])));
        assert_eq!(held(&snap, 100), None, "not counted for the victim");
        assert_eq!(held(&snap, 201), None, "a region nobody is seen mapping");
        let region = snap
            .containers
            .iter()
            .find(|c| c.key == ATTACKER)
            .and_then(|c| c.regions.iter().find(|r| r.path == s))
            .expect("the shared region is the attacker's container's");
        assert!(
            region.problems.iter().any(|p| p.starts_with(&format!(
                "slot 1: claims pid 100 of container {VICTIM}, not of the region's container {ATTACKER}"
            ))),
            "{:?}",
            region.problems
        );
        assert!(
            region
                .problems
                .iter()
                .any(|p| p.contains("mapped by processes of 2 containers")),
            "{:?}",
            region.problems
        );
        assert_eq!(
            snap.agent.slots_refused, 2,
            "{:?}",
            snap.agent.claims_refused
        );
    }
}
