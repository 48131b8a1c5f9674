//! The in-process path of a container's freeze and thaw (docs/oversubscription.md, "The
//! in-process path"): each of the container's processes whose limiter runs with
//! `VGPU_FREEZE_IN_PROCESS=1` moves the device memory it backs to host memory itself when the
//! control block marks the container [`FreezeMark::InProcess`], and answers in its slot
//! ([`region::OwnFreeze`]: the generation of the mark it answered, and whether it froze, failed
//! or runs); it thaws itself at its next CUDA call, or when the mark goes back to `Running`.
//!
//! The agent takes this path only when every live process of the container's regions has it on
//! and every GPU process of the container has a slot there; it writes the mark, then reads the
//! slots every [`Waits::poll`] until each process answered the mark's generation, or the wait
//! passed. What a slot says is the tenant's: the wait is bounded by what the agent measures
//! ([`Measure`]: the processes' device memory per NVML) where it can, by the bytes the slots say
//! only within the container's memory limit otherwise, and by [`Waits::cap`] always; with NVML,
//! an answer "frozen" counts only if the process's device memory fell by at least half of what
//! it says it moved. A forged answer decides only how its own container's freeze or thaw is
//! reported, never what the agent counts against the host budget (the daemon keeps its own
//! figures).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use region::{
    ControlWriter, FreezeMark, OwnFreezeState, read_control,
    reader::{OwnFreezeSlot, ReadBudget, RegionReader, SlotPhase, SlotSnapshot},
};
use tenant_fs::{Access, TenantFile};

use super::restorable::VmmUse;
use crate::{
    checkpoint::measure::{GpuUse, Measure},
    collector::processes::ProcessTable,
    identity::container::ContainerIdentity,
    limit::{self, LimitError},
};

const GIB: u64 = 1 << 30;

/// Bytes of `/proc/<pid>/cgroup` read (a few hundred in practice).
const MAX_CGROUP_BYTES: usize = 64 << 10;

/// How long the agent waits for the processes' answers, and how often it looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waits {
    /// The wait for a container holding nothing.
    pub base: Duration,
    /// Added per GiB (started) a freeze moves to host memory.
    pub freeze_per_gib: Duration,
    /// Added per GiB (started) a thaw brings back.
    pub thaw_per_gib: Duration,
    /// The longest wait, whatever the bytes.
    pub cap: Duration,
    /// How often the slots are read.
    pub poll: Duration,
}

impl Waits {
    /// 5 s, and per GiB 0.5 s for a freeze, 0.25 s for a thaw, at most 60 s; the slots read
    /// every 10 ms. Measured on an H200 host (docs/oversubscription.md): a freeze costs about
    /// 0.25 s per GiB (the host memory populated in huge pages, registered, then the copy), a thaw
    /// about 0.03 s per GiB.
    pub const DEFAULT: Waits = Waits {
        base: Duration::from_secs(5),
        freeze_per_gib: Duration::from_millis(500),
        thaw_per_gib: Duration::from_millis(250),
        cap: Duration::from_secs(60),
        poll: Duration::from_millis(10),
    };

    /// The wait for a freeze that moves `bytes` in all.
    pub fn freeze(&self, bytes: u64) -> Duration {
        self.timeout(self.freeze_per_gib, bytes)
    }

    /// The wait for a thaw that brings `bytes` back in all.
    pub fn thaw(&self, bytes: u64) -> Duration {
        self.timeout(self.thaw_per_gib, bytes)
    }

    fn timeout(&self, per_gib: Duration, bytes: u64) -> Duration {
        let gib = u32::try_from(bytes.div_ceil(GIB)).unwrap_or(u32::MAX);
        self.base
            .saturating_add(per_gib.saturating_mul(gib))
            .min(self.cap)
    }
}

/// What the GPUs hold of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Held {
    /// Listed on no GPU: it holds no device memory.
    Nothing,
    /// Listed, with these bytes over every GPU.
    Bytes(u64),
    /// Listed on a GPU without a figure.
    Unknown,
}

/// What `gpus` say `pid` holds.
pub(super) fn held(gpus: &[GpuUse], pid: u32) -> Held {
    let mut out = Held::Nothing;
    for (_, used) in gpus
        .iter()
        .flat_map(|g| &g.processes)
        .filter(|p| p.0 == pid)
    {
        out = match (out, used) {
            (Held::Unknown, _) | (_, None) => Held::Unknown,
            (Held::Nothing, Some(b)) => Held::Bytes(*b),
            (Held::Bytes(a), Some(b)) => Held::Bytes(a.saturating_add(*b)),
        };
    }
    out
}

/// The memory of the GPUs where any of `pids` has a context (what can come back to them);
/// `None` when one of them is on no GPU or a GPU's memory is not known.
pub(super) fn capacity(gpus: &[GpuUse], pids: &[u32]) -> Option<u64> {
    if pids.iter().any(|p| held(gpus, *p) == Held::Nothing) {
        return None;
    }
    gpus.iter()
        .filter(|g| g.processes.iter().any(|(p, _)| pids.contains(p)))
        .try_fold(0u64, |s, g| Some(s.saturating_add(g.total?)))
}

/// A process of the container, as a slot of one of its regions names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Tracked {
    /// Which of the container's blocks (regions) the slot is in.
    block: usize,
    /// The slot's index and its owner's identity there (pid namespace, pid, start time): a slot
    /// taken over by another process is not this one any more.
    slot: u32,
    owner: (u64, u32, u64),
    /// The host pid.
    pub pid: u32,
    /// What its slot said when it was found.
    pub own: OwnFreezeSlot,
}

/// What a process answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Its slot answered the mark's generation (the state and bytes it says).
    Said(OwnFreezeState, u64),
    /// It exited (or left its slot) while the agent waited.
    Gone,
    /// No answer within the wait.
    Silent,
}

/// Tells which host process owns a slot.
pub trait Owners: Send {
    /// The host pid of the live process of the container that owns `slot`, if one does.
    fn owner(&mut self, slot: &SlotSnapshot) -> Option<u32>;
    /// Whether `pid`, found by [`Owners::owner`], still runs.
    fn alive(&mut self, pid: u32) -> bool;
}

/// The processes of a container, under `proc`, as their cgroups name it (listed at the first
/// question: a thaw through the driver never asks).
pub struct ContainerProcesses {
    proc: PathBuf,
    id: String,
    /// The processes' table and each one's host pid and start time, once listed.
    listed: Option<(ProcessTable, HashMap<u32, u64>)>,
}

impl ContainerProcesses {
    /// The processes of the container `id` (an id or id prefix).
    pub fn new(proc: &Path, id: &str) -> ContainerProcesses {
        ContainerProcesses {
            proc: proc.to_owned(),
            id: id.to_owned(),
            listed: None,
        }
    }

    /// Lists the container's processes running now.
    fn listed(&mut self) -> &mut (ProcessTable, HashMap<u32, u64>) {
        let (proc, id) = (&self.proc, self.id.as_str());
        self.listed.get_or_insert_with(|| {
            let mut table = ProcessTable::new(proc);
            let mut members = HashMap::new();
            for pid in std::fs::read_dir(proc)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            {
                let path = proc.join(pid.to_string()).join("cgroup");
                let ours = tenant_fs::read_proc(&path, MAX_CGROUP_BYTES).is_ok_and(|(cg, _)| {
                    ContainerIdentity::from_proc_cgroup(&String::from_utf8_lossy(&cg))
                        .and_then(|i| i.container_id)
                        .is_some_and(|c| !id.is_empty() && c.as_str().starts_with(id))
                });
                if ours && let Some(info) = table.get(pid) {
                    members.insert(pid, info.facts.start_ticks);
                }
            }
            (table, members)
        })
    }
}

impl Owners for ContainerProcesses {
    fn owner(&mut self, slot: &SlotSnapshot) -> Option<u32> {
        let (table, members) = self.listed();
        // The table holds the container's processes only: a slot naming another is not ours.
        let pid = table.find_by_namespace(slot.pid_ns, slot.pid, slot.start_time)?;
        members.contains_key(&pid).then_some(pid)
    }

    fn alive(&mut self, pid: u32) -> bool {
        let Some(&start) = self.listed().1.get(&pid) else {
            return false;
        };
        let mut buf = [0u8; tenant_fs::MAX_STAT_BYTES];
        tenant_fs::read_stat(&self.proc.join(pid.to_string()).join("stat"), &mut buf)
            .is_ok_and(|s| s.state != b'Z' && s.start_ticks == start)
    }
}

/// One region of a container and the control block beside it.
pub struct Block {
    /// The control block's path, as shown.
    shown: PathBuf,
    /// Opened for writing, or why not.
    control: Result<TenantFile, String>,
    /// The region, read-only (`None`: it could not be opened).
    reader: Option<RegionReader>,
}

impl Block {
    /// The region at `region` (a path with no link in it), for tests.
    #[cfg(test)]
    pub fn at(region: &Path) -> Block {
        let ctl = region::control_path(region);
        Block {
            shown: ctl.clone(),
            control: tenant_fs::open_no_links(&ctl, Access::ReadWrite).map_err(|e| e.to_string()),
            reader: RegionReader::open(region).ok(),
        }
    }

    /// Its freeze mark (`None`: the block could not be read, or does not validate).
    fn mark(&self) -> Option<FreezeMark> {
        let snap = read_control(self.control.as_ref().ok()?).ok()?;
        Some(snap.map_or(FreezeMark::Running, |s| s.settings.freeze))
    }

    fn set_mark(&self, mark: FreezeMark) -> Result<u64, String> {
        let file = self.control.as_ref().map_err(Clone::clone)?;
        let writer = ControlWriter::new(file).map_err(|e| e.to_string())?;
        writer
            .update(|s| s.freeze = mark)
            .map_err(|e| e.to_string())
    }
}

/// A container's regions and processes, as a freeze or thaw of it reaches them.
pub struct Container {
    pub(super) id: String,
    blocks: Vec<Block>,
    owners: Box<dyn Owners>,
    pub(super) waits: Waits,
    /// The GPUs' per-process memory (`None`: no NVML; the slots' words are bounded otherwise).
    pub(super) measure: Option<Box<dyn Measure>>,
}

/// What a look at the container's regions found.
#[derive(Debug)]
pub(super) struct Survey {
    /// The live processes with the path on.
    pub tracked: Vec<Tracked>,
    /// The pids of those without it.
    pub off: Vec<u32>,
    /// Whether every region (and control block) was read whole.
    pub whole: bool,
    /// The container's memory limit: the sum of its regions' limits, `None` where a device of
    /// one has none or a region could not be read.
    pub limit: Option<u64>,
    /// What each live process's slot says of its `cuMemCreate` memory (host pid, figures; a
    /// process with slots in several regions has one entry per slot).
    pub vmm: Vec<(u32, VmmUse)>,
}

impl Container {
    /// The container `id`'s regions (those its processes under `proc` map) and processes,
    /// measured by `measure`; `None` when none of its processes maps a limiter region.
    pub fn find(
        proc: &Path,
        id: &str,
        measure: Option<Box<dyn Measure>>,
    ) -> Result<Option<Container>, LimitError> {
        let regions = match limit::regions(&limit::Target::Container(id.to_owned()), proc) {
            Ok(r) => r,
            Err(LimitError::NoRegion(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let blocks = regions
            .into_iter()
            .map(|r| Block {
                shown: r.control_path(),
                control: r.open_control(Access::ReadWrite).map_err(|e| e.to_string()),
                reader: r
                    .open_region()
                    .ok()
                    .and_then(|f| RegionReader::from_file(f).ok()),
            })
            .collect();
        Ok(Some(
            Container::new(
                id,
                blocks,
                Box::new(ContainerProcesses::new(proc, id)),
                Waits::DEFAULT,
            )
            .with_measure(measure),
        ))
    }

    pub fn new(id: &str, blocks: Vec<Block>, owners: Box<dyn Owners>, waits: Waits) -> Container {
        Container {
            id: id.to_owned(),
            blocks,
            owners,
            waits,
            measure: None,
        }
    }

    /// Measures the processes' device memory with `measure` (`None`: not at all).
    pub fn with_measure(mut self, measure: Option<Box<dyn Measure>>) -> Container {
        self.measure = measure;
        self
    }

    /// What NVML says now (`None`: no NVML, or not read).
    pub(super) fn measured(&self) -> Option<Vec<GpuUse>> {
        self.measure.as_ref()?.read()
    }

    /// Writes `mark` into every control block; the generation written in each. A block that
    /// cannot be written does not keep the others from being written, and is returned after
    /// them (as `limit set` does).
    pub(super) fn set_mark(&self, mark: FreezeMark) -> Result<Vec<u64>, LimitError> {
        let (mut generations, mut refused, mut done) = (Vec::new(), Vec::new(), Vec::new());
        for b in &self.blocks {
            match b.set_mark(mark) {
                Ok(g) => {
                    generations.push(g);
                    done.push(format!(
                        "{}: generation {g}: {}",
                        b.shown.display(),
                        limit::mark_name(mark)
                    ));
                }
                Err(why) => refused.push((b.shown.clone(), why)),
            }
        }
        if refused.is_empty() {
            Ok(generations)
        } else {
            Err(LimitError::Refused {
                target: format!("container {}", self.id),
                refused,
                done,
            })
        }
    }

    /// Whether the container is frozen on the in-process path now: a block marks it so and
    /// none marks it frozen (or freezing) by the driver's path.
    pub(super) fn marked_in_process(&self) -> bool {
        let marks: Vec<Option<FreezeMark>> = self.blocks.iter().map(Block::mark).collect();
        marks.contains(&Some(FreezeMark::InProcess))
            && !marks
                .iter()
                .any(|m| matches!(m, Some(FreezeMark::Frozen | FreezeMark::Freezing)))
    }

    /// The live processes of the container in its regions' slots, each with what its slot says
    /// of its in-process path; the pids of those without it; whether every region was read
    /// whole; the container's memory limit.
    pub(super) fn survey(&mut self) -> Survey {
        let (mut tracked, mut off, mut whole) = (Vec::new(), Vec::new(), true);
        let (mut limit, mut vmm) = (Some(0u64), Vec::new());
        for (block, b) in self.blocks.iter().enumerate() {
            let snap = b
                .reader
                .as_ref()
                .map(|r| r.snapshot_within(&ReadBudget::DEFAULT));
            let Some(Ok(snap)) = snap else {
                whole = false;
                limit = None;
                continue;
            };
            whole &= snap.unread.is_none() && b.control.is_ok();
            for d in &snap.devices {
                limit = match d.memory_limit {
                    0 => None,
                    l => limit.map(|s| s.saturating_add(l)),
                };
            }
            for s in snap.slots.iter().filter(|s| s.phase == SlotPhase::Live) {
                let Some(pid) = self.owners.owner(s) else {
                    continue;
                };
                vmm.push((pid, VmmUse::of(s)));
                match s.own_freeze {
                    Some(own) => tracked.push(Tracked {
                        block,
                        slot: s.index,
                        owner: (s.pid_ns, s.pid, s.start_time),
                        pid,
                        own,
                    }),
                    None => off.push(pid),
                }
            }
        }
        Survey {
            tracked,
            off,
            whole,
            limit: limit.filter(|_| !self.blocks.is_empty()),
            vmm,
        }
    }

    /// [`Container::ready`] of a survey taken now.
    #[cfg(test)]
    pub(super) fn in_process_ready(&mut self, pids: &[u32]) -> Result<Survey, String> {
        let survey = self.survey();
        Container::ready(survey, pids)
    }

    /// The processes to freeze in-process, if the path can be taken: every region read whole
    /// (by `survey`), every live process in them with the path on, and every GPU process of the
    /// container (`pids`) among them. `Err`: why not (for the log).
    pub(super) fn ready(survey: Survey, pids: &[u32]) -> Result<Survey, String> {
        let Survey {
            tracked,
            off,
            whole,
            limit,
            vmm,
        } = survey;
        if !whole {
            return Err("a region or control block could not be read whole".into());
        }
        if let Some(pid) = off.first() {
            return Err(format!("pid {pid} does not use it"));
        }
        if tracked.is_empty() {
            return Err("no process of its regions uses it".into());
        }
        if let Some(pid) = pids.iter().find(|p| !tracked.iter().any(|t| t.pid == **p)) {
            return Err(format!("pid {pid} has no slot in the container's regions"));
        }
        Ok(Survey {
            tracked,
            off,
            whole,
            limit,
            vmm,
        })
    }

    /// Waits until each of `tracked` answers the generation of its block in `generations` with
    /// a state `wanted` accepts, exits, or `timeout` passes.
    pub(super) fn wait(
        &mut self,
        tracked: &[Tracked],
        generations: &[u64],
        wanted: impl Fn(OwnFreezeState) -> bool,
        timeout: Duration,
    ) -> Vec<Answer> {
        let deadline = Instant::now() + timeout;
        let mut answers: Vec<Option<Answer>> = vec![None; tracked.len()];
        loop {
            for (block, b) in self.blocks.iter().enumerate() {
                if !tracked
                    .iter()
                    .zip(&answers)
                    .any(|(t, a)| a.is_none() && t.block == block)
                {
                    continue;
                }
                let Some(Ok(snap)) = b
                    .reader
                    .as_ref()
                    .map(|r| r.snapshot_within(&ReadBudget::DEFAULT))
                else {
                    continue;
                };
                let generation = generations.get(block).copied().unwrap_or(0);
                for (t, a) in tracked.iter().zip(answers.iter_mut()) {
                    if a.is_some() || t.block != block {
                        continue;
                    }
                    let slot = snap.slots.iter().find(|s| s.index == t.slot);
                    let read = snap.unread.is_none_or(|u| t.slot < u.first_slot);
                    match slot {
                        Some(s)
                            if s.phase == SlotPhase::Live
                                && (s.pid_ns, s.pid, s.start_time) == t.owner =>
                        {
                            if let Some(o) = s.own_freeze
                                && o.state.answers(generation)
                                && wanted(o.state.state)
                            {
                                *a = Some(Answer::Said(o.state.state, o.bytes));
                                continue;
                            }
                        }
                        // The slot is free or another's: its process left it.
                        _ if read => {
                            *a = Some(Answer::Gone);
                            continue;
                        }
                        _ => {}
                    }
                    if !self.owners.alive(t.pid) {
                        *a = Some(Answer::Gone);
                    }
                }
            }
            let now = Instant::now();
            if answers.iter().all(Option::is_some) || now >= deadline {
                break;
            }
            std::thread::sleep(self.waits.poll.min(deadline - now));
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Answer::Silent))
            .collect()
    }
}

/// A container's limiters as tests play them: processes (slots of one region) that answer the
/// control block's marks as the limiter's watcher does, or not.
#[cfg(test)]
pub mod testing {
    use std::{
        collections::{HashMap, HashSet},
        sync::{
            Arc, Mutex,
            atomic::{AtomicBool, Ordering},
        },
    };

    use region::{OwnFreeze, Region, RegionConfig, reader::SlotSnapshot};

    use super::*;

    /// What a process does at the marks.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Acts {
        /// Freezes at `InProcess`, thaws at `Running`.
        Freezes,
        /// Answers `Frozen` at `InProcess` without freeing any device memory; runs at `Running`.
        Forges,
        /// Freezes at `InProcess` and thaws at `Running`, but says it backs (and moved)
        /// [`HUGE`] bytes.
        Inflates,
        /// Fails at `InProcess`, runs on at `Running`.
        Fails,
        /// Freezes at `InProcess`, never answers `Running`.
        StaysFrozen,
        /// Never answers.
        Silent,
        /// Exits when it sees `InProcess` (before answering).
        Exits,
        /// Has the path off (its slot says nothing of it).
        Off,
    }

    /// The host pid the test gives its `i`th process.
    pub fn pid_of(i: usize) -> u32 {
        1000 + i as u32
    }

    /// The bytes an [`Acts::Inflates`] process says it backs: 1 EiB.
    pub const HUGE: u64 = 1 << 60;

    /// The device memory of a process's CUDA context, which stays on the GPU while it is
    /// frozen in-process (as NVML lists it).
    pub const CONTEXT: u64 = 512 << 20;

    /// The memory of the one GPU the fake NVML lists.
    pub const GPU_MEMORY: u64 = 80 * GIB;

    /// NVML as the tests play it: one GPU, where each live process holds what the map says.
    pub struct FakeNvml {
        pub held: Arc<Mutex<HashMap<u32, u64>>>,
        pub dead: Arc<Mutex<HashSet<u32>>>,
    }

    impl Measure for FakeNvml {
        fn read(&self) -> Option<Vec<GpuUse>> {
            let dead = self.dead.lock().unwrap();
            let mut processes: Vec<(u32, Option<u64>)> = self
                .held
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| !dead.contains(p))
                .map(|(p, b)| (*p, Some(*b)))
                .collect();
            processes.sort_unstable();
            Some(vec![GpuUse {
                total: Some(GPU_MEMORY),
                processes,
            }])
        }
    }

    /// Slots are told apart by their index (all are the test process's own): the `i`th of
    /// `slots` is the process [`pid_of`] `i`.
    pub struct FakeOwners {
        pub dead: Arc<Mutex<HashSet<u32>>>,
        pub slots: Vec<u32>,
    }

    impl Owners for FakeOwners {
        fn owner(&mut self, slot: &SlotSnapshot) -> Option<u32> {
            let pid = pid_of(self.slots.iter().position(|s| *s == slot.index)?);
            self.alive(pid).then_some(pid)
        }

        fn alive(&mut self, pid: u32) -> bool {
            !self.dead.lock().unwrap().contains(&pid)
        }
    }

    /// A container with one region, whose processes (one slot each) have the in-process path
    /// on and back `GiB x (i + 1)` each (and hold [`CONTEXT`] more on the GPU).
    pub struct Tenant {
        _dir: tempfile::TempDir,
        pub path: PathBuf,
        pub region: Region,
        pub slots: Vec<region::Slot>,
        pub acts: Vec<Acts>,
        pub dead: Arc<Mutex<HashSet<u32>>>,
        /// Each mark the limiters saw, in order.
        pub marks: Mutex<Vec<FreezeMark>>,
        /// What each process holds on the GPU, as the fake NVML lists it (`None`: no NVML).
        pub nvml: Option<Arc<Mutex<HashMap<u32, u64>>>>,
    }

    impl Tenant {
        pub fn new(acts: &[Acts]) -> Tenant {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.region");
            let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
            drop(region::ControlReader::open_or_create(&region::control_path(&path)).unwrap());
            let slots: Vec<region::Slot> =
                acts.iter().map(|_| region.claim_slot().unwrap()).collect();
            let t = Tenant {
                _dir: dir,
                path,
                region,
                slots,
                acts: acts.to_vec(),
                dead: Arc::default(),
                marks: Mutex::default(),
                nvml: None,
            };
            for (i, slot) in t.slots.iter().enumerate() {
                if acts[i] != Acts::Off {
                    t.region
                        .publish_own_freeze(slot, OwnFreeze::default(), t.claims(i));
                }
            }
            t
        }

        /// With NVML, which lists each process holding its bytes and its context.
        pub fn with_nvml(mut self) -> Tenant {
            let held = (0..self.slots.len())
                .map(|i| (pid_of(i), self.backs(i) + CONTEXT))
                .collect();
            self.nvml = Some(Arc::new(Mutex::new(held)));
            self
        }

        /// With the memory limit `bytes` on its region's device.
        pub fn with_limit(self, bytes: u64) -> Tenant {
            assert!(self.region.set_memory_limit(0, bytes));
            self
        }

        /// Process `i` says it backs `bytes` from now (its state as it is).
        pub fn claim(&self, i: usize, bytes: u64) {
            let own = self.said(i).map_or(OwnFreeze::default(), |o| o.state);
            self.region.publish_own_freeze(&self.slots[i], own, bytes);
        }

        /// Process `i`'s slot says it holds `total` bytes on the device, `created` of them from
        /// `cuMemCreate` (its region's accounting and API statistics, as its limiter writes them).
        pub fn holds(&self, i: usize, total: u64, created: u64) {
            let slot = &self.slots[i];
            self.region.try_reserve(slot, 0, total).unwrap();
            let create = agent_common::api::ApiId::from_name("cuMemCreate").unwrap();
            self.region.shard_writer(slot).record_alloc(create, created);
        }

        /// Whether the control block was ever written (a mark of any kind).
        pub fn marked(&self) -> bool {
            let file =
                tenant_fs::open_no_links(&region::control_path(&self.path), Access::Read).unwrap();
            read_control(&file).unwrap().is_some()
        }

        /// The bytes process `i` backs.
        pub fn backs(&self, i: usize) -> u64 {
            GIB * (i as u64 + 1)
        }

        /// The bytes process `i` says it backs.
        pub fn claims(&self, i: usize) -> u64 {
            match self.acts[i] {
                Acts::Inflates => HUGE,
                _ => self.backs(i),
            }
        }

        pub fn pids(&self) -> Vec<u32> {
            (0..self.slots.len()).map(pid_of).collect()
        }

        /// The container as the agent finds it, with waits of `timeout` (whatever the bytes).
        pub fn container(&self, timeout: Duration) -> Container {
            (self.finder(timeout))("c").unwrap().unwrap()
        }

        /// Waits of `timeout`, whatever the bytes.
        pub fn waits(timeout: Duration) -> Waits {
            Waits {
                base: timeout,
                freeze_per_gib: Duration::ZERO,
                thaw_per_gib: Duration::ZERO,
                cap: timeout,
                poll: Duration::from_millis(2),
            }
        }

        /// How the daemon finds the container (as [`Tenant::container`] makes it).
        pub fn finder(
            &self,
            timeout: Duration,
        ) -> impl Fn(&str) -> Result<Option<Container>, LimitError> + Send + Sync + 'static
        {
            self.finder_waiting(Tenant::waits(timeout))
        }

        /// How the daemon finds the container, with `waits`.
        pub fn finder_waiting(
            &self,
            waits: Waits,
        ) -> impl Fn(&str) -> Result<Option<Container>, LimitError> + Send + Sync + 'static
        {
            let path = self.path.clone();
            let dead = Arc::clone(&self.dead);
            let nvml = self.nvml.clone();
            let slots: Vec<u32> = self.slots.iter().map(region::Slot::index).collect();
            move |id| {
                let measure = nvml.as_ref().map(|held| {
                    Box::new(FakeNvml {
                        held: Arc::clone(held),
                        dead: Arc::clone(&dead),
                    }) as Box<dyn Measure>
                });
                Ok(Some(
                    Container::new(
                        id,
                        vec![Block::at(&path)],
                        Box::new(FakeOwners {
                            dead: Arc::clone(&dead),
                            slots: slots.clone(),
                        }),
                        waits,
                    )
                    .with_measure(measure),
                ))
            }
        }

        /// The control block's mark and generation now.
        pub fn mark(&self) -> (FreezeMark, u64) {
            let file =
                tenant_fs::open_no_links(&region::control_path(&self.path), Access::Read).unwrap();
            let snap = read_control(&file).unwrap().unwrap();
            (snap.settings.freeze, snap.generation)
        }

        /// What the slot of process `i` says.
        pub fn said(&self, i: usize) -> Option<OwnFreezeSlot> {
            let snap = RegionReader::open(&self.path).unwrap().snapshot().unwrap();
            let index = self.slots[i].index();
            snap.slots.iter().find(|s| s.index == index)?.own_freeze
        }

        /// Plays the processes' watchers until `stop`: at each generation of the control block
        /// after `seen`, each answers as it acts.
        pub fn answer_until(&self, stop: &AtomicBool, mut seen: u64) {
            let ctl = region::control_path(&self.path);
            while !stop.load(Ordering::Relaxed) {
                let file = tenant_fs::open_no_links(&ctl, Access::Read).unwrap();
                if let Ok(Some(snap)) = read_control(&file)
                    && snap.generation != seen
                {
                    seen = snap.generation;
                    let mark = snap.settings.freeze;
                    self.marks.lock().unwrap().push(mark);
                    for (i, (slot, acts)) in self.slots.iter().zip(&self.acts).enumerate() {
                        let state = match (mark, acts) {
                            (_, Acts::Silent | Acts::Off) => continue,
                            (FreezeMark::InProcess, Acts::Exits) => {
                                self.dead.lock().unwrap().insert(pid_of(i));
                                continue;
                            }
                            (FreezeMark::InProcess, Acts::Fails) => OwnFreezeState::Failed,
                            (FreezeMark::InProcess, _) => OwnFreezeState::Frozen,
                            (FreezeMark::Running, Acts::StaysFrozen | Acts::Exits) => continue,
                            (FreezeMark::Running, _) => OwnFreezeState::Running,
                            // Marked by the driver's path: the process waits as without the path.
                            _ => continue,
                        };
                        // Its memory leaves the GPU before it answers, and is back before it
                        // answers the thaw (a forger's never moves).
                        if let Some(nvml) = &self.nvml
                            && *acts != Acts::Forges
                        {
                            let on_gpu = match state {
                                OwnFreezeState::Frozen => CONTEXT,
                                _ => self.backs(i) + CONTEXT,
                            };
                            nvml.lock().unwrap().insert(pid_of(i), on_gpu);
                        }
                        let own = OwnFreeze {
                            state,
                            generation: seen,
                        };
                        self.region.publish_own_freeze(slot, own, self.claims(i));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        /// Runs `f` while the processes answer.
        pub fn answering<T>(&self, f: impl FnOnce() -> T) -> T {
            /// Stops the processes however `f` ends (a failed assertion too).
            struct Stop<'a>(&'a AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let stop = AtomicBool::new(false);
            // Only the marks `f` writes are answered: a mark answered by an earlier call stays
            // answered (re-answering it would overwrite what a test made the slot say since).
            let seen = if self.marked() { self.mark().1 } else { 0 };
            std::thread::scope(|s| {
                s.spawn(|| self.answer_until(&stop, seen));
                let _stop = Stop(&stop);
                f()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 5 s, and per GiB started 0.5 s for a freeze, 0.25 s for a thaw; 60 s at most.
    #[test]
    fn the_waits_grow_with_the_bytes_and_are_capped() {
        let w = Waits::DEFAULT;
        let ms = Duration::from_millis;
        assert_eq!(w.freeze(0), ms(5000));
        assert_eq!(w.freeze(1), ms(5500));
        assert_eq!(w.freeze(16 * GIB), ms(13_000));
        assert_eq!(w.freeze(110 * GIB), ms(60_000));
        assert_eq!(w.freeze(u64::MAX), ms(60_000));
        assert_eq!(w.thaw(0), ms(5000));
        assert_eq!(w.thaw(16 * GIB), ms(9000));
        assert_eq!(w.thaw(141 * GIB), ms(40_250));
        assert_eq!(w.thaw(u64::MAX), ms(60_000));
    }

    /// NVML's lists read per process: bytes over every GPU, no figure where a GPU gives none,
    /// nothing where none lists it; the GPUs' memory where the processes are.
    #[test]
    fn nvmls_lists_are_read_per_process() {
        let gpus = [
            GpuUse {
                total: Some(80 * GIB),
                processes: vec![(1, Some(GIB)), (2, Some(2 * GIB))],
            },
            GpuUse {
                total: Some(40 * GIB),
                processes: vec![(1, Some(3 * GIB)), (3, None)],
            },
        ];
        assert_eq!(held(&gpus, 1), Held::Bytes(4 * GIB));
        assert_eq!(held(&gpus, 2), Held::Bytes(2 * GIB));
        assert_eq!(held(&gpus, 3), Held::Unknown);
        assert_eq!(held(&gpus, 4), Held::Nothing);
        assert_eq!(capacity(&gpus, &[2]), Some(80 * GIB));
        assert_eq!(capacity(&gpus, &[1, 2]), Some(120 * GIB));
        assert_eq!(capacity(&gpus, &[2, 4]), None, "one on no GPU");
    }
}
