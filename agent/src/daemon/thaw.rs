//! Thawing a frozen container at its next CUDA call: the daemon's side
//! (docs/oversubscription.md).
//!
//! `vgpu-agent freeze --container` marks the container frozen in its control blocks. The
//! container's limiter, at its next CUDA call and before the driver holds that call, stores the
//! marking generation as its region's thaw request and waits. This thread finds the frozen
//! containers (every [`SCAN_PERIOD`], a walk of `/proc` as `limit` does), looks at each frozen
//! one's control block and region every [`POLL`] (two `pread`s; it wakes every [`IDLE_POLL`]
//! while none is frozen), and on a request that names the
//! block's current generation thaws the container's processes through the driver's checkpoint
//! API and clears the mark, which lets the waiting call go on.
//!
//! With `--freeze-after` (`VGPU_FREEZE_AFTER`), the same thread also freezes idle containers:
//! the daemon hands it each snapshot's containers (the CUDA calls their processes made, the
//! device bytes the limiter counts for them), `limiter_core::freeze::Freezer` decides (idle for
//! the TTL, holding device memory, fitting what is left of `--freeze-host-budget`), and the
//! freeze goes through [`freeze::freeze_found`] as `freeze --container`'s does, marking the
//! container so that its next call thaws it here.
//!
//! With `--freeze-on-demand` (`VGPU_FREEZE_ON_DEMAND`), a container's allocation waiting for
//! device memory (`VGPU_OOM_WAIT`; its slot says for how many bytes, read with the snapshot)
//! gets other containers idle for that long frozen the same way, largest first, until they give
//! back as much ([`Freezer::on_demand`]). The bytes are the tenant's claim: they only choose
//! among the containers the operator let be frozen on demand.
//!
//! A container refused because a process of it holds its memory from `cuMemCreate`
//! ([`FreezeError::Refused`]: the driver could not restore it) is a failed freeze for the
//! freezer; the refusal is logged once per container, and while the container holds the same
//! bytes a freeze decided for it fails at once, without a worker ([`ThawWatch::refused_again`]).
//!
//! A container frozen on the limiter's in-process path (the mark `InProcess`, written by
//! [`freeze::Container::freeze`] when every process of the container has the path on) asks
//! for its thaw the same way: its first call has thawed its own process already, and the thaw
//! here writes the running mark, which thaws the others ([`freeze::Container::thaw`]): neither
//! the driver's checkpoint API nor the room check is used for it (each limiter's own thaw waits
//! for room).
//!
//! Everything read here is the tenant's: the request is acted on only when it equals the
//! generation the agent's own mark has now, so a forged request thaws only the tenant's own
//! container, which its next CUDA call would do anyway. A thaw that fails (the GPU has no room
//! for the memory yet) is tried again at most every [`RETRY_PERIOD`].
//!
//! The freezes and thaws themselves run on worker threads (at most [`MAX_WORKERS`] at once, one
//! per container; thaws first, and freezes leave one worker to thaws), each reporting back here,
//! where the freezer's books are kept: a freeze or thaw waiting on a tenant's processes (an
//! in-process answer, the driver's lock of a busy process) never delays another container's
//! thaw, and this thread never waits on a tenant.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, Sender},
    },
    time::{Duration, Instant},
};

use limiter_core::freeze::{Activity, Demand, Freezer, Step};

use region::{FreezeMark, read_control, reader::RegionReader};
use tenant_fs::{Access, TenantFile};

use crate::{
    checkpoint::{CheckpointApi, CheckpointError, room},
    freeze::{self, FreezeError},
    limit,
    nvml::library::{DEFAULT_LIBRARY, NvmlLibrary},
};

/// Finds a container's regions and processes (by its id) for a freeze or a thaw.
type Find = Box<dyn Fn(&str) -> Result<Option<freeze::Container>, limit::LimitError> + Send + Sync>;
/// Lists a container's GPU processes (by its id).
type Pids = Box<dyn Fn(&str) -> Result<Vec<u32>, FreezeError> + Send + Sync>;
/// Loads the driver's checkpoint API.
type Load = Box<dyn Fn() -> Result<Arc<dyn DaemonApi>, CheckpointError> + Send + Sync>;

/// How many freezes and thaws run at once (each on its own thread).
pub const MAX_WORKERS: usize = 4;
/// How often loading NVML is tried again after it failed.
const NVML_RETRY: Duration = Duration::from_secs(30);

/// The driver's checkpoint API as the daemon's workers share it.
pub trait DaemonApi: CheckpointApi + Send + Sync {
    /// Removes the records of processes gone.
    fn prune(&self) {}
}

impl DaemonApi for room::Checked {
    fn prune(&self) {
        room::RoomChecked::prune(self)
    }
}

/// The host's NVML, loaded at its first use (and again at most every [`NVML_RETRY`] while it
/// cannot be), shared by the workers' measures.
#[derive(Default)]
struct SharedNvml(Mutex<(Option<Arc<NvmlLibrary>>, Option<Instant>)>);

impl SharedNvml {
    fn measure(&self) -> Option<Box<dyn freeze::Measure>> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0.is_none() && state.1.is_none_or(|t| t.elapsed() >= NVML_RETRY) {
            state.1 = Some(Instant::now());
            state.0 = NvmlLibrary::open(Path::new(DEFAULT_LIBRARY))
                .ok()
                .map(Arc::new);
        }
        let nvml = Arc::clone(state.0.as_ref()?);
        Some(Box::new(freeze::NvmlUse(nvml)))
    }
}

/// How the workers reach containers and the driver.
struct Reach {
    find: Find,
    pids: Pids,
    load: Load,
    /// The driver's checkpoint API, once loaded.
    api: Mutex<Option<Arc<dyn DaemonApi>>>,
}

impl Reach {
    /// The driver's checkpoint API, loaded at its first use.
    fn api(&self) -> Result<Arc<dyn DaemonApi>, CheckpointError> {
        let mut api = self.api.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = &*api {
            return Ok(Arc::clone(a));
        }
        let loaded = (self.load)()?;
        *api = Some(Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The driver's checkpoint API, if it was loaded.
    fn loaded(&self) -> Option<Arc<dyn DaemonApi>> {
        self.api
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Freezes the container (in-process where its processes can, else through the driver,
    /// loaded only then).
    fn freeze(&self, container: &str) -> Result<Vec<String>, FreezeError> {
        let pids = (self.pids)(container)?;
        let found = (self.find)(container)?;
        freeze::freeze_found(found, || self.api(), container, &pids, IDLE_LOCK_TIMEOUT)
    }

    /// Thaws the container and clears its mark: frozen in-process, by writing the running mark
    /// (its processes thaw themselves, the limiter's thaw waiting for room; no checkpoint API,
    /// no room check); frozen through the driver, its processes restored by the checkpoint API.
    fn thaw(&self, container: &str) -> Result<Vec<String>, FreezeError> {
        let found = (self.find)(container)?;
        freeze::thaw_found(found, || self.api(), || (self.pids)(container))
    }
}

/// A freeze or thaw for a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Job {
    /// A freeze the freezer decided (its bytes reserved); `why` is said in the log.
    Freeze { why: String },
    /// A thaw the container asked for at its next CUDA call, naming `generation`.
    Asked { generation: u64 },
    /// A thaw the freezer decided (the container's processes made CUDA calls).
    Called,
}

/// A worker's report.
struct Done {
    container: String,
    job: Job,
    outcome: Result<Vec<String>, FreezeError>,
}

/// How often the frozen containers are looked for.
const SCAN_PERIOD: Duration = Duration::from_secs(1);
/// How often a frozen container's thaw request is looked at.
const POLL: Duration = Duration::from_millis(5);
/// How often the thread wakes while no container is frozen (for a due scan and the idle
/// freeze's snapshots): 200 wake-ups a second for nothing cost the idle daemon measurable CPU.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long after a failed thaw the same request is tried again.
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How often the same failure of a container's thaw is logged again while it is retried (a
/// container waiting for room is retried every second, maybe for hours).
const REPEAT_LOG_PERIOD: Duration = Duration::from_secs(60);

/// A container's last failed thaw.
struct FailedThaw {
    /// The generation requested.
    generation: u64,
    at: Instant,
    /// What was logged, and when.
    logged: String,
    logged_at: Instant,
}

impl FailedThaw {
    /// Whether `message` should be logged now: a new failure, or the same one after
    /// [`REPEAT_LOG_PERIOD`].
    fn should_log(last: Option<&FailedThaw>, message: &str, now: Instant) -> bool {
        last.is_none_or(|f| {
            f.logged != message || now.duration_since(f.logged_at) >= REPEAT_LOG_PERIOD
        })
    }
}

/// How long an idle freeze waits for each process's CUDA calls in flight.
const IDLE_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The idle freeze's settings.
#[derive(Debug, Clone, Copy)]
pub struct IdleFreeze {
    /// Idle time after which a container is frozen (`None`: only containers that ask for it,
    /// after their own time).
    pub after: Option<Duration>,
    /// Host bytes frozen containers may hold together.
    pub host_budget: u64,
    /// Idle time after which a container may be frozen to make room for another's allocation
    /// waiting for device memory (`None`: never).
    pub on_demand: Option<Duration>,
}

/// A container as a snapshot shows it: its id, the CUDA calls its processes made in all, and
/// the device bytes the limiter counts for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub container: String,
    pub calls: u64,
    pub bytes: u64,
    /// The idle time after which the container asks to be frozen (the shortest its regions
    /// say), if it asks.
    pub ttl: Option<Duration>,
    /// Its processes' allocations waiting for device memory, as their slots say.
    pub waits: Vec<Wait>,
    /// The GPUs (NVML indices) where its processes hold memory, as NVML lists them (empty
    /// without NVML).
    pub gpus: std::collections::BTreeSet<u32>,
}

/// An allocation waiting for device memory, as a process's slot says (the tenant's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The process (host pid) and its number for the wait: one wait apart from the next.
    pub pid: u32,
    pub wait: u64,
    /// The device index the tenant wrote (shown in the log only: it is the container's CUDA
    /// ordinal, not a GPU of the host).
    pub device: u64,
    pub bytes: u64,
    /// The GPUs (NVML indices) the waiting process has a context on, as NVML lists them: the
    /// GPU it waits on is one of them (empty without NVML: not known).
    pub gpus: std::collections::BTreeSet<u32>,
}

/// The containers of a snapshot that the idle freeze looks at: those with a container id and a
/// process under the limiter.
pub fn observed(snap: &crate::model::Snapshot) -> Vec<Observed> {
    snap.containers
        .iter()
        .filter_map(|c| {
            let id = c.container_id.clone()?;
            let processes = snap
                .processes
                .iter()
                .filter(|p| p.alive && c.processes.contains(&p.key));
            let (mut calls, mut bytes, mut limited) = (0u64, 0u64, false);
            let mut waits = Vec::new();
            let mut gpus = std::collections::BTreeSet::new();
            for p in processes {
                calls += p.apis.iter().map(|a| a.calls).sum::<u64>();
                gpus.extend(
                    p.nvml
                        .iter()
                        .filter(|n| n.used_memory.is_some_and(|b| b > 0))
                        .map(|n| n.device),
                );
                if let Some(b) = p.memory.limiter {
                    bytes += b;
                    limited = true;
                }
                if let Some(w) = p.limiter.as_ref().and_then(|l| l.waiting_for_memory) {
                    waits.push(Wait {
                        pid: p.key.pid,
                        wait: w.wait,
                        device: w.device,
                        bytes: w.bytes,
                        gpus: p.nvml.iter().map(|n| n.device).collect(),
                    });
                }
            }
            let ttl = c
                .regions
                .iter()
                .filter_map(|r| r.freeze_after_seconds)
                .filter(|s| s.is_finite() && *s > 0.0)
                .min_by(f64::total_cmp)
                // The region's word is the tenant's: a figure past any real TTL saturates.
                .map(|s| Duration::from_secs_f64(s.min(u64::MAX as f64 / 1e9)));
            limited.then_some(Observed {
                container: id,
                calls,
                bytes,
                ttl,
                waits,
                gpus,
            })
        })
        .collect()
}

/// The containers whose freeze gives back memory where `wait` waits: those holding memory on a
/// GPU the waiting process uses. Where NVML does not say (no NVML, or no figure for the waiter or
/// for a container), any container may (`None`, or that container included).
fn near(observed: &[Observed], wait: &Wait) -> Option<Vec<String>> {
    (!wait.gpus.is_empty()).then(|| {
        observed
            .iter()
            .filter(|c| c.gpus.is_empty() || !c.gpus.is_disjoint(&wait.gpus))
            .map(|c| c.container.clone())
            .collect()
    })
}

/// Marks the snapshot's containers that are in `frozen` (container ids), beside those the
/// collector found marked in their control blocks, with the device bytes the limiter counts for
/// their alive processes: what they hold in host memory.
pub fn mark_frozen(snap: &mut crate::model::Snapshot, frozen: &std::collections::HashSet<String>) {
    snap.mark_frozen(|c| {
        c.frozen.is_some()
            || c.container_id
                .as_ref()
                .is_some_and(|id| frozen.contains(id))
    });
}

/// Says in the snapshot's agent status that idle containers are frozen after `settings.after`,
/// and what of the host budget is reserved now.
pub fn mark_idle_freeze(snap: &mut crate::model::Snapshot, settings: &IdleFreeze, reserved: u64) {
    snap.agent.idle_freeze = Some(crate::model::IdleFreezeStatus {
        after_seconds: settings.after.map(|d| d.as_secs_f64()),
        host_budget_bytes: settings.host_budget,
        host_reserved_bytes: reserved,
        on_demand_seconds: settings.on_demand.map(|d| d.as_secs_f64()),
    });
}

/// The idle freeze's state.
struct Idle {
    freezer: Freezer<String>,
    snapshots: Receiver<Vec<Observed>>,
    started: Instant,
    /// The containers the last snapshot showed.
    known: std::collections::HashSet<String>,
}

/// A region of a frozen container.
struct Watched {
    container: String,
    control: TenantFile,
    reader: RegionReader,
}

/// The watcher's state between ticks.
pub struct ThawWatch {
    proc: PathBuf,
    frozen: Vec<Watched>,
    next_scan: Instant,
    /// The last failed thaw of each container.
    failed: HashMap<String, FailedThaw>,
    /// The containers whose last freeze was refused because the driver could not restore their
    /// processes (memory from `cuMemCreate`), each with the device bytes it held then: while it
    /// holds as many, a freeze decided for it fails at once, without a worker (an idle
    /// container's bytes do not move: any allocation or free is a CUDA call).
    refused: HashMap<String, u64>,
    idle: Option<Idle>,
    /// The containers marked frozen, as the last scan and thaws left them (for the model).
    shown: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Host bytes the idle freeze holds reserved after its last tick (for the model).
    reserved: Arc<AtomicU64>,
    /// How the workers reach containers and the driver.
    reach: Arc<Reach>,
    /// The work waiting for a worker, in order.
    queue: VecDeque<(String, Job)>,
    /// The containers with work queued or under way (one at a time each).
    busy: HashSet<String>,
    /// Workers under way, and how many of them freeze.
    running: usize,
    freezing: usize,
    /// The workers' reports.
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
}

impl ThawWatch {
    /// A watcher of the processes under `proc`, thawing through the driver library `libcuda`
    /// (loaded at the first thaw that needs it).
    pub fn new(proc: PathBuf, libcuda: PathBuf) -> ThawWatch {
        let nvml = SharedNvml::default();
        let (proc_of_find, proc_of_pids, proc_of_api) = (proc.clone(), proc.clone(), proc.clone());
        let (done_tx, done_rx) = mpsc::channel();
        ThawWatch {
            proc,
            frozen: Vec::new(),
            next_scan: Instant::now(),
            failed: HashMap::new(),
            refused: HashMap::new(),
            idle: None,
            shown: Arc::default(),
            reserved: Arc::default(),
            reach: Arc::new(Reach {
                find: Box::new(move |id| {
                    freeze::Container::find(&proc_of_find, id, nvml.measure())
                }),
                pids: Box::new(move |id| {
                    freeze::pids(&freeze::Target::Container(id.to_owned()), &proc_of_pids)
                }),
                load: Box::new(move || {
                    Ok(Arc::new(room::open(&libcuda, &proc_of_api)?) as Arc<dyn DaemonApi>)
                }),
                api: Mutex::new(None),
            }),
            queue: VecDeque::new(),
            busy: HashSet::new(),
            running: 0,
            freezing: 0,
            done_tx,
            done_rx,
        }
    }

    /// The workers' means, before any work.
    #[cfg(test)]
    fn reach_mut(&mut self) -> &mut Reach {
        Arc::get_mut(&mut self.reach).expect("no worker has started")
    }

    /// Finds containers with `find` instead of under `proc`.
    #[cfg(test)]
    fn with_find(
        mut self,
        find: impl Fn(&str) -> Result<Option<freeze::Container>, limit::LimitError>
        + Send
        + Sync
        + 'static,
    ) -> ThawWatch {
        self.reach_mut().find = Box::new(find);
        self
    }

    /// Lists containers' processes with `pids` instead of under `proc`.
    #[cfg(test)]
    fn with_pids(
        mut self,
        pids: impl Fn(&str) -> Result<Vec<u32>, FreezeError> + Send + Sync + 'static,
    ) -> ThawWatch {
        self.reach_mut().pids = Box::new(pids);
        self
    }

    /// Loads the checkpoint API with `load` instead of from `libcuda`.
    #[cfg(test)]
    fn with_api(
        mut self,
        load: impl Fn() -> Result<Arc<dyn DaemonApi>, CheckpointError> + Send + Sync + 'static,
    ) -> ThawWatch {
        self.reach_mut().load = Box::new(load);
        self
    }

    /// Host bytes the idle freeze holds reserved, kept up to date by the watcher.
    pub fn host_reserved(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.reserved)
    }

    /// The containers marked frozen, kept up to date by the watcher.
    pub fn frozen_containers(&self) -> Arc<Mutex<std::collections::HashSet<String>>> {
        Arc::clone(&self.shown)
    }

    /// Publishes the containers watched now.
    fn show(&self) {
        let now = self.frozen.iter().map(|w| w.container.clone()).collect();
        // A poisoned lock (a panic while publishing) still holds a set to replace.
        *self.shown.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// Also freezes idle containers, as `settings` say, from the containers each snapshot
    /// sent on `snapshots` shows.
    pub fn with_idle_freeze(
        mut self,
        settings: IdleFreeze,
        snapshots: Receiver<Vec<Observed>>,
    ) -> ThawWatch {
        self.idle = Some(Idle {
            freezer: Freezer::new(
                settings.after.map(|d| d.as_nanos() as u64),
                settings.host_budget,
            )
            .with_on_demand(
                settings
                    .on_demand
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            ),
            snapshots,
            started: Instant::now(),
            known: Default::default(),
        });
        self
    }

    /// Runs until the daemon stops (work under way is left to its workers).
    pub fn run(mut self) {
        while !crate::signals::stop_requested() {
            self.tick();
            crate::signals::sleep(if self.frozen.is_empty() && self.busy.is_empty() {
                IDLE_POLL
            } else {
                POLL
            });
        }
    }

    /// One look: the workers' reports, the idle freeze's decisions on the latest snapshot, a
    /// scan if one is due, then every frozen container's request; the work queued started on
    /// the workers free; then what the idle freeze holds, for the model.
    fn tick(&mut self) {
        self.reports();
        self.idle_freeze();
        self.tick_frozen();
        self.start();
        if let Some(idle) = &self.idle {
            // Relaxed: a figure for the model, read on its own.
            self.reserved.store(idle.freezer.held(), Ordering::Relaxed);
        }
    }

    /// Queues `job` for `container`, unless it has work queued or under way (`false`).
    fn enqueue(&mut self, container: &str, job: Job) -> bool {
        if !self.busy.insert(container.to_owned()) {
            return false;
        }
        self.queue.push_back((container.to_owned(), job));
        true
    }

    /// Starts the work queued on the workers free: thaws first, and freezes on all workers but
    /// one, so that freezes under way (however long their processes take to answer) never keep
    /// a thaw from a worker.
    fn start(&mut self) {
        while self.running < MAX_WORKERS {
            let thaw = self
                .queue
                .iter()
                .position(|(_, j)| !matches!(j, Job::Freeze { .. }));
            let next = thaw.or_else(|| {
                (self.freezing + 1 < MAX_WORKERS)
                    .then(|| {
                        self.queue
                            .iter()
                            .position(|(_, j)| matches!(j, Job::Freeze { .. }))
                    })
                    .flatten()
            });
            let Some((container, job)) = next.and_then(|i| self.queue.remove(i)) else {
                return;
            };
            let (reach, tx) = (Arc::clone(&self.reach), self.done_tx.clone());
            let (c, j) = (container.clone(), job.clone());
            let spawned = std::thread::Builder::new()
                .name("freeze-work".into())
                .spawn(move || {
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| match &j {
                        Job::Freeze { .. } => reach.freeze(&c),
                        Job::Asked { .. } | Job::Called => reach.thaw(&c),
                    }))
                    .unwrap_or(Err(FreezeError::Panicked));
                    // The watcher gone (the daemon stopping) has nothing to learn.
                    let _ = tx.send(Done {
                        container: c,
                        job: j,
                        outcome,
                    });
                });
            match spawned {
                Ok(_) => {
                    self.running += 1;
                    if matches!(job, Job::Freeze { .. }) {
                        self.freezing += 1;
                    }
                }
                Err(e) => {
                    // No thread now: tried again at the next tick.
                    log::warn!(
                        "container {container}: no worker thread for its freeze or thaw: {e}"
                    );
                    self.queue.push_front((container, job));
                    return;
                }
            }
        }
    }

    /// Takes in the workers' reports.
    fn reports(&mut self) {
        while let Ok(Done {
            container,
            job,
            outcome,
        }) = self.done_rx.try_recv()
        {
            self.busy.remove(&container);
            self.running -= 1;
            match job {
                Job::Freeze { why } => {
                    self.freezing -= 1;
                    self.frozen_by_worker(&container, &why, outcome);
                }
                Job::Asked { generation } => self.thawed_at_request(container, generation, outcome),
                Job::Called => {
                    if let Some(idle) = &mut self.idle {
                        idle.freezer.thaw_done(&container, outcome.is_ok());
                    }
                    match outcome {
                        Ok(lines) => {
                            log::info!(
                                "container {container}: thawed, its processes made CUDA calls ({})",
                                lines.join("; ")
                            );
                            self.frozen.retain(|w| w.container != container);
                            self.show();
                        }
                        Err(e) => log::warn!("container {container}: thaw failed: {e}"),
                    }
                }
            }
        }
    }

    /// A scan if one is due, then every frozen container's request (queued for a worker).
    fn tick_frozen(&mut self) {
        if Instant::now() >= self.next_scan {
            self.scan();
            self.next_scan = Instant::now() + SCAN_PERIOD;
        }
        for i in 0..self.frozen.len() {
            let w = &self.frozen[i];
            if self.busy.contains(&w.container) {
                continue;
            }
            let Some(generation) = requested(w) else {
                continue;
            };
            if let Some(f) = self.failed.get(&w.container)
                && f.generation == generation
                && f.at.elapsed() < RETRY_PERIOD
            {
                continue;
            }
            let container = w.container.clone();
            if let Some(idle) = &mut self.idle {
                idle.freezer.begin_thaw(&container);
            }
            self.enqueue(&container, Job::Asked { generation });
        }
    }

    /// A thaw asked for (naming `generation`) is done.
    fn thawed_at_request(
        &mut self,
        container: String,
        generation: u64,
        outcome: Result<Vec<String>, FreezeError>,
    ) {
        if let Some(idle) = &mut self.idle {
            idle.freezer.thaw_done(&container, outcome.is_ok());
        }
        match outcome {
            Ok(lines) => {
                log::info!(
                    "container {container}: thawed at its next CUDA call ({})",
                    lines.join("; ")
                );
                self.failed.remove(&container);
                self.frozen.retain(|w| w.container != container);
                self.show();
            }
            Err(e) => {
                let message = e.to_string();
                let now = Instant::now();
                let last = self.failed.get(&container);
                let (logged, logged_at) = match last {
                    Some(f) if !FailedThaw::should_log(last, &message, now) => {
                        (f.logged.clone(), f.logged_at)
                    }
                    _ => {
                        log::warn!(
                            "container {container}: thaw at its next CUDA call failed: {message} \
                             (tried again every second; the same failure is logged again after {} s)",
                            REPEAT_LOG_PERIOD.as_secs()
                        );
                        (message, now)
                    }
                };
                self.failed.insert(
                    container,
                    FailedThaw {
                        generation,
                        at: now,
                        logged,
                        logged_at,
                    },
                );
            }
        }
    }

    /// Feeds the snapshots that came to the freezer and carries out its steps.
    fn idle_freeze(&mut self) {
        let Some(idle) = &mut self.idle else { return };
        let Some(latest) = idle.snapshots.try_iter().last() else {
            return;
        };
        let now = idle.started.elapsed().as_nanos() as u64;
        let mut steps = Vec::new();
        for o in &latest {
            let activity = Activity {
                calls: o.calls,
                gpu_busy: false,
            };
            steps.extend(
                idle.freezer
                    .observe(o.container.clone(), activity, o.bytes, now),
            );
            idle.freezer.set_own_ttl(
                &o.container,
                o.ttl
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            );
        }
        // A container no snapshot shows any more is gone: what it held is returned.
        let now_known: std::collections::HashSet<String> =
            latest.iter().map(|o| o.container.clone()).collect();
        for gone in idle.known.difference(&now_known) {
            idle.freezer.gone(gone);
            self.refused.remove(gone);
        }
        idle.known = now_known;
        // Each wait is told apart by its process and the process's number for it.
        let demands: Vec<Demand<String>> = latest
            .iter()
            .flat_map(|o| {
                o.waits.iter().map(|w| Demand {
                    waiter: o.container.clone(),
                    wait: u64::from(w.pid) << 32 ^ w.wait,
                    bytes: w.bytes,
                    near: near(&latest, w),
                })
            })
            .collect();
        let on_demand = idle.freezer.on_demand(&demands, now, |a, b| a.cmp(b));
        // For the log: the waits it was frozen for (a few; the rest counted).
        let waits: Vec<String> = latest
            .iter()
            .flat_map(|o| {
                o.waits.iter().map(|w| {
                    format!(
                        "container {} waits for {} bytes on device {}",
                        o.container, w.bytes, w.device
                    )
                })
            })
            .collect();
        let shown = waits.len().min(4);
        let mut why = format!("idle, for memory: {}", waits[..shown].join(", "));
        if waits.len() > shown {
            why += &format!(" and {} more", waits.len() - shown);
        }
        let for_memory: std::collections::HashSet<String> = on_demand
            .iter()
            .filter_map(|s| match s {
                Step::Freeze(c) => Some(c.clone()),
                Step::Thaw(_) => None,
            })
            .collect();
        steps.extend(on_demand);
        steps.extend(idle.freezer.due(now, |a, b| a.cmp(b)));
        for step in steps {
            match step {
                Step::Freeze(c) if self.refused_again(&c) => {
                    // Its freeze was refused holding these bytes: failed again, said before.
                    log::debug!("container {c}: not frozen again (refused before)");
                    if let Some(idle) = &mut self.idle {
                        idle.freezer.freeze_done(&c, None);
                    }
                }
                Step::Freeze(c) => {
                    let why = if for_memory.contains(&c) {
                        why.clone()
                    } else {
                        "idle".to_owned()
                    };
                    // A container with a thaw under way runs on: its reservation returned.
                    if !self.enqueue(&c, Job::Freeze { why })
                        && let Some(idle) = &mut self.idle
                    {
                        idle.freezer.freeze_done(&c, None);
                    }
                }
                Step::Thaw(c) => {
                    if !self.enqueue(&c, Job::Called)
                        && let Some(idle) = &mut self.idle
                    {
                        idle.freezer.thaw_done(&c, false);
                    }
                }
            }
        }
    }

    /// Whether `container`'s freeze was refused before while it held the bytes the freezer
    /// reserved for it now (see [`ThawWatch::refused`]).
    fn refused_again(&self, container: &str) -> bool {
        let Some(idle) = &self.idle else {
            return false;
        };
        idle.freezer
            .container(&container.to_owned())
            .is_some_and(|c| self.refused.get(container) == Some(&c.bytes))
    }

    /// A freeze the freezer decided (its bytes reserved already) is done: the bytes stay
    /// reserved while any process is frozen, and go back to the budget otherwise. A refusal
    /// (the driver could not restore the container's processes) is logged once per container,
    /// and not tried again while the container holds the same bytes.
    fn frozen_by_worker(
        &mut self,
        container: &str,
        why: &str,
        outcome: Result<Vec<String>, FreezeError>,
    ) {
        let reserved = self.idle.as_ref().and_then(|idle| {
            idle.freezer
                .container(&container.to_owned())
                .map(|c| c.bytes)
        });
        match &outcome {
            Err(e) if e.refused() => {
                let first = self
                    .refused
                    .insert(container.to_owned(), reserved.unwrap_or(0))
                    .is_none();
                if first {
                    log::warn!(
                        "{e} (freeze: {why}; not tried again while the container holds the same \
                         device memory; said once)"
                    );
                } else {
                    log::debug!("{e} (freeze: {why})");
                }
            }
            _ => {
                self.refused.remove(container);
            }
        }
        let saved = match &outcome {
            Ok(lines) => {
                log::info!(
                    "container {container}: frozen, {why} ({})",
                    lines.join("; ")
                );
                true
            }
            Err(e) if e.partly_done() => {
                log::warn!("container {container}: partly frozen, {why}: {e}");
                true
            }
            Err(e) if e.refused() => false,
            Err(e) => {
                log::warn!("container {container}: freeze ({why}) failed: {e}");
                false
            }
        };
        if let Some(idle) = &mut self.idle {
            idle.freezer.freeze_done(
                &container.to_owned(),
                saved.then_some(reserved.unwrap_or(0)),
            );
        }
        // The mark is there from now: the next scan watches it.
        self.next_scan = Instant::now();
    }

    /// Finds the regions whose control block marks their container frozen.
    fn scan(&mut self) {
        // Records of frozen processes that were killed go with them.
        if let Some(api) = self.reach.loaded() {
            api.prune();
        }
        self.frozen = limit::container_regions(&self.proc, |_| true)
            .into_iter()
            .filter_map(|(container, region)| {
                let control = region.open_control(Access::Read).ok()?;
                let snap = read_control(&control).ok()??;
                if !frozen(snap.settings.freeze) {
                    return None;
                }
                let reader = RegionReader::from_file(region.open_region().ok()?).ok()?;
                Some(Watched {
                    container,
                    control,
                    reader,
                })
            })
            .collect();
        let frozen: Vec<&String> = self.frozen.iter().map(|w| &w.container).collect();
        self.failed.retain(|c, _| frozen.contains(&c));
        self.show();
    }
}

/// Whether a mark says the container is frozen (through the driver or in-process): its next
/// CUDA call asks for the thaw.
fn frozen(mark: FreezeMark) -> bool {
    matches!(mark, FreezeMark::Frozen | FreezeMark::InProcess)
}

/// The generation the region's thaw request names, if it is the one marking the container
/// frozen now.
fn requested(w: &Watched) -> Option<u64> {
    let snap = read_control(&w.control).ok()??;
    if !frozen(snap.settings.freeze) {
        return None;
    }
    let request = w.reader.thaw_request().ok()?;
    (request == snap.generation).then_some(snap.generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use region::{ControlReader, ControlWriter, Region, RegionConfig, control_path};

    /// Ticks `watch` until the work it takes on is done (`false`: not within `within`).
    fn settle(watch: &mut ThawWatch, within: Duration) -> bool {
        tick_until(watch, within, |w| w.busy.is_empty())
    }

    /// Ticks `watch` until `done` says so (`false`: not within `within`).
    fn tick_until(
        watch: &mut ThawWatch,
        within: Duration,
        done: impl Fn(&ThawWatch) -> bool,
    ) -> bool {
        let deadline = Instant::now() + within;
        loop {
            watch.tick();
            if done(watch) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A container's TTL is the shortest its regions ask for; what a tenant writes there that is
    /// no TTL (not a number, not positive) is ignored, and a figure past any real TTL saturates.
    #[test]
    fn a_containers_ttl_is_the_shortest_its_regions_ask_for_and_bounded() {
        let mut snap = crate::tui::fixture::snapshot();
        let seen = observed(&snap);
        let i = snap
            .containers
            .iter()
            .position(|c| {
                !c.regions.is_empty()
                    && seen
                        .iter()
                        .any(|o| Some(&o.container) == c.container_id.as_ref())
            })
            .expect("a container with a region and a process under the limiter");
        let id = snap.containers[i].container_id.clone().unwrap();
        let ttl = |snap: &crate::model::Snapshot| {
            observed(snap)
                .into_iter()
                .find(|o| o.container == id)
                .unwrap()
                .ttl
        };
        assert_eq!(ttl(&snap), None, "a container that does not ask");
        let template = snap.containers[i].regions[0].clone();
        snap.containers[i].regions = [f64::NAN, -1.0, 0.0, 1e300, 5.0, f64::INFINITY]
            .into_iter()
            .map(|s| crate::model::RegionInfo {
                freeze_after_seconds: Some(s),
                ..template.clone()
            })
            .collect();
        assert_eq!(ttl(&snap), Some(Duration::from_secs(5)));
        snap.containers[i].regions.truncate(4);
        assert!(ttl(&snap).unwrap() > Duration::from_secs(500 * 365 * 24 * 3600));
    }

    /// A slot's wait for device memory (the tenant's words, any value) reaches the freezer as
    /// the container's, from its live processes only; an exited process's slot asks nothing.
    #[test]
    fn a_slots_wait_reaches_the_freezer_only_from_a_live_process() {
        let mut snap = crate::tui::fixture::snapshot();
        let seen = observed(&snap);
        let o = seen.first().expect("a container under the limiter");
        assert!(seen.iter().all(|o| o.waits.is_empty()), "no one waits");
        let id = o.container.clone();
        let c = snap
            .containers
            .iter()
            .find(|c| c.container_id.as_ref() == Some(&id))
            .unwrap();
        let key = c.processes[0];
        let p = snap.processes.iter_mut().find(|p| p.key == key).unwrap();
        let hostile = crate::model::WaitingForMemory {
            device: u64::MAX,
            bytes: u64::MAX,
            wait: 7,
        };
        p.limiter.as_mut().unwrap().waiting_for_memory = Some(hostile);
        let waits = |snap: &crate::model::Snapshot| {
            observed(snap)
                .into_iter()
                .find(|o| o.container == id)
                .map(|o| o.waits)
                .unwrap_or_default()
        };
        assert_eq!(
            waits(&snap),
            [Wait {
                pid: key.pid,
                wait: 7,
                device: u64::MAX,
                bytes: u64::MAX,
                gpus: snap
                    .processes
                    .iter()
                    .find(|p| p.key == key)
                    .unwrap()
                    .nvml
                    .iter()
                    .map(|n| n.device)
                    .collect(),
            }]
        );
        // The freezer takes it as a claim that can freeze only containers idle for the time.
        let mut f = Freezer::new(None, 1 << 40).with_on_demand(Some(1));
        f.observe(
            "idle".to_owned(),
            Activity {
                calls: 0,
                gpu_busy: false,
            },
            1 << 20,
            0,
        );
        f.observe(
            id.clone(),
            Activity {
                calls: 0,
                gpu_busy: false,
            },
            1 << 20,
            0,
        );
        let demands = [Demand {
            waiter: id.clone(),
            wait: 7,
            bytes: u64::MAX,
            near: None,
        }];
        assert_eq!(
            f.on_demand(&demands, 10, |a, b| a.cmp(b)),
            [Step::Freeze("idle".to_owned())]
        );
        snap.processes
            .iter_mut()
            .find(|p| p.key == key)
            .unwrap()
            .alive = false;
        assert!(
            waits(&snap).is_empty(),
            "an exited process waits for nothing"
        );
    }

    /// A thaw failing the same way every second is logged once a minute; a new failure at once.
    #[test]
    fn a_thaw_failing_again_the_same_way_is_logged_once_a_minute() {
        let t0 = Instant::now();
        assert!(FailedThaw::should_log(None, "no room", t0));
        let last = FailedThaw {
            generation: 1,
            at: t0,
            logged: "no room".into(),
            logged_at: t0,
        };
        assert!(!FailedThaw::should_log(
            Some(&last),
            "no room",
            t0 + Duration::from_secs(59)
        ));
        assert!(FailedThaw::should_log(
            Some(&last),
            "no room",
            t0 + REPEAT_LOG_PERIOD
        ));
        assert!(FailedThaw::should_log(
            Some(&last),
            "error 304",
            t0 + Duration::from_secs(1)
        ));
    }

    /// A wait on GPU 1 gets only containers holding memory on GPU 1 frozen (and those NVML says
    /// nothing of); without NVML figures for the waiter, any container.
    #[test]
    fn a_wait_is_answered_from_the_containers_on_its_gpu() {
        let container = |name: &str, gpus: &[u32]| Observed {
            container: name.into(),
            calls: 0,
            bytes: 1 << 30,
            ttl: None,
            waits: Vec::new(),
            gpus: gpus.iter().copied().collect(),
        };
        let observed = [
            container("on-0", &[0]),
            container("on-1", &[1]),
            container("on-0-and-1", &[0, 1]),
            container("unknown", &[]),
        ];
        let wait = |gpus: &[u32]| Wait {
            pid: 1,
            wait: 1,
            device: 0,
            bytes: 1 << 30,
            gpus: gpus.iter().copied().collect(),
        };
        assert_eq!(
            near(&observed, &wait(&[1])).unwrap(),
            ["on-1", "on-0-and-1", "unknown"]
        );
        assert_eq!(near(&observed, &wait(&[])), None);
    }

    /// A container frozen in-process asks for its thaw as one frozen by the driver does (its
    /// first call thawed its own process and stored the mark's generation): the daemon thaws it
    /// by the running mark, which every process answers, without loading the driver's
    /// checkpoint API (the limiter's own thaw waits for room, not the daemon); a request
    /// naming another generation asks for nothing.
    #[test]
    fn a_container_frozen_in_process_is_thawed_at_its_request_without_the_checkpoint_api() {
        use crate::{
            checkpoint::CheckpointError,
            freeze::testing::{Acts, Tenant},
        };
        use region::{OwnFreeze, OwnFreezeState};
        let t = Tenant::new(&[Acts::Freezes, Acts::Freezes]);
        let proc = tempfile::tempdir().unwrap();
        let mut watch = ThawWatch::new(
            proc.path().to_owned(),
            PathBuf::from("/nonexistent/libcuda.so.1"),
        )
        .with_find(t.finder(Duration::from_secs(30)));
        let no_driver = || Err::<&room::Checked, _>(CheckpointError::Missing("in this test"));
        t.answering(|| {
            t.container(Duration::from_secs(30))
                .freeze(no_driver, &t.pids(), IDLE_LOCK_TIMEOUT)
                .unwrap()
        });
        let (mark, frozen) = t.mark();
        assert_eq!(mark, FreezeMark::InProcess);
        let watched = || Watched {
            container: "c".into(),
            control: tenant_fs::open_no_links(&control_path(&t.path), Access::Read).unwrap(),
            reader: RegionReader::open(&t.path).unwrap(),
        };
        assert_eq!(requested(&watched()), None, "no request yet");
        t.region.request_thaw(frozen - 2);
        assert_eq!(requested(&watched()), None, "an older generation");
        // The first process's next call: it thaws itself and asks for the container's thaw.
        t.region.publish_own_freeze(
            &t.slots[0],
            OwnFreeze {
                state: OwnFreezeState::Running,
                generation: frozen,
            },
            1 << 30,
        );
        t.region.request_thaw(frozen);
        assert_eq!(requested(&watched()), Some(frozen));

        watch.frozen = vec![watched()];
        watch.next_scan = Instant::now() + Duration::from_secs(3600);
        t.answering(|| assert!(settle(&mut watch, Duration::from_secs(10))));
        let (mark, running) = t.mark();
        assert_eq!((mark, running), (FreezeMark::Running, frozen + 2));
        for i in 0..2 {
            let own = t.said(i).unwrap().state;
            assert_eq!(own.state, OwnFreezeState::Running, "process {i}");
            assert!(
                own.answers(running),
                "process {i} answered the running mark"
            );
        }
        assert!(watch.frozen.is_empty(), "thawed");
        assert!(watch.failed.is_empty(), "nothing failed");
        assert!(
            watch.reach.loaded().is_none(),
            "the checkpoint API was never loaded"
        );
        assert_eq!(requested(&watched()), None, "nothing more to thaw");
    }

    /// The driver's checkpoint API, faked: no process can be locked (each lock times out).
    struct NoLock;

    impl CheckpointApi for NoLock {
        fn lock(&self, pid: u32, _: Duration) -> Result<(), CheckpointError> {
            Err(CheckpointError::Call {
                call: "cuCheckpointProcessLock",
                pid,
                code: 909,
            })
        }
        fn checkpoint(&self, _: u32) -> Result<(), CheckpointError> {
            Ok(())
        }
        fn restore(&self, _: u32) -> Result<(), CheckpointError> {
            Ok(())
        }
        fn unlock(&self, _: u32) -> Result<(), CheckpointError> {
            Ok(())
        }
        fn state(&self, _: u32) -> Result<crate::checkpoint::ProcessState, CheckpointError> {
            Ok(crate::checkpoint::ProcessState::Running)
        }
    }

    impl DaemonApi for NoLock {}

    /// A container as a snapshot shows it: idle, holding `bytes`.
    fn idle(container: &str, bytes: u64) -> Observed {
        Observed {
            container: container.into(),
            calls: 0,
            bytes,
            ttl: None,
            waits: Vec::new(),
            gpus: Default::default(),
        }
    }

    /// A watcher of no host process that freezes every container idle at its first look, its
    /// driver's locks all timing out; the snapshots go to the sender.
    fn watcher() -> (ThawWatch, mpsc::Sender<Vec<Observed>>) {
        let (tx, rx) = mpsc::channel();
        let settings = IdleFreeze {
            after: Some(Duration::ZERO),
            host_budget: 1 << 40,
            on_demand: None,
        };
        let watch = ThawWatch::new(
            PathBuf::from("/nonexistent/proc"),
            PathBuf::from("/nonexistent/libcuda.so.1"),
        )
        .with_api(|| Ok(Arc::new(NoLock) as Arc<dyn DaemonApi>))
        .with_idle_freeze(settings, rx);
        (watch, tx)
    }

    /// The region of the tenant `t`, watched as the container `id`'s.
    fn watched(t: &crate::freeze::testing::Tenant, id: &str) -> Watched {
        Watched {
            container: id.into(),
            control: tenant_fs::open_no_links(&control_path(&t.path), Access::Read).unwrap(),
            reader: RegionReader::open(&t.path).unwrap(),
        }
    }

    /// A freeze waiting for processes that never answer runs on its own worker: another
    /// container's thaw request is answered within a short bound while that freeze still waits
    /// (on one thread, it would wait the freeze's 3 s); the freeze then falls back to the
    /// driver, which freezes nothing, and its reservation is returned.
    #[test]
    fn a_freeze_waiting_on_silent_processes_does_not_delay_another_containers_thaw() {
        use crate::freeze::testing::{Acts, Tenant};
        use region::{OwnFreeze, OwnFreezeState};
        let a = Tenant::new(&[Acts::Silent]);
        let b = Tenant::new(&[Acts::Freezes, Acts::Freezes]);
        let no_driver = || Err::<&NoLock, _>(CheckpointError::Missing("in this test"));
        b.answering(|| {
            b.container(Duration::from_secs(30))
                .freeze(no_driver, &b.pids(), IDLE_LOCK_TIMEOUT)
                .unwrap()
        });
        // b's first process's next call: it thaws itself and asks for the container's thaw.
        let (_, frozen) = b.mark();
        let running = OwnFreeze {
            state: OwnFreezeState::Running,
            generation: frozen,
        };
        b.region.publish_own_freeze(&b.slots[0], running, 1 << 30);
        b.region.request_thaw(frozen);

        let (find_a, find_b) = (
            a.finder(Duration::from_secs(3)),
            b.finder(Duration::from_secs(30)),
        );
        let (watch, snapshots) = watcher();
        let mut watch = watch
            .with_find(move |id| if id == "a" { find_a(id) } else { find_b(id) })
            .with_pids(|_| Ok(vec![1000]));
        snapshots.send(vec![idle("a", 1 << 30)]).unwrap();
        watch.frozen = vec![watched(&b, "b")];
        watch.next_scan = Instant::now() + Duration::from_secs(3600);
        let started = Instant::now();
        b.answering(|| {
            assert!(tick_until(&mut watch, Duration::from_secs(10), |w| {
                !w.busy.contains("b")
            }))
        });
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "b thawed after {took:?}");
        assert_eq!(b.mark().0, FreezeMark::Running, "b thawed");
        assert!(watch.frozen.is_empty());
        assert!(watch.busy.contains("a"), "a's freeze still waits");
        assert_eq!(a.mark().0, FreezeMark::InProcess);

        assert!(settle(&mut watch, Duration::from_secs(10)));
        assert_eq!(a.mark().0, FreezeMark::Running, "nothing frozen");
        let freezer = &watch.idle.as_ref().unwrap().freezer;
        assert_eq!(freezer.held(), 0, "a's reservation returned");
        assert_eq!(
            freezer.container(&"a".to_owned()).unwrap().phase,
            limiter_core::freeze::Phase::Running
        );
    }

    /// At most [`MAX_WORKERS`] freezes and thaws run at once, one per container; freezes
    /// leave a worker to thaws, and a thaw queued goes before the freezes queued.
    #[test]
    fn the_workers_are_bounded_and_a_thaw_always_finds_one() {
        use crate::freeze::testing::{Acts, Tenant};
        let silent = Tenant::new(&[Acts::Silent]);
        let other = Tenant::new(&[Acts::Off]);
        let (find, find_other) = (
            silent.finder(Duration::from_secs(2)),
            other.finder(Duration::from_secs(2)),
        );
        let (watch, snapshots) = watcher();
        let mut watch = watch
            .with_find(move |id| {
                if id == "other" {
                    find_other(id)
                } else {
                    find(id)
                }
            })
            .with_pids(|_| Ok(vec![1000]));
        let names: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
        snapshots
            .send(names.iter().map(|n| idle(n, 1 << 20)).collect())
            .unwrap();
        watch.tick();
        assert_eq!(watch.running, MAX_WORKERS - 1, "freezes leave one worker");
        assert_eq!(watch.queue.len(), 6 - (MAX_WORKERS - 1));
        assert!(watch.busy.len() == 6);
        // A second job for a container with one queued or under way is refused.
        assert!(!watch.enqueue("c0", Job::Called));
        assert!(!watch.enqueue("c5", Job::Called));
        // A thaw goes first, on the worker left.
        assert!(watch.enqueue("other", Job::Called));
        watch.start();
        assert_eq!(watch.running, MAX_WORKERS);
        assert!(
            watch
                .queue
                .iter()
                .all(|(_, j)| matches!(j, Job::Freeze { .. }))
        );
        assert!(settle(&mut watch, Duration::from_secs(30)));
        assert_eq!(watch.running, 0);
        assert_eq!(watch.idle.as_ref().unwrap().freezer.held(), 0);
    }

    /// An idle freeze through the driver that froze no process (none could be locked) is a
    /// failure: its reservation is returned and the container runs on, unmarked; it is no
    /// partial freeze.
    #[test]
    fn an_idle_freeze_that_froze_no_process_returns_its_reservation() {
        use crate::freeze::testing::{Acts, Tenant};
        let t = Tenant::new(&[Acts::Off, Acts::Off]);
        let pids = t.pids();
        let (watch, snapshots) = watcher();
        let mut watch = watch
            .with_find(t.finder(Duration::from_secs(1)))
            .with_pids(move |_| Ok(pids.clone()));
        snapshots.send(vec![idle("c", 1 << 30)]).unwrap();
        watch.tick();
        assert_eq!(
            watch.idle.as_ref().unwrap().freezer.held(),
            1 << 30,
            "reserved while it runs"
        );
        assert!(settle(&mut watch, Duration::from_secs(10)));
        let freezer = &watch.idle.as_ref().unwrap().freezer;
        assert_eq!(freezer.held(), 0, "returned");
        assert_eq!(
            freezer.container(&"c".to_owned()).unwrap().phase,
            limiter_core::freeze::Phase::Running
        );
        assert_eq!(t.mark().0, FreezeMark::Running);
    }

    /// The log records of this test binary (every thread's), kept from the first call on.
    fn captured() -> &'static Mutex<Vec<(log::Level, String)>> {
        static LOG: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());
        struct Capture;
        impl log::Log for Capture {
            fn enabled(&self, _: &log::Metadata) -> bool {
                true
            }
            fn log(&self, record: &log::Record) {
                let line = (record.level(), record.args().to_string());
                LOG.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
            fn flush(&self) {}
        }
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            if log::set_logger(&Capture).is_ok() {
                log::set_max_level(log::LevelFilter::Debug);
            }
        });
        &LOG
    }

    /// An idle container whose process holds its memory from `cuMemCreate` (JAX's default
    /// allocator) is refused (the driver's restore of it would fail): the freezer sees a failed
    /// freeze (its reservation returned, the container running), the refusal is logged once, and
    /// while the container holds the same bytes it is not tried again, however often the freezer
    /// decides it (here at every snapshot); holding other bytes, it is tried again, and a
    /// second refusal is not logged as a warning again.
    #[test]
    fn a_container_refused_for_memory_from_cu_mem_create_is_not_retried_at_every_tick() {
        use crate::freeze::testing::{Acts, Tenant};
        use std::sync::atomic::AtomicUsize;
        let log = captured();
        const GIB: u64 = 1 << 30;
        let id = "refused-cu-mem-create";
        let t = Tenant::new(&[Acts::Off]);
        t.holds(0, GIB, GIB);
        let finds = Arc::new(AtomicUsize::new(0));
        let (find, counted) = (t.finder(Duration::from_secs(1)), Arc::clone(&finds));
        let (watch, snapshots) = watcher();
        let mut watch = watch
            .with_find(move |c| {
                counted.fetch_add(1, Ordering::SeqCst);
                find(c)
            })
            .with_pids(|_| Ok(vec![1000]));
        for _ in 0..5 {
            snapshots.send(vec![idle(id, GIB)]).unwrap();
            assert!(settle(&mut watch, Duration::from_secs(10)));
            let freezer = &watch.idle.as_ref().unwrap().freezer;
            assert_eq!(freezer.held(), 0, "its reservation returned");
            assert_eq!(
                freezer.container(&id.to_owned()).unwrap().phase,
                limiter_core::freeze::Phase::Running
            );
        }
        assert_eq!(finds.load(Ordering::SeqCst), 1, "tried once in 5 snapshots");
        assert!(
            watch.reach.loaded().is_none(),
            "the checkpoint API never loaded"
        );
        assert!(!t.marked(), "nothing marked");
        let warnings = || {
            log.lock()
                .unwrap()
                .iter()
                .filter(|(l, m)| *l <= log::Level::Warn && m.contains(id))
                .map(|(_, m)| m.clone())
                .collect::<Vec<String>>()
        };
        let said = warnings();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with(&format!(
                "container {id}: not frozen: pid 1000 holds 1.00 GiB of its 1.00 GiB of device \
                 memory from cuMemCreate"
            )),
            "{said:?}"
        );
        assert!(said[0].contains("XLA_PYTHON_CLIENT_ALLOCATOR=platform"));

        // It allocated more, then was idle again: tried again, refused again, not said again.
        snapshots.send(vec![idle(id, 2 * GIB)]).unwrap();
        assert!(settle(&mut watch, Duration::from_secs(10)));
        snapshots.send(vec![idle(id, 2 * GIB)]).unwrap();
        assert!(settle(&mut watch, Duration::from_secs(10)));
        assert_eq!(finds.load(Ordering::SeqCst), 2);
        assert_eq!(warnings().len(), 1);
        assert_eq!(watch.idle.as_ref().unwrap().freezer.held(), 0);
        // Gone from the snapshots: forgotten.
        snapshots.send(Vec::new()).unwrap();
        watch.tick();
        assert!(watch.refused.is_empty());
    }

    /// What the tenant can write (its region's request word, its control block's mark) thaws
    /// nothing unless the request names the generation of the agent's own frozen mark.
    #[test]
    fn only_a_request_naming_the_frozen_generation_asks_for_a_thaw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.region");
        let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
        let ctl = control_path(&path);
        let _reader = ControlReader::open_or_create(&ctl).unwrap();
        let writer =
            ControlWriter::new(&tenant_fs::open_no_links(&ctl, Access::ReadWrite).unwrap())
                .unwrap();
        let watched = || Watched {
            container: "c".into(),
            control: tenant_fs::open_no_links(&ctl, Access::Read).unwrap(),
            reader: RegionReader::open(&path).unwrap(),
        };
        let frozen = writer.update(|s| s.freeze = FreezeMark::Frozen).unwrap();
        assert_eq!(requested(&watched()), None, "no request yet");
        region.request_thaw(frozen - 2);
        assert_eq!(requested(&watched()), None, "an older generation");
        region.request_thaw(frozen + 2);
        assert_eq!(requested(&watched()), None, "a generation not written");
        region.request_thaw(frozen);
        assert_eq!(requested(&watched()), Some(frozen));
        // The same request after the mark changed (freezing, then cleared) asks for nothing.
        let freezing = writer.update(|s| s.freeze = FreezeMark::Freezing).unwrap();
        region.request_thaw(freezing);
        assert_eq!(requested(&watched()), None, "a freeze still starting");
        let running = writer.update(|s| s.freeze = FreezeMark::Running).unwrap();
        region.request_thaw(running);
        assert_eq!(requested(&watched()), None, "not frozen");
        // A mark the tenant corrupted does not decode: nothing to thaw.
        let words = std::fs::read(&ctl).unwrap();
        let mut bad = words.clone();
        bad[320..328].copy_from_slice(&7u64.to_le_bytes());
        std::fs::write(&ctl, &bad).unwrap();
        assert_eq!(requested(&watched()), None, "a corrupt mark");
    }
}
