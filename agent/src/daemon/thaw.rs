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
//! freeze goes through [`freeze::freeze_container`], marking the container so that its next call
//! thaws it here.
//!
//! With `--freeze-on-demand` (`VGPU_FREEZE_ON_DEMAND`), a container's allocation waiting for
//! device memory (`VGPU_OOM_WAIT`; its slot says for how many bytes, read with the snapshot)
//! gets other containers idle for that long frozen the same way, largest first, until they give
//! back as much ([`Freezer::on_demand`]). The bytes are the tenant's claim: they only choose
//! among the containers the operator let be frozen on demand.
//!
//! Everything read here is the tenant's: the request is acted on only when it equals the
//! generation the agent's own mark has now, so a forged request thaws only the tenant's own
//! container, which its next CUDA call would do anyway. A thaw that fails (the GPU has no room
//! for the memory yet) is tried again at most every [`RETRY_PERIOD`].

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc::Receiver,
    },
    time::{Duration, Instant},
};

use limiter_core::freeze::{Activity, Demand, Freezer, Step};

use region::{FreezeMark, read_control, reader::RegionReader};
use tenant_fs::{Access, TenantFile};

use crate::{checkpoint::room, freeze, limit};

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
    libcuda: PathBuf,
    api: Option<room::Checked>,
    frozen: Vec<Watched>,
    next_scan: Instant,
    /// The last failed thaw of each container.
    failed: HashMap<String, FailedThaw>,
    idle: Option<Idle>,
    /// The containers marked frozen, as the last scan and thaws left them (for the model).
    shown: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Host bytes the idle freeze holds reserved after its last tick (for the model).
    reserved: Arc<AtomicU64>,
}

impl ThawWatch {
    /// A watcher of the processes under `proc`, thawing through the driver library `libcuda`
    /// (loaded at the first thaw).
    pub fn new(proc: PathBuf, libcuda: PathBuf) -> ThawWatch {
        ThawWatch {
            proc,
            libcuda,
            api: None,
            frozen: Vec::new(),
            next_scan: Instant::now(),
            failed: HashMap::new(),
            idle: None,
            shown: Arc::default(),
            reserved: Arc::default(),
        }
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

    /// Runs until the daemon stops.
    pub fn run(mut self) {
        while !crate::signals::stop_requested() {
            self.tick();
            crate::signals::sleep(if self.frozen.is_empty() {
                IDLE_POLL
            } else {
                POLL
            });
        }
    }

    /// One look: the idle freeze's decisions on the latest snapshot, a scan if one is due, then
    /// every frozen container's request; then what the idle freeze holds, for the model.
    fn tick(&mut self) {
        self.idle_freeze();
        self.tick_frozen();
        if let Some(idle) = &self.idle {
            // Relaxed: a figure for the model, read on its own.
            self.reserved.store(idle.freezer.held(), Ordering::Relaxed);
        }
    }

    /// A scan if one is due, then every frozen container's request.
    fn tick_frozen(&mut self) {
        if Instant::now() >= self.next_scan {
            self.scan();
            self.next_scan = Instant::now() + SCAN_PERIOD;
        }
        let mut thawed = Vec::new();
        for i in 0..self.frozen.len() {
            let w = &self.frozen[i];
            let Some(generation) = requested(w) else {
                continue;
            };
            if thawed.contains(&w.container) {
                continue;
            }
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
            let outcome = self.thaw(&container);
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
                    thawed.push(container);
                }
                Err(e) => {
                    let message = e.to_string();
                    let now = Instant::now();
                    let last = self.failed.get(&container);
                    let (logged, logged_at) = if FailedThaw::should_log(last, &message, now) {
                        log::warn!(
                            "container {container}: thaw at its next CUDA call failed: {message} \
                                 (tried again every second; the same failure is logged again \
                                 after {} s)",
                            REPEAT_LOG_PERIOD.as_secs()
                        );
                        (message, now)
                    } else {
                        let f = last.expect("should_log logs a first failure");
                        (f.logged.clone(), f.logged_at)
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
        if !thawed.is_empty() {
            self.frozen.retain(|w| !thawed.contains(&w.container));
            self.show();
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
                Step::Freeze(c) => {
                    let why = if for_memory.contains(&c) {
                        &why
                    } else {
                        "idle"
                    };
                    self.idle_freeze_one(&c, why)
                }
                Step::Thaw(c) => {
                    let ok = self.thaw(&c).is_ok();
                    if let Some(idle) = &mut self.idle {
                        idle.freezer.thaw_done(&c, ok);
                    }
                }
            }
        }
    }

    /// Freezes a container the freezer found idle (its bytes reserved already); `why` is said
    /// in the log.
    fn idle_freeze_one(&mut self, container: &str, why: &str) {
        let proc = self.proc.clone();
        let outcome = self
            .api()
            .map_err(freeze::FreezeError::from)
            .and_then(|api| {
                let pids = freeze::pids(&freeze::Target::Container(container.to_owned()), &proc)?;
                freeze::freeze_container(api, container, &pids, IDLE_LOCK_TIMEOUT)
            });
        let saved = match &outcome {
            Ok(lines) => {
                log::info!(
                    "container {container}: frozen, {why} ({})",
                    lines.join("; ")
                );
                true
            }
            Err(freeze::FreezeError::Failed { done, .. }) if !done.is_empty() => {
                log::warn!(
                    "container {container}: partly frozen, {why}: {}",
                    outcome.as_ref().unwrap_err()
                );
                true
            }
            Err(e) => {
                log::warn!("container {container}: freeze ({why}) failed: {e}");
                false
            }
        };
        if let Some(idle) = &mut self.idle {
            let bytes = idle
                .freezer
                .container(&container.to_owned())
                .map(|c| c.bytes);
            idle.freezer
                .freeze_done(&container.to_owned(), saved.then_some(bytes.unwrap_or(0)));
        }
        // The mark is there from now: the next scan watches it.
        self.next_scan = Instant::now();
    }

    /// The driver's checkpoint API, loaded at its first use.
    fn api(&mut self) -> Result<&room::Checked, crate::checkpoint::CheckpointError> {
        if self.api.is_none() {
            self.api = Some(room::open(&self.libcuda, &self.proc)?);
        }
        Ok(self.api.as_ref().expect("set above"))
    }

    /// Finds the regions whose control block marks their container frozen.
    fn scan(&mut self) {
        // Records of frozen processes that were killed go with them.
        if let Some(api) = &self.api {
            api.prune();
        }
        self.frozen = limit::container_regions(&self.proc, |_| true)
            .into_iter()
            .filter_map(|(container, region)| {
                let control = region.open_control(Access::Read).ok()?;
                let snap = read_control(&control).ok()??;
                if snap.settings.freeze != FreezeMark::Frozen {
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

    /// Thaws the container's processes and clears its mark.
    fn thaw(&mut self, container: &str) -> Result<Vec<String>, freeze::FreezeError> {
        let proc = self.proc.clone();
        let api = self.api()?;
        let pids = freeze::pids(&freeze::Target::Container(container.to_owned()), &proc)?;
        freeze::thaw_container(api, container, &pids)
    }
}

/// The generation the region's thaw request names, if it is the one marking the container
/// frozen now.
fn requested(w: &Watched) -> Option<u64> {
    let snap = read_control(&w.control).ok()??;
    if snap.settings.freeze != FreezeMark::Frozen {
        return None;
    }
    let request = w.reader.thaw_request().ok()?;
    (request == snap.generation).then_some(snap.generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use region::{ControlReader, ControlWriter, Region, RegionConfig, control_path};

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
