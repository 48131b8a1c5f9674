//! Building one snapshot from the raw inputs of a refresh.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use agent_common::{
    ApiId,
    hist::HIST_BUCKETS,
    maps::{ApiStats, Health},
};
use region::{
    hami::HamiSnapshot,
    reader::{RegionSnapshot, SlotSnapshot},
};

use super::{
    processes::ProcessTable,
    regions::{ControlRead, RegionRead, RegionReading},
};
use crate::{
    discovery::FileId,
    identity::{
        CgroupIndex, ProcessFacts,
        container::{ContainerIdentity, ContainerKey},
        runtime_names::RuntimeNames,
    },
    model::{
        AllocSizes, ApiUsage, Communicator, Container, Frozen, GpuDevice, LimiterProcess,
        MemoryViews, NvmlProcess, Process, ProcessKey, RegionDevice, RegionInfo, RegionQos,
        RegionUnread, Snapshot, Source,
        gpu_use::{KernelTime, LimiterGpuTime, OTHER_KERNELS},
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
    gpu_time: Vec<LimiterGpuTime>,
    kernels: Vec<KernelTime>,
    sample_errors: u64,
    samples_skipped: u64,
    waiting_for_memory: Option<crate::model::WaitingForMemory>,
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
///
/// The stages, in order: the GPU processes by every source ([`gpu_pids`]); the regions' slots
/// matched to host processes ([`match_regions`]), whose owners join them; the probes' rows per
/// process ([`ProbeRows::gather`]); one row per process with its probe, limiter and NVML figures
/// ([`ProcessRows::row`]); containers ([`containers`]); GPUs and health.
pub fn build(
    inp: Inputs<'_>,
    procs: &mut ProcessTable,
    names: &mut RuntimeNames,
    cgroups: &mut CgroupIndex,
    to_list: &mut Vec<u32>,
    now: Instant,
) -> Snapshot {
    let mut pids = gpu_pids(&inp);
    for pid in &pids {
        procs.get(*pid);
    }
    let RegionMatch {
        slots,
        regions,
        region_errors,
        regions_unread,
        mut claims,
        owners,
    } = match_regions(&inp, procs, to_list);
    pids.extend(owners);

    let mut rows = ProcessRows {
        inp: &inp,
        probes: ProbeRows::gather(inp.reading),
        slots,
        user_file: inp.users.iter().copied().collect(),
        tick_ns: 1_000_000_000 / ticks_per_second(),
    };
    let mut processes = Vec::new();
    let mut identities: HashMap<ProcessKey, ContainerIdentity> = HashMap::new();
    let mut sorted: Vec<u32> = pids.into_iter().collect();
    sorted.sort_unstable();
    for pid in sorted {
        let (process, identity) = rows.row(pid, procs, cgroups);
        if let Some(claim) = &identity.nested_claim {
            claims.refuse(format!(
                "process {pid} ({}): its cgroup names `{claim}` below its container's own cgroup: counted as {}'s",
                process.comm,
                container_key(&identity)
            ));
        }
        identities.insert(process.key, identity);
        processes.push(process);
    }

    let regions_read = regions.len();
    Snapshot {
        schema: String::new(),
        hostname: String::new(),
        taken_at_unix_ms: 0,
        interval_seconds: 0.0,
        driver_version: None,
        cuda_driver_version: None,
        agent: crate::model::AgentStatus {
            events_lost: events_lost(inp.reading),
            regions_read,
            region_errors,
            regions_unread,
            slots_refused: claims.slots,
            claims_refused: claims.lines,
            ..Default::default()
        },
        gpus: gpus(inp.gpu),
        containers: containers(&processes, &identities, regions, names, now),
        processes,
    }
}

/// Every pid that is a GPU process by any source (the probes' maps, the processes mapping a
/// probed library, NVML), but the agent's own.
fn gpu_pids(inp: &Inputs<'_>) -> HashSet<u32> {
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
    pids
}

/// A region's summary, with the container that owns it and whether its control block marks
/// that container freezing or frozen.
struct OwnedRegion {
    info: RegionInfo,
    owner: Option<String>,
    frozen: bool,
    /// Frozen in-process (the mark `InProcess`).
    in_process: bool,
}

/// The regions of a snapshot, their slots matched to host processes.
struct RegionMatch {
    /// The slots that count, by host pid.
    slots: HashMap<u32, SlotView>,
    /// Each region's summary, with the container that owns it.
    regions: Vec<OwnedRegion>,
    region_errors: usize,
    regions_unread: Vec<RegionUnread>,
    claims: ClaimsRefused,
    /// The host processes slots count for (GPU processes by the other sources or not).
    owners: Vec<u32>,
}

/// Matches every region's slots to host processes: a slot counts for the process it names only
/// when that process runs (with the start time the slot says), maps the region and is of the
/// region's container; what is refused is said.
fn match_regions(
    inp: &Inputs<'_>,
    procs: &mut ProcessTable,
    to_list: &mut Vec<u32>,
) -> RegionMatch {
    let mut matcher = SlotMatcher {
        seen: Seen {
            procs,
            memo: HashMap::new(),
        },
        my_ns: tenant_fs::own_pid_namespace(),
        listed: inp.listed,
        to_list,
        gpu_count: inp.gpu.devices.len(),
        out: RegionMatch {
            slots: HashMap::new(),
            regions: Vec::new(),
            region_errors: 0,
            regions_unread: Vec::new(),
            claims: ClaimsRefused::default(),
            owners: Vec::new(),
        },
    };
    for reading in inp.regions {
        matcher.region(reading);
    }
    matcher.out
}

/// One region as its slots are matched: its name as shown, the processes that map it and the
/// container that owns it.
struct RegionAt<'r> {
    shown: &'r str,
    mapped_by: &'r [u32],
    owner: Option<&'r str>,
}

/// The state of [`match_regions`].
struct SlotMatcher<'p, 'i> {
    seen: Seen<'p>,
    /// The agent's pid namespace: slots of processes in it name host pids.
    my_ns: Option<u64>,
    listed: &'i HashSet<u32>,
    to_list: &'i mut Vec<u32>,
    /// The devices NVML reports (0 without NVML).
    gpu_count: usize,
    out: RegionMatch,
}

impl SlotMatcher<'_, '_> {
    fn region(&mut self, reading: &RegionReading) {
        let RegionReading {
            path,
            read,
            control,
            writable_by_others,
            mapped_by,
        } = reading;
        let shown = path.display().to_string();
        let (owner, shared) = region_owner(mapped_by, &mut self.seen);
        let mut info = RegionInfo {
            path: shown.clone(),
            format: String::new(),
            devices: vec![],
            problems: vec![],
            read_retries: 0,
            writable_by_others: writable_by_others.clone(),
            freeze_after_seconds: None,
        };
        if let Some(why) = shared {
            info.problems.push(why);
        }
        let at = RegionAt {
            shown: &shown,
            mapped_by,
            owner: owner.as_deref(),
        };
        match read {
            RegionRead::Failed(format, why) => {
                info.format = format!("{format:?}").to_lowercase();
                info.problems.push(why.clone());
                self.out.region_errors += 1;
            }
            RegionRead::Blocked { format, seconds } => {
                info.format = format!("{format:?}").to_lowercase();
                info.problems.push(format!(
                    "not read: a read of it started {seconds:.1}s ago has not returned (blocked file)"
                ));
                self.out.regions_unread.push(RegionUnread {
                    path: shown.clone(),
                    reason: "blocked".into(),
                    slots: 0,
                    blocked_seconds: *seconds,
                });
            }
            RegionRead::Vgpu(s) => self.vgpu(&at, s, &mut info),
            RegionRead::Hami(h) => self.hami(&at, h, &mut info),
        }
        if let ControlRead::Failed(why) = control {
            // Counted as the region's error once, whatever else was wrong with it.
            if !matches!(read, RegionRead::Failed(..)) {
                self.out.region_errors += 1;
            }
            info.problems.push(format!(
                "control block not read (a freeze it marks is not shown): {why}"
            ));
        }
        self.out.regions.push(OwnedRegion {
            info,
            owner,
            frozen: control.frozen(),
            in_process: control.in_process(),
        });
    }

    /// A region of this project's format: its devices, what its read missed, and its slots.
    fn vgpu(&mut self, at: &RegionAt<'_>, s: &RegionSnapshot, info: &mut RegionInfo) {
        info.format = "vgpu".into();
        info.read_retries = s.counters.seqlock_retries;
        info.freeze_after_seconds =
            (s.freeze_after_ms > 0).then(|| s.freeze_after_ms as f64 / 1000.0);
        info.devices = vgpu_devices(s, self.gpu_count);
        let shown_devices = info.devices.len();
        if let Some(u) = &s.unread {
            let reason = match u.limit {
                region::reader::BudgetLimit::Time => "time",
                region::reader::BudgetLimit::Retries => "retries",
            };
            info.problems.push(format!(
                "read budget exhausted ({reason}): {} claimed slot(s) from slot {} not read this snapshot",
                u.slots, u.first_slot
            ));
            self.out.regions_unread.push(RegionUnread {
                path: at.shown.to_owned(),
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
            self.vgpu_slot(at, slot, shown_devices, info);
        }
    }

    /// One slot of a region of this project's format, counted for its host process if it
    /// belongs to it (`shown_devices`: the devices shown for the region).
    fn vgpu_slot(
        &mut self,
        at: &RegionAt<'_>,
        slot: &SlotSnapshot,
        shown_devices: usize,
        info: &mut RegionInfo,
    ) {
        let host_pid = if Some(slot.pid_ns) == self.my_ns {
            // The agent's own pid namespace: the slot names a host pid, which counts only with
            // its start time.
            match self.seen.get(slot.pid).map(|(_, start)| *start) {
                Some(start) if start == slot.start_time => Some(slot.pid),
                Some(start) => {
                    let why = format!(
                        "slot {}: claims pid {} started at {}, but pid {} started at {start} (reused, or a forged slot)",
                        slot.index, slot.pid, slot.start_time, slot.pid
                    );
                    self.out.claims.refuse_slot(at.shown, info, why);
                    return;
                }
                None => None,
            }
        } else {
            self.seen
                .procs
                .find_by_namespace(slot.pid_ns, slot.pid, slot.start_time)
        };
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
            return;
        };
        let belongs = slot_belongs(
            slot.index,
            pid,
            at.mapped_by,
            at.owner,
            self.listed,
            &mut self.seen,
        );
        if !self.admit(at, pid, belongs, info) {
            return;
        }
        let problems = slot
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
        self.out.slots.insert(
            pid,
            SlotView {
                region: at.shown.to_owned(),
                slot: slot.index,
                // The devices shown for the region (what a slot holds is reserved on its
                // device, so nothing held is cut off).
                held: slot.held.iter().take(shown_devices).copied().collect(),
                context: slot
                    .context_bytes
                    .iter()
                    .take(shown_devices)
                    .copied()
                    .collect(),
                throttled_ns: slot.throttled_ns,
                dropped_records: slot.dropped_records,
                problems,
                apis: limiter_api_rows(slot),
                gpu_time: limiter_gpu_time(slot),
                kernels: limiter_kernels(slot),
                sample_errors: slot.sample_errors,
                samples_skipped: slot.samples_skipped,
                waiting_for_memory: slot.oom_wait.map(|w| crate::model::WaitingForMemory {
                    device: w.device,
                    bytes: w.bytes,
                    wait: w.seq,
                }),
            },
        );
    }

    /// A region of HAMi-core's format: its devices and its slots.
    fn hami(&mut self, at: &RegionAt<'_>, h: &HamiSnapshot, info: &mut RegionInfo) {
        info.format = "hami".into();
        info.devices = hami_devices(h);
        for p in &h.processes {
            if !p.consistent {
                info.problems.push(format!(
                    "slot {}: inconsistent read (a writer died mid-update?)",
                    p.slot
                ));
            }
            if p.hostpid <= 0 {
                info.problems.push(format!(
                    "slot {}: container pid {} has no host pid yet",
                    p.slot, p.pid
                ));
                continue;
            }
            let pid = p.hostpid as u32;
            // HAMi's slots carry no start time: the process must run, map the region and be of
            // its container.
            let belongs = if self.seen.get(pid).is_some() {
                slot_belongs(
                    p.slot as u32,
                    pid,
                    at.mapped_by,
                    at.owner,
                    self.listed,
                    &mut self.seen,
                )
            } else {
                Belongs::No(format!(
                    "slot {}: claims host pid {pid}, which matches no process here",
                    p.slot
                ))
            };
            if !self.admit(at, pid, belongs, info) {
                continue;
            }
            self.out.slots.insert(
                pid,
                SlotView {
                    region: at.shown.to_owned(),
                    slot: p.slot as u32,
                    held: p.used_total.clone(),
                    context: p.context_size.clone(),
                    throttled_ns: 0,
                    dropped_records: 0,
                    problems: vec![],
                    apis: vec![],
                    gpu_time: vec![],
                    kernels: vec![],
                    sample_errors: 0,
                    samples_skipped: 0,
                    waiting_for_memory: None,
                },
            );
        }
    }

    /// Whether a slot naming host process `pid` counts: it does when it belongs (and `pid` is
    /// one of the region's owners); one of a process not listed yet asks the next scan to list
    /// it; one that does not belong is refused.
    fn admit(
        &mut self,
        at: &RegionAt<'_>,
        pid: u32,
        belongs: Belongs,
        info: &mut RegionInfo,
    ) -> bool {
        match belongs {
            Belongs::Yes => {
                self.out.owners.push(pid);
                true
            }
            Belongs::NotListedYet => {
                claim_listing(self.to_list, pid);
                false
            }
            Belongs::No(why) => {
                self.out.claims.refuse_slot(at.shown, info, why);
                false
            }
        }
    }
}

/// The devices of a region of this project's format worth showing. The limiter's regions have
/// room for 16 devices whatever the host has: those that exist (NVML's `gpu_count`), else the
/// ones in use, at least one.
fn vgpu_devices(s: &RegionSnapshot, gpu_count: usize) -> Vec<RegionDevice> {
    let mut devices: Vec<RegionDevice> = s
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
            qos: d.qos.map(|q| RegionQos {
                tier: match q.tier {
                    1 => "latency",
                    2 => "guaranteed",
                    _ => "best-effort",
                }
                .to_owned(),
                guarantee: f64::from(q.guarantee_pm) / 1000.0,
                allocated: f64::from(q.allocated_pm) / 1000.0,
                held: q.held,
                short: q.short,
            }),
        })
        .collect();
    let active = devices
        .iter()
        .rposition(|d| d.reserved > 0 || d.denied > 0)
        .map_or(1, |i| i + 1);
    let keep = if gpu_count == 0 {
        active
    } else {
        gpu_count.max(active)
    };
    devices.truncate(keep);
    devices
}

/// The devices of a HAMi-core region (what its processes hold on each, summed).
fn hami_devices(h: &HamiSnapshot) -> Vec<RegionDevice> {
    (0..h.device_count)
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
            qos: None,
        })
        .collect()
}

/// A limiter slot's GPU time per device (devices with samples only).
fn limiter_gpu_time(slot: &SlotSnapshot) -> Vec<LimiterGpuTime> {
    slot.gpu_time
        .iter()
        .enumerate()
        .filter(|(_, t)| t.samples > 0)
        .map(|(device, t)| LimiterGpuTime {
            device: device as u32,
            estimated_ns: t.estimated_ns,
            sampled_ns: t.sampled_ns,
            samples: t.samples,
            launches: t.launches,
            busy_ratio: None,
        })
        .collect()
}

/// A limiter slot's kernels: names are the tenant's bytes, decoded lossily here and made inert
/// with the rest of the model (`sanitize`); the same name in several entries is merged.
fn limiter_kernels(slot: &SlotSnapshot) -> Vec<KernelTime> {
    let mut out: Vec<KernelTime> = Vec::new();
    for k in slot.kernels.iter().filter(|k| k.time.samples > 0) {
        let name = if k.other {
            OTHER_KERNELS.to_string()
        } else {
            String::from_utf8_lossy(&k.name).into_owned()
        };
        let truncated = k.name_len > k.name.len() as u64;
        let row = match out.iter_mut().find(|r| r.name == name) {
            Some(r) => r,
            None => {
                out.push(KernelTime {
                    name,
                    truncated,
                    ..KernelTime::default()
                });
                out.last_mut().expect("just pushed")
            }
        };
        row.estimated_ns += k.time.estimated_ns;
        row.samples += k.time.samples;
        row.launches += k.time.launches;
    }
    out.sort_by_key(|a| std::cmp::Reverse(a.estimated_ns));
    out
}

/// A limiter slot's API rows (those of APIs this agent knows).
fn limiter_api_rows(slot: &SlotSnapshot) -> Vec<ApiUsage> {
    slot.apis
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
        .collect()
}

/// What the probes' maps say, per process.
struct ProbeRows {
    /// API rows (NCCL's too), added up per API.
    apis: BTreeMap<u32, BTreeMap<u16, ApiStats>>,
    /// NCCL communicators by handle.
    communicators: BTreeMap<u32, BTreeMap<u64, Communicator>>,
    /// Live bytes and allocations.
    live: HashMap<u32, (u64, u64)>,
    losses: HashMap<u32, ProbeLosses>,
}

impl ProbeRows {
    fn gather(reading: &RawReading) -> ProbeRows {
        let mut apis: BTreeMap<u32, BTreeMap<u16, ApiStats>> = BTreeMap::new();
        let stats = reading.stats.iter().map(|(k, s)| (k.tgid, k.api, s));
        // NCCL rows are API rows too; per communicator they also add up.
        let nccl = reading.nccl_stats.iter().map(|(k, s)| (k.tgid, k.api, s));
        for (tgid, api, s) in stats.chain(nccl) {
            let row = apis
                .entry(tgid)
                .or_default()
                .entry(api)
                .or_insert(ApiStats::ZERO);
            row.calls += s.calls;
            row.errors += s.errors;
            row.bytes += s.bytes;
            row.total_ns += s.total_ns;
            for (a, b) in row.hist.iter_mut().zip(s.hist.iter()) {
                *a += b;
            }
        }
        ProbeRows {
            apis,
            communicators: communicators(reading),
            live: reading
                .live
                .iter()
                .map(|(t, l)| (*t, (l.bytes, l.allocations)))
                .collect(),
            losses: probe_losses(reading),
        }
    }
}

/// The NCCL communicators the probes saw, per process: their calls added up, and what their
/// creation said.
fn communicators(reading: &RawReading) -> BTreeMap<u32, BTreeMap<u64, Communicator>> {
    let mut communicators: BTreeMap<u32, BTreeMap<u64, Communicator>> = BTreeMap::new();
    fn entry(
        all: &mut BTreeMap<u32, BTreeMap<u64, Communicator>>,
        tgid: u32,
        comm: u64,
    ) -> &mut Communicator {
        all.entry(tgid)
            .or_default()
            .entry(comm)
            .or_insert_with(|| Communicator {
                comm: format!("{comm:#x}"),
                comm_id: None,
                rank: None,
                nranks: None,
                created_by: None,
                destroyed: false,
                calls: 0,
                errors: 0,
                bytes: 0,
                probed_calls: None,
            })
    }
    for (k, s) in &reading.nccl_stats {
        if k.comm != 0 {
            let c = entry(&mut communicators, k.tgid, k.comm);
            c.calls += s.calls;
            c.errors += s.errors;
            c.bytes += s.bytes;
        }
    }
    for (k, info) in &reading.nccl_comms {
        let c = entry(&mut communicators, k.tgid, k.comm);
        c.rank = Some(info.rank);
        c.nranks = Some(info.nranks);
        c.created_by = Some(ApiId(info.init_api).name().to_owned());
        c.comm_id = (info.comm_id != 0).then(|| format!("{:#x}", info.comm_id));
        c.destroyed = info.destroyed != 0;
    }
    communicators
}

/// What the probes lost, per process.
fn probe_losses(reading: &RawReading) -> HashMap<u32, ProbeLosses> {
    let mut losses: HashMap<u32, ProbeLosses> = HashMap::new();
    for (tgid, l) in &reading.losses {
        let e = losses.entry(*tgid).or_default();
        e.allocations_untracked += l.allocs_untracked;
        e.bytes_untracked += l.bytes_untracked;
        e.calls_unaggregated += l.calls_unaggregated;
    }
    for (tgid, n) in &reading.rows_reset {
        losses.entry(*tgid).or_default().rows_reset += n;
    }
    losses
}

/// What one process's row is made of.
struct ProcessRows<'i, 'a> {
    inp: &'i Inputs<'a>,
    probes: ProbeRows,
    /// The region slots that count, by host pid (each taken by its process's row).
    slots: HashMap<u32, SlotView>,
    /// The probed library each process maps.
    user_file: HashMap<u32, FileId>,
    /// Nanoseconds per clock tick.
    tick_ns: u64,
}

impl ProcessRows<'_, '_> {
    /// Process `pid`'s row, with its container's identity.
    fn row(
        &mut self,
        pid: u32,
        procs: &mut ProcessTable,
        cgroups: &mut CgroupIndex,
    ) -> (Process, ContainerIdentity) {
        let inp = self.inp;
        let (facts, identity, alive) = process_facts(inp, pid, procs, cgroups);
        let mut apis = probe_api_rows(self.probes.apis.get(&pid));
        let slot = self.slots.remove(&pid);
        let nvml = nvml_rows(inp.gpu, pid);
        let probe_losses = self.probes.losses.get(&pid).copied().unwrap_or_default();
        let probes_complete = self.probes_attached_before(pid, facts.start_ticks)
            && !probe_losses.memory_incomplete();
        let memory = self.memory(pid, slot.as_ref(), &nvml, probes_complete);
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
                gpu_time: s.gpu_time,
                kernels: s.kernels,
                sample_errors: s.sample_errors,
                samples_skipped: s.samples_skipped,
                waiting_for_memory: s.waiting_for_memory,
            }
        });
        let process = Process {
            key: ProcessKey {
                pid,
                start_ticks: facts.start_ticks,
            },
            alive,
            comm: facts.comm,
            cmdline: facts.cmdline,
            container: container_key(&identity),
            cgroup_path: facts.cgroup_path,
            memory,
            apis,
            limiter,
            nvml,
            communicators: self
                .probes
                .communicators
                .remove(&pid)
                .map(|m| m.into_values().collect())
                .unwrap_or_default(),
            alloc_sizes: alloc_sizes(inp.reading, pid),
            rates: None,
            probe_losses,
            probe_seconds: self.inp.tracer.and_then(|t| t.probe_seconds(pid)),
        };
        (process, identity)
    }

    /// Whether the probes were attached to the library process `pid` maps before it started
    /// (then they saw all of its calls).
    fn probes_attached_before(&self, pid: u32, start_ticks: u64) -> bool {
        match (self.inp.tracer, self.user_file.get(&pid)) {
            (Some(t), Some(file)) => t
                .attached_at_boot_ns(*file)
                .is_some_and(|at| start_ticks * self.tick_ns > at),
            _ => false,
        }
    }

    /// Process `pid`'s memory as each source sees it, reconciled.
    fn memory(
        &self,
        pid: u32,
        slot: Option<&SlotView>,
        nvml: &[NvmlProcess],
        probes_complete: bool,
    ) -> MemoryViews {
        let live = self.probes.live.get(&pid);
        MemoryViews {
            limiter: slot.map(|s| s.held.iter().sum()),
            limiter_allocations: slot.map(|s| {
                s.held
                    .iter()
                    .sum::<u64>()
                    .saturating_sub(s.context.iter().sum())
            }),
            probes: if self.inp.tracer.is_some()
                && (live.is_some() || self.probes.apis.contains_key(&pid))
            {
                Some(live.map(|l| l.0).unwrap_or(0))
            } else {
                None
            },
            probes_allocations: live.map(|l| l.1),
            probes_complete,
            nvml: if nvml.iter().any(|n| n.used_memory.is_some()) {
                Some(nvml.iter().filter_map(|n| n.used_memory).sum())
            } else {
                None
            },
            drift: None,
        }
        .reconcile()
    }
}

/// What is known of process `pid` (with its container's identity, and whether it runs): read
/// from `/proc` while it runs, else as the tracer remembers it (its cgroup from the probes' rows
/// when it left before its cgroup was read).
fn process_facts(
    inp: &Inputs<'_>,
    pid: u32,
    procs: &mut ProcessTable,
    cgroups: &mut CgroupIndex,
) -> (ProcessFacts, ContainerIdentity, bool) {
    if let Some(info) = procs.get(pid) {
        return (info.facts.clone(), info.identity.clone(), true);
    }
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
    let identity = ContainerIdentity::from_path(facts.cgroup_path.as_deref().unwrap_or("/"));
    (facts, identity, false)
}

/// A process's probe rows as API rows (those of APIs this agent knows).
fn probe_api_rows(rows: Option<&BTreeMap<u16, ApiStats>>) -> Vec<ApiUsage> {
    rows.into_iter()
        .flatten()
        // A row of unpaired hits alone (a window's edge) counted no call: it is a cost, charged
        // by the calibration, not a row of calls.
        .filter(|(_, s)| s.calls > 0)
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
        .collect()
}

/// What NVML says of process `pid`, per device it uses.
fn nvml_rows(gpu: &GpuSnapshot, pid: u32) -> Vec<NvmlProcess> {
    gpu.devices
        .iter()
        .flat_map(|d| {
            d.processes
                .iter()
                .filter(move |p| p.pid == pid)
                .map(move |p| super::gpu_use::nvml_process(d, p))
        })
        .collect()
}

/// Process `pid`'s allocations by size class (probes).
fn alloc_sizes(reading: &RawReading, pid: u32) -> Vec<AllocSizes> {
    reading
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
        .collect()
}

/// The containers of the processes, named where the runtime tells, and those of regions no
/// process of theirs was seen in (named after the region's directory).
fn containers(
    processes: &[Process],
    identities: &HashMap<ProcessKey, ContainerIdentity>,
    regions: Vec<OwnedRegion>,
    names: &mut RuntimeNames,
    now: Instant,
) -> Vec<Container> {
    let mut containers: BTreeMap<String, Container> = BTreeMap::new();
    for p in processes {
        let entry = containers.entry(p.container.clone()).or_insert_with(|| {
            let identity = identities
                .get(&p.key)
                .cloned()
                .unwrap_or_else(|| ContainerIdentity::from_path("/"));
            named_container(p.container.clone(), &identity, names, now)
        });
        entry.processes.push(p.key);
        entry.probe_losses.add(&p.probe_losses);
    }
    for OwnedRegion {
        info,
        owner,
        frozen,
        in_process,
    } in regions
    {
        let key = owner.unwrap_or_else(|| format!("region:{}", info.path));
        let entry = containers
            .entry(key.clone())
            .or_insert_with(|| region_container(key, &info.path));
        entry.regions.push(info);
        if frozen {
            // Its bytes are the processes' final figures: `Snapshot::mark_frozen` counts them
            // once the collector has them all. In-process only if every region marking it says
            // so.
            let in_process = in_process && entry.frozen.as_ref().is_none_or(|f| f.in_process);
            entry.frozen = Some(Frozen {
                host_bytes: 0,
                in_process,
            });
        }
    }
    containers.into_values().collect()
}

/// An empty container of `identity`, named as the runtime tells.
fn named_container(
    key: String,
    identity: &ContainerIdentity,
    names: &mut RuntimeNames,
    now: Instant,
) -> Container {
    let found = names.lookup(identity, now);
    Container {
        key,
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
        frozen: None,
    }
}

/// An empty container known only by a region at `path`.
fn region_container(key: String, path: &str) -> Container {
    Container {
        key,
        // HAMi's host directories are named <podUID>_<container>.
        name: std::path::Path::new(path)
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_owned()),
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
        frozen: None,
    }
}

/// The GPUs as NVML reports them.
fn gpus(gpu: &GpuSnapshot) -> Vec<GpuDevice> {
    gpu.devices
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
        .collect()
}

/// Events the probes lost, by cause (cumulative).
fn events_lost(reading: &RawReading) -> BTreeMap<String, u64> {
    Health::ALL
        .iter()
        .map(|h| (h.name().to_owned(), reading.health[*h as usize]))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    #[test]
    fn a_row_of_unpaired_hits_alone_is_no_row_of_calls() {
        let launch = agent_common::ApiId::from_name("cuLaunchKernel").unwrap().0;
        let sync = agent_common::ApiId::from_name("cuStreamSynchronize")
            .unwrap()
            .0;
        let rows: BTreeMap<u16, ApiStats> = [
            (
                launch,
                ApiStats {
                    unpaired: 12,
                    ..ApiStats::ZERO
                },
            ),
            (
                sync,
                ApiStats {
                    calls: 3,
                    unpaired: 1,
                    ..ApiStats::ZERO
                },
            ),
        ]
        .into();
        let apis = probe_api_rows(Some(&rows));
        assert_eq!(apis.len(), 1, "{apis:?}");
        assert_eq!(
            (apis[0].api.as_str(), apis[0].calls),
            ("cuStreamSynchronize", 3)
        );
    }

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
            control: ControlRead::Absent,
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

    /// A container is frozen where a control block of one of its regions marks it (as `freeze
    /// --container` writes it), read by the collector's region scan, with the limiter's count
    /// of all of its alive processes' memory (across its regions); a container whose block says
    /// running is not, and one whose block is garbage is not either: its region says why and
    /// counts as a region error, and the snapshot is built all the same.
    #[test]
    fn a_container_is_frozen_where_its_control_block_marks_it() {
        use super::super::{region_scan::RegionScan, regions::write_mark};
        use region::FreezeMark;
        let mut w = world();
        let host_ns = tenant_fs::own_pid_namespace().expect("the agent's pid namespace");
        let docker = |id: &str| format!("/docker/{id}");
        const THIRD: &str = "3333333333333333333333333333333333333333333333333333333333333333";
        const FOURTH: &str = "4444444444444444444444444444444444444444444444444444444444444444";
        fake_process(&w.proc, 100, 5000, &docker(VICTIM), VICTIM_NS, 7);
        fake_process(&w.proc, 101, 5001, &docker(VICTIM), VICTIM_NS, 8);
        fake_process(&w.proc, 200, 6000, &docker(ATTACKER), host_ns, 200);
        fake_process(&w.proc, 201, 6001, &docker(THIRD), host_ns, 201);
        fake_process(&w.proc, 202, 6002, &docker(FOURTH), host_ns, 202);
        // Each region with one slot holding its bytes, claimed while the scan reads it; its
        // owner (ns, pid, start) and the processes that map it, as the scan would list them.
        let regions = [
            ("frozen.cache", GIB, (VICTIM_NS, 7, 5000), 100),
            ("second.cache", GIB / 2, (VICTIM_NS, 8, 5001), 101),
            ("running.cache", 2 * GIB, (host_ns, 200, 6000), 200),
            ("garbage.cache", 3 * GIB, (host_ns, 201, 6001), 201),
            ("own.cache", GIB / 4, (host_ns, 202, 6002), 202),
        ];
        let _held: Vec<_> = regions
            .iter()
            .map(|(name, held, _, _)| {
                let (region, _) = region::Region::open_or_create(
                    &w.regions.join(name),
                    &RegionConfig::unlimited(1),
                )
                .unwrap();
                let slot = region.claim_slot().unwrap();
                region.try_reserve(&slot, 0, *held).unwrap();
                (region, slot)
            })
            .collect();
        write_mark(&w.regions.join("frozen.cache"), FreezeMark::Frozen);
        write_mark(&w.regions.join("running.cache"), FreezeMark::Frozen);
        write_mark(&w.regions.join("running.cache"), FreezeMark::Running);
        write_mark(&w.regions.join("own.cache"), FreezeMark::InProcess);
        std::fs::write(
            region::control_path(&w.regions.join("garbage.cache")),
            [0x5au8; region::control::CONTROL_SIZE],
        )
        .unwrap();

        let mut scan = RegionScan::new(vec![w.regions.clone()], Path::new("/proc"));
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let mut readings = scan.scan(&[], far).regions;
        assert_eq!(readings.len(), regions.len(), "{readings:?}");
        for r in &mut readings {
            let (_, _, (ns, pid, start), host_pid) = regions
                .iter()
                .find(|(name, ..)| r.path.ends_with(name))
                .unwrap();
            let RegionRead::Vgpu(snap) = &mut r.read else {
                panic!("{:?}", r.read)
            };
            own(snap, *ns, *pid, *start);
            r.mapped_by = vec![*host_pid];
        }
        let (mut snap, to_list) = assemble_listed(&mut w, &readings, &[100, 101, 200, 201, 202]);
        assert_eq!(to_list, [] as [u32; 0]);
        // As `Collector::collect` does once the processes' figures are final.
        snap.mark_frozen(|c| c.frozen.is_some());

        let container = |id: &str| snap.containers.iter().find(|c| c.key == id).unwrap();
        assert_eq!(
            container(VICTIM).frozen,
            Some(Frozen {
                host_bytes: GIB + GIB / 2,
                in_process: false,
            }),
            "both of its processes' memory, one region marked"
        );
        assert_eq!(container(ATTACKER).frozen, None, "marked, then thawed");
        assert_eq!(container(THIRD).frozen, None, "a corrupt mark is no mark");
        let problems = &container(THIRD).regions[0].problems;
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("control block not read") && p.contains("magic")),
            "{problems:?}"
        );
        assert_eq!(snap.agent.region_errors, 1);
        assert_eq!(held(&snap, 201).map(|(_, h)| h), Some(vec![3 * GIB]));
        // Frozen by its processes themselves: the path is said, and kept when the daemon marks
        // frozen containers again.
        let own = Some(Frozen {
            host_bytes: GIB / 4,
            in_process: true,
        });
        assert_eq!(container(FOURTH).frozen, own);
        snap.mark_frozen(|c| c.frozen.is_some() || c.key == ATTACKER);
        let container = |id: &str| snap.containers.iter().find(|c| c.key == id).unwrap();
        assert_eq!(container(FOURTH).frozen, own);
        assert_eq!(
            container(ATTACKER).frozen.as_ref().map(|f| f.in_process),
            Some(false)
        );
    }
}
