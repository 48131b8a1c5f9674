//! Collection: merges what the probes see, what every limiter region records, what NVML reports
//! and who each process is into one [`Snapshot`]. Nothing here is fatal: a missing privilege,
//! driver or GPU, or a corrupt region shows up in the snapshot's status, and collection goes on.

mod assemble;
mod context_charge;
mod estimates;
mod gpu_use;
pub mod processes;
mod region_scan;
pub mod regions;
pub mod window;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    discovery::Discovery,
    host::HostPaths,
    identity::runtime_names::{NameLookupConfig, NameSources, RuntimeNames},
    model::{ProcessKey, Snapshot, probing::LaunchProbes},
    nvml::{GpuSnapshot, GpuSource, NvmlGpuSource},
    probes::session::{RawReading, Tracer},
};

/// The probe session's options, part of [`CollectorOptions`].
use crate::probe_options::TraceOptions;

/// How long an exited process stays in the model (and its rows in the kernel maps), by default.
pub const EXITED_RETENTION: Duration = Duration::from_secs(60);

/// Whether this process may collect (load the probes), with the message to show if not: for
/// commands that choose between a running daemon and collecting themselves.
pub fn check_privileges() -> Result<(), String> {
    crate::probes::privileges::check_current_process()
}

/// The interval a collector plans for until told ([`Collector::set_interval`]).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// How a snapshot's time is shared out for an `interval`: the regions get half of it (at least
/// 250 ms), and each region a quarter (50 to 250 ms) and 16,384 retries, so that the snapshot
/// ends within its interval whatever the regions hold. A healthy region reads in a millisecond;
/// the floors leave room for a machine whose CPUs are busy (a read cut by its budget leaves the
/// process's figures out of that snapshot).
fn region_times(interval: Duration) -> (Duration, region::reader::ReadBudget) {
    let budget = region::reader::ReadBudget {
        time: (interval / 4).clamp(Duration::from_millis(50), Duration::from_millis(250)),
        ..region::reader::ReadBudget::DEFAULT
    };
    ((interval / 2).max(Duration::from_millis(250)), budget)
}

pub struct CollectorOptions {
    /// Probe options; `None` collects without probes.
    pub trace: Option<TraceOptions>,
    pub region_dirs: Vec<PathBuf>,
    pub host: HostPaths,
    /// Read NVML (off in tests that must not depend on the host's driver).
    pub nvml: bool,
    /// Read NVML at most this often (rounded to whole snapshots; `None`: every snapshot).
    pub nvml_interval: Option<Duration>,
    /// How long exited processes stay in the model.
    pub exited_retention: Duration,
}

/// A GPU source for hosts where NVML is not wanted.
struct NoGpu;

impl GpuSource for NoGpu {
    fn snapshot(&mut self) -> GpuSnapshot {
        GpuSnapshot {
            problems: vec!["NVML disabled".into()],
            ..Default::default()
        }
    }
}

pub struct Collector {
    tracer: Option<Tracer>,
    probes_unavailable: Option<String>,
    discovery: Discovery,
    host: HostPaths,
    regions: region_scan::RegionScan,
    /// How long the regions may take per snapshot.
    region_time: Duration,
    gpu: Box<dyn GpuSource + Send>,
    nvml_interval: Option<Duration>,
    processes: processes::ProcessTable,
    names: RuntimeNames,
    cgroups: crate::identity::CgroupIndex,
    previous: Option<(Instant, Snapshot)>,
    /// When each process was first seen gone.
    exited_since: HashMap<ProcessKey, Instant>,
    launch_mode: LaunchProbes,
    exited_retention: Duration,
    /// Allocation entries in the kernel map, as counted at the last removal pass.
    allocs_entries: Option<usize>,
    /// The last snapshot of every process that had limiter figures: a process retires its region
    /// slot when it exits, so its final figures are kept here for the retention period.
    last_limited: HashMap<ProcessKey, crate::model::Process>,
    /// Processes region slots named whose maps the region scan had not listed: listed next.
    claimed_pids: Vec<u32>,
}

impl Collector {
    /// Starts collecting. Never fails: what cannot run is reported in every snapshot.
    pub fn start(opts: CollectorOptions) -> Collector {
        let launch_mode = opts
            .trace
            .as_ref()
            .map(|t| t.launches)
            .unwrap_or(LaunchProbes::Off);
        let (tracer, probes_unavailable) = match opts.trace {
            None => (None, Some("probes disabled".to_string())),
            Some(t) => match Tracer::start(t) {
                Ok(t) => (Some(t), None),
                Err(e) => {
                    log::warn!("running without probes: {e}");
                    (None, Some(e.to_string()))
                }
            },
        };
        let mut gpu: Box<dyn GpuSource + Send> = if opts.nvml {
            Box::new(NvmlGpuSource::for_host(opts.host.clone()))
        } else {
            Box::new(NoGpu)
        };
        gpu.set_read_interval(nvml_read_gap(opts.nvml_interval, DEFAULT_INTERVAL));
        Collector {
            tracer,
            probes_unavailable,
            discovery: Discovery::new(),
            regions: region_scan::RegionScan::new(opts.region_dirs, &opts.host.proc),
            region_time: region_times(DEFAULT_INTERVAL).0,
            gpu,
            nvml_interval: opts.nvml_interval,
            processes: processes::ProcessTable::new(&opts.host.proc),
            names: RuntimeNames::new(
                NameSources::from_host(&opts.host),
                NameLookupConfig::default(),
            ),
            cgroups: crate::identity::CgroupIndex::new(),
            host: opts.host,
            previous: None,
            exited_since: HashMap::new(),
            launch_mode,
            exited_retention: opts.exited_retention,
            allocs_entries: None,
            last_limited: HashMap::new(),
            claimed_pids: Vec::new(),
        }
    }

    /// As [`Collector::start`], but an error if the probes cannot run.
    pub fn start_with_probes(
        opts: CollectorOptions,
    ) -> Result<Collector, crate::probes::ProbeError> {
        let trace = opts.trace.clone().expect("probe options given");
        let tracer = Tracer::start(trace)?;
        let mut c = Collector::start(CollectorOptions {
            trace: None,
            ..opts
        });
        c.launch_mode = tracer.options_launches();
        c.tracer = Some(tracer);
        c.probes_unavailable = None;
        Ok(c)
    }

    /// Plans each snapshot's time for this interval (see [`region_times`]).
    pub fn set_interval(&mut self, interval: Duration) {
        let (region_time, budget) = region_times(interval);
        self.region_time = region_time;
        self.regions.set_budget(budget);
        self.gpu
            .set_read_interval(nvml_read_gap(self.nvml_interval, interval));
        if let Some(t) = &mut self.tracer {
            t.set_interval(interval);
        }
    }

    pub fn tracer_mut(&mut self) -> Option<&mut Tracer> {
        self.tracer.as_mut()
    }

    /// Sleeps until `until` (or a stop request), attaching and detaching the sampled probes as
    /// their windows open and close in between. A probe budget's windows (100 ms) are shorter
    /// than a collection interval (1 s): switched only at each collection, a window stayed open
    /// for the whole interval and the budget was not held (on two H200s, the all_reduce loop's
    /// collectives were probed in 87% of its steps under a 0.5% budget).
    pub fn sleep_until(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until || crate::signals::stop_requested() {
                return;
            }
            let switch = self.tracer.as_ref().and_then(|t| t.next_switch());
            let wake = switch.map_or(until, |s| s.min(until));
            crate::signals::sleep(wake.saturating_duration_since(now));
            if let Some(t) = &mut self.tracer
                && t.next_switch().is_some_and(|s| s <= Instant::now())
                && let Err(e) = t.switch_due()
            {
                log::warn!("switching sampled probes: {e}");
            }
        }
    }

    /// Takes a snapshot.
    pub fn collect(&mut self) -> Snapshot {
        let started = Instant::now();
        let mut warnings = Vec::new();
        let (reading, users) = match &mut self.tracer {
            Some(t) => {
                if let Err(e) = t.poll() {
                    warnings.push(format!("probe poll: {e}"));
                }
                let reading = t.read().unwrap_or_else(|e| {
                    warnings.push(format!("reading probe maps: {e}"));
                    RawReading::default()
                });
                (reading, t.users().to_vec())
            }
            None => (
                RawReading::default(),
                self.discovery
                    .poll(&self.host, discovery_wait(self.region_time))
                    .users,
            ),
        };
        let gpu = self.gpu.snapshot();
        let mut pids: Vec<u32> = users.iter().map(|(pid, _)| *pid).collect();
        for pid in self.claimed_pids.drain(..) {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        let scanned = self.regions.scan(&pids, Instant::now() + self.region_time);
        warnings.extend(scanned.warnings);

        let now = Instant::now();
        let interval = self
            .previous
            .as_ref()
            .map(|(t, _)| now.duration_since(*t).as_secs_f64())
            .unwrap_or(0.0);
        let inputs = assemble::Inputs {
            reading: &reading,
            users: &users,
            gpu: &gpu,
            regions: &scanned.regions,
            listed: &scanned.listed,
            tracer: self.tracer.as_ref(),
            own_pid: std::process::id(),
        };
        let mut snap = assemble::build(
            inputs,
            &mut self.processes,
            &mut self.names,
            &mut self.cgroups,
            &mut self.claimed_pids,
            now,
        );
        snap.agent.region_listing_cuts = scanned.cuts.iter().map(regions::cut_model).collect();
        if let Some(t) = &mut self.tracer {
            // Processes whose limiter counts their launches, synchronisations and copies: not
            // probed for them from the next poll.
            t.set_limited(
                snap.processes
                    .iter()
                    .filter(|p| p.alive && p.limiter.is_some())
                    .map(|p| p.key.pid)
                    .collect(),
            );
        }
        snap.schema = crate::model::SCHEMA.into();
        snap.hostname = hostname();
        snap.taken_at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        snap.interval_seconds = interval;
        snap.driver_version = gpu.driver_version.clone();
        snap.cuda_driver_version = gpu.cuda_driver_version.clone();
        let a = &mut snap.agent;
        a.probes_unavailable = self.probes_unavailable.clone();
        a.launch_probes = self.launch_mode;
        a.nvml_problems = gpu.problems.clone();
        a.nvml_calls = nvml_calls(&gpu.calls);
        if let Some(t) = &self.tracer {
            a.attach_mode = Some(t.probes().mode());
            a.libraries = t.library_status();
            a.probe_cost = t.probe_cost().cloned();
            a.sampling = t.sampling_status().cloned();
            a.launch_probe_seconds = t.launch_probe_time().as_secs_f64();
            a.warnings.extend(t.warnings());
            a.warnings_suppressed = t.warnings_suppressed();
            a.libraries_skipped = t.libraries_skipped();
            a.maps_scan = t.maps_scan_status();
        }
        a.warnings.extend(warnings);
        a.collect_seconds = started.elapsed().as_secs_f64();
        if self.tracer.is_some() {
            a.map_entries.insert("stats".into(), reading.stats.len());
            a.map_entries.insert("live".into(), reading.live.len());
            if let Some(n) = self.allocs_entries {
                a.map_entries.insert("allocs".into(), n);
            }
        }

        estimates::apply(&mut snap, self.previous.as_ref().map(|(_, s)| s));
        self.carry_limiter_figures(&mut snap);
        // The containers whose control blocks mark them frozen, with their processes' final
        // figures.
        snap.mark_frozen(|c| c.frozen.is_some());
        gpu_use::accumulate(self.previous.as_ref().map(|(_, s)| s), &mut snap);
        gpu_use::limiter_busy(self.previous.as_ref().map(|(_, s)| s), &mut snap);
        snap.agent.warnings.extend(gpu_use::pid_namespace_warning(
            tenant_fs::own_pid_namespace(),
            &snap,
        ));
        // Rates against the previous snapshot, per process.
        if let Some((_, prev)) = &self.previous {
            for p in &mut snap.processes {
                if let Some(before) = prev.process(p.key) {
                    p.rates = Some(crate::model::Rates::between(p, before, interval));
                }
            }
        }
        self.forget_exited(&mut snap, now);
        // Where tenant strings enter the model: every view of it shows only inert text.
        crate::sanitize::snapshot(&mut snap);
        self.previous = Some((now, snap.clone()));
        snap
    }

    /// Keeps the limiter's figures of processes whose slot went away (they exited).
    fn carry_limiter_figures(&mut self, snap: &mut Snapshot) {
        for p in &mut snap.processes {
            if p.limiter.is_some() {
                self.last_limited.insert(p.key, p.clone());
            } else if let Some(last) = self.last_limited.get(&p.key) {
                p.limiter.clone_from(&last.limiter);
                p.apis.extend(
                    last.apis
                        .iter()
                        .filter(|a| a.source == crate::model::Source::Limiter)
                        .cloned(),
                );
                p.memory.limiter = last.memory.limiter;
                p.memory.limiter_allocations = last.memory.limiter_allocations;
            }
        }
        for (key, last) in &self.last_limited {
            if snap.process(*key).is_none() {
                let mut gone = last.clone();
                gone.alive = false;
                gone.rates = None;
                if let Some(c) = snap.containers.iter_mut().find(|c| c.key == gone.container) {
                    c.processes.push(gone.key);
                }
                snap.processes.push(gone);
            }
        }
    }

    /// Drops processes gone for longer than [`EXITED_RETENTION`], from the model and from the
    /// kernel maps, so that a long-running agent's memory stays flat.
    fn forget_exited(&mut self, snap: &mut Snapshot, now: Instant) {
        let mut forget = Vec::new();
        for p in &snap.processes {
            if p.alive {
                self.exited_since.remove(&p.key);
            } else {
                let since = *self.exited_since.entry(p.key).or_insert(now);
                if now.duration_since(since) >= self.exited_retention {
                    forget.push(p.key);
                }
            }
        }
        if forget.is_empty() {
            return;
        }
        snap.processes.retain(|p| !forget.contains(&p.key));
        for c in &mut snap.containers {
            c.processes.retain(|k| !forget.contains(k));
        }
        snap.containers
            .retain(|c| !c.processes.is_empty() || !c.regions.is_empty());
        for k in &forget {
            self.exited_since.remove(k);
            self.last_limited.remove(k);
        }
        if let Some(t) = &mut self.tracer {
            let pids: Vec<u32> = forget.iter().map(|k| k.pid).collect();
            match t.forget_processes(&pids) {
                Ok(left) => self.allocs_entries = Some(left),
                Err(e) => log::warn!("removing exited processes from the probe maps: {e}"),
            }
        }
        let alive: std::collections::HashSet<u32> =
            snap.processes.iter().map(|p| p.key.pid).collect();
        self.processes.retain(|pid| alive.contains(&pid));
    }
}

/// The least time between two NVML readings for readings every `nvml_interval` at snapshots
/// every `snapshot_interval`: half a snapshot less, so that the reading falls on the snapshot
/// nearest its time whatever the snapshots' jitter (every snapshot without an interval or with
/// one no longer than the snapshots').
fn nvml_read_gap(nvml_interval: Option<Duration>, snapshot_interval: Duration) -> Duration {
    nvml_interval.map_or(Duration::ZERO, |every| {
        every.saturating_sub(snapshot_interval / 2)
    })
}

/// The NVML queries made so far, by kind; none without NVML.
fn nvml_calls(calls: &crate::nvml::CallTimes) -> BTreeMap<String, crate::model::NvmlCallCost> {
    if calls.iter().all(|(_, t)| t.calls == 0) {
        return BTreeMap::new();
    }
    calls
        .iter()
        .map(|(call, t)| {
            let cost = crate::model::NvmlCallCost {
                calls: t.calls,
                seconds: t.total_ns as f64 / 1e9,
                max_seconds: t.max_ns as f64 / 1e9,
            };
            (call.name().to_owned(), cost)
        })
        .collect()
}

/// How long a snapshot without probes waits for the maps scan.
fn discovery_wait(region_time: Duration) -> Duration {
    (region_time / 5).clamp(Duration::from_millis(20), Duration::from_millis(250))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::{CallTimes, NvmlCall};

    /// `--nvml-interval` falls on the snapshot nearest its time: every snapshot without it or
    /// with one no longer than the snapshots', every fifth for 5 s at 1 s.
    #[test]
    fn the_nvml_interval_is_rounded_to_whole_snapshots() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(nvml_read_gap(None, s(1)), Duration::ZERO);
        assert_eq!(nvml_read_gap(Some(s(5)), s(1)), ms(4500));
        // Snapshots 1 s apart with a few ms of jitter: a reading every fifth.
        let gap = nvml_read_gap(Some(s(5)), s(1));
        assert!(ms(3990) < gap && ms(5010) > gap);
        // No longer than the snapshots': every one, however they jitter.
        assert!(nvml_read_gap(Some(s(1)), s(1)) < ms(990));
        assert_eq!(nvml_read_gap(Some(ms(200)), s(1)), Duration::ZERO);
    }

    /// `stat --no-daemon` and `top` without the daemon: the collector's own snapshot marks a
    /// container frozen where its region's control block says so (written as `freeze
    /// --container` writes it), not where the block says running, and a corrupt block marks
    /// nothing, says why and does not stop the snapshot.
    #[test]
    fn the_collectors_snapshot_marks_frozen_containers_from_their_control_blocks() {
        use region::FreezeMark;
        let dir = tempfile::tempdir().unwrap();
        let regions = dir.path().join("regions");
        let config = region::RegionConfig::unlimited(1);
        let _regions: Vec<_> = ["frozen", "running", "corrupt"]
            .iter()
            .map(|n| {
                let sub = regions.join(format!("pod_{n}"));
                std::fs::create_dir_all(&sub).unwrap();
                region::Region::open_or_create(&sub.join("r.cache"), &config).unwrap()
            })
            .collect();
        let region = |n: &str| regions.join(format!("pod_{n}/r.cache"));
        regions::write_mark(&region("frozen"), FreezeMark::Frozen);
        regions::write_mark(&region("running"), FreezeMark::Running);
        std::fs::write(region::control_path(&region("corrupt")), [1u8; 7]).unwrap();
        // A host of its own: no processes, no runtimes.
        let root = dir.path().join("host");
        std::fs::create_dir_all(root.join("proc")).unwrap();
        let host = HostPaths {
            proc: root.join("proc"),
            driver_dirs: vec![],
            ..HostPaths::system().with_root(root.clone())
        };
        let mut collector = Collector::start(CollectorOptions {
            trace: None,
            region_dirs: vec![regions.clone()],
            host,
            nvml: false,
            nvml_interval: None,
            exited_retention: EXITED_RETENTION,
        });
        let snap = collector.collect();
        let frozen = |n: &str| {
            let path = region(n).display().to_string();
            snap.containers
                .iter()
                .find(|c| c.regions.iter().any(|r| r.path == path))
                .unwrap_or_else(|| panic!("{n}: {:?}", snap.containers))
                .frozen
                .clone()
        };
        // No process of its own: nothing of its memory is counted.
        assert_eq!(
            frozen("frozen"),
            Some(crate::model::Frozen {
                host_bytes: 0,
                in_process: false
            })
        );
        assert_eq!(frozen("running"), None);
        assert_eq!(frozen("corrupt"), None);
        assert_eq!(snap.agent.regions_read, 3);
        assert_eq!(snap.agent.region_errors, 1);
    }

    #[test]
    fn nvml_calls_in_the_model_are_every_kind_once_nvml_is_used() {
        assert!(nvml_calls(&CallTimes::default()).is_empty(), "no NVML");
        let mut times = CallTimes::default();
        times.add(NvmlCall::ProcessUtilization, Duration::from_millis(3));
        times.add(NvmlCall::ProcessUtilization, Duration::from_millis(1));
        let m = nvml_calls(&times);
        assert_eq!(m.len(), NvmlCall::ALL.len());
        let pu = m["process_utilization"];
        assert_eq!(pu.calls, 2);
        assert!((pu.seconds - 0.004).abs() < 1e-9, "{pu:?}");
        assert!((pu.max_seconds - 0.003).abs() < 1e-9, "{pu:?}");
        assert_eq!(m["uuid"].calls, 0);
    }
}
