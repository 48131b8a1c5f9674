//! The tracing session: probes loaded, libraries discovered and attached as they appear, launch
//! probes switched by policy, and raw readings of the kernel's aggregation maps.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use agent_common::maps::{
    AllocSizeKey, AllocSizeVal, ApiStats, Health, LiveMem, NcclCommInfo, NcclCommKey, NcclStatsKey,
    ProbeLoss, StatsKey,
};

use crate::{
    discovery::{self, Discovery, FileId, LibraryFile, LibraryKind},
    identity::ProcessFacts,
    model::{
        FoundBy,
        probing::{LaunchProbes, ProbeCost, Prologue, SamplingStatus},
    },
    probe_options::TraceOptions,
    probes::{
        ProbeError, Probes, ProcessScope,
        calibrate::Calibrator,
        sampling::{SAMPLED_KINDS, Schedule},
    },
    sys::clock::boot_time_ns,
};

use super::warnings::{WarningKey, WarningStore};

/// Driver libraries of each kind attached per tenant at most (distinct files found in its
/// processes; the host's and configured ones are not counted).
pub const LIBRARIES_PER_TENANT: usize = 4;
/// Libraries found in processes attached in all at most.
pub const LIBRARIES_TOTAL: usize = 64;
/// Polls in a row, and time, without a live process mapping it after which a library found in
/// processes is detached and forgotten. The time keeps a library attached across a process that
/// exits and starts again (a crash loop, a job's next step), and for a report made just after
/// its last user exited; a tenant's bound counts it until then.
pub const UNMAPPED_GRACE_POLLS: u32 = 3;
pub const UNMAPPED_GRACE_TIME: Duration = Duration::from_secs(5);
/// Processes a CUDA library's high-rate kinds are attached for one by one at most, while
/// processes under the limiter use it too (see [`Tracer::set_limited`]); with more, the library
/// is attached for every process again (the limiter's processes then take the traps too), so
/// that a tenant's many processes cannot make the agent hold links without bound.
pub const PER_PROCESS_MAX: usize = 32;
/// How long a poll waits for the maps scan by default (see [`Tracer::set_interval`]).
const MAPS_WAIT: Duration = Duration::from_millis(250);
/// How long the first poll waits for the first maps scan.
const FIRST_MAPS_WAIT: Duration = Duration::from_secs(2);

/// One reading of the kernel maps.
#[derive(Clone, Debug, Default)]
pub struct RawReading {
    pub stats: Vec<(StatsKey, ApiStats)>,
    pub live: Vec<(u32, LiveMem)>,
    pub nccl_stats: Vec<(NcclStatsKey, ApiStats)>,
    pub nccl_comms: Vec<(NcclCommKey, NcclCommInfo)>,
    pub alloc_sizes: Vec<(AllocSizeKey, AllocSizeVal)>,
    pub health: [u64; Health::COUNT as usize],
    /// What each process lost in the kernel (only those that lost something).
    pub losses: Vec<(u32, ProbeLoss)>,
    /// Aggregation rows found gone back per process (cumulative; see `monotonic`).
    pub rows_reset: HashMap<u32, u64>,
}

pub struct Tracer {
    probes: Probes,
    discovery: Discovery,
    opts: TraceOptions,
    started: Instant,
    launch_on_since: Option<Instant>,
    launch_on_total: Duration,
    calibrator: Option<Calibrator>,
    schedule: Option<Schedule>,
    /// Facts about every process seen mapping a probed library, kept after it exits so that a
    /// short-lived process is still shown by name.
    seen_processes: HashMap<u32, ProcessFacts>,
    /// Processes mapping a probed library at the last poll, and which file.
    users: Vec<(u32, FileId)>,
    /// Every probed library each process was seen mapping (until it is forgotten): which
    /// function a probed call hit, for its prologue class.
    pid_files: HashMap<u32, Vec<FileId>>,
    /// When each library was attached (CLOCK_BOOTTIME ns): processes that started later were
    /// seen whole.
    attached_at: HashMap<FileId, u64>,
    /// Problems worth telling the user (also logged as they happen), bounded per tenant.
    warnings: WarningStore,
    /// How long a poll waits for the maps scan's cycle before going on without it.
    maps_wait: Duration,
    /// Returns without an entry made by attaching and detaching sampled kinds (see
    /// [`Tracer::at_window_edge`]), kept out of `return_without_entry`.
    edge_returns: u64,
    /// The aggregation rows as last read, so that what is shown never goes back.
    floors: crate::probes::monotonic::Floors,
    /// Processes whose launches, synchronisations and copies their limiter records (see
    /// [`Tracer::set_limited`]).
    limited: BTreeSet<u32>,
    /// What the probes' hits cost each process.
    probe_time: super::probe_time::ProbeTime,
}

impl Tracer {
    /// The span events' ring buffer, once (`None` when spans are off or it was taken).
    pub fn take_span_ring(&mut self) -> Option<aya::maps::RingBuf<aya::maps::MapData>> {
        self.probes.take_span_ring()
    }

    /// Loads the probes, attaches the host's and the configured libraries, and calibrates.
    pub fn start(opts: TraceOptions) -> Result<Tracer, ProbeError> {
        let probes = Probes::load(opts.spans, opts.quotas)?;
        let mut t = Tracer {
            probes,
            discovery: Discovery::new(),
            opts,
            started: Instant::now(),
            launch_on_since: None,
            launch_on_total: Duration::ZERO,
            calibrator: None,
            schedule: None,
            seen_processes: HashMap::new(),
            users: Vec::new(),
            pid_files: HashMap::new(),
            attached_at: HashMap::new(),
            warnings: WarningStore::default(),
            maps_wait: MAPS_WAIT,
            edge_returns: 0,
            floors: Default::default(),
            limited: BTreeSet::new(),
            probe_time: Default::default(),
        };
        if t.opts.launches == LaunchProbes::On {
            let r = t.set_launches(true);
            t.settle(r)?;
        }
        if let Some(budget) = t.opts.budget {
            // Launches come under the budget when they are probed at all (`LaunchProbes::On`
            // is for runs without one). Allocations, frees and lifecycle calls stay attached
            // but are no reference for the sampled kinds' gaps: they come in phases, at start-up
            // or when a batch size changes, so a gap that spans a phase change would look full
            // of launches.
            let kinds: Vec<_> = SAMPLED_KINDS
                .into_iter()
                .filter(|k| {
                    *k != agent_common::ApiKind::Launch || t.opts.launches == LaunchProbes::Budget
                })
                .collect();
            let schedule = Schedule::new(budget, &kinds, Instant::now());
            for k in schedule.initially_on() {
                t.set_kind(k, true)?;
            }
            t.schedule = Some(schedule);
        }
        let host_lib = discovery::host_library(&t.opts.host, LibraryKind::Cuda);
        let mut initial: Vec<LibraryFile> = Vec::new();
        for p in t.opts.extra_libcuda.clone() {
            match discovery::configured_library(LibraryKind::Cuda, &p) {
                Some(lib) => initial.push(lib),
                None => t.warn(format!("--libcuda {}: not a readable file", p.display())),
            }
        }
        match &host_lib {
            Some(lib) => initial.push(lib.clone()),
            None => t.warn(
                "no libcuda on the host (searched /etc/ld.so.cache and the driver directories): \
                 no NVIDIA driver here? Watching processes for one"
                    .into(),
            ),
        }
        // The host's NCCL, if it has one (silently: most NCCL users bring their own copy, which
        // the process scan finds).
        if let Some(lib) = discovery::host_library(&t.opts.host, LibraryKind::Nccl) {
            initial.push(lib);
        }
        for lib in initial {
            t.attach(lib);
        }
        if t.opts.calibrate {
            let host_driver = host_lib
                .as_ref()
                .and_then(|l| t.probes.library(l.id))
                .and_then(|l| main_prologue(&l.symbols.found));
            match Calibrator::start(&mut t.probes, host_driver) {
                Ok(c) => {
                    for class in &c.cost.classes {
                        log::info!(
                            "probe cost on this host: {:.0} ns per probed call (entry+return) of a function with a {} prologue (measured on {})",
                            class.per_hit_ns,
                            prologue_name(class.prologue),
                            class.target
                        );
                    }
                    t.calibrator = Some(c);
                }
                Err(e) => t.warn(format!("probe cost calibration failed: {e}")),
            }
        }
        t.maps_wait = FIRST_MAPS_WAIT;
        let first = t.poll();
        t.maps_wait = MAPS_WAIT;
        first?;
        Ok(t)
    }

    /// Plans the maps scan's wait for this snapshot interval: a tenth of it, 20 to 250 ms.
    pub fn set_interval(&mut self, interval: Duration) {
        self.maps_wait = (interval / 10).clamp(Duration::from_millis(20), MAPS_WAIT);
    }

    /// An agent warning (not about a tenant).
    fn warn(&mut self, msg: String) {
        self.warnings.agent("agent", msg);
    }

    /// A warning about a library: its tenant's when found in a process.
    fn warn_library(&mut self, lib: &LibraryFile, kind: &'static str, msg: String) {
        match &lib.tenant {
            Some(t) => {
                let key = WarningKey {
                    tenant: Some(t.to_string()),
                    kind,
                    subject: lib.id.to_string(),
                };
                self.warnings.warn(key, None, msg, Instant::now());
            }
            None => self.warn(msg),
        }
    }

    /// The kept warnings (see [`WarningStore`]).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.list()
    }

    /// Warnings not kept, by tenant.
    pub fn warnings_suppressed(&self) -> std::collections::BTreeMap<String, u64> {
        self.warnings.suppressed().clone()
    }

    /// Libraries found in processes and not attached, by tenant and reason.
    pub fn libraries_skipped(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> {
        self.discovery.skipped()
    }

    /// The maps scan's state.
    pub fn maps_scan_status(&self) -> crate::model::MapsScanStatus {
        self.discovery.status.clone()
    }

    /// Whether a library found in a process is within its tenant's and the total bound.
    fn within_bounds(&self, lib: &LibraryFile) -> Result<(), &'static str> {
        if lib.tenant.is_none() {
            return Ok(());
        }
        let (of_tenant, all) = self
            .discovery
            .attached_count(lib.tenant.as_deref(), lib.kind);
        if of_tenant >= LIBRARIES_PER_TENANT {
            Err(discovery::TENANT_CAP)
        } else if all >= LIBRARIES_TOTAL {
            Err(discovery::TOTAL_CAP)
        } else {
            Ok(())
        }
    }

    fn attach(&mut self, lib: LibraryFile) {
        if self.probes.is_attached(lib.id) {
            return;
        }
        if lib.tenant.is_none() {
            self.discovery.mark_seen(lib.id);
        } else if let Err(bound) = self.within_bounds(&lib) {
            self.discovery
                .decide(&lib, discovery::Verdict::Skipped(bound));
            let tenant = lib.tenant.as_deref().unwrap_or_default();
            let msg = match bound {
                discovery::TENANT_CAP => format!(
                    "tenant {tenant}: not probing {}: {LIBRARIES_PER_TENANT} {} libraries of \
                     this tenant are probed already (counted in libraries_skipped)",
                    lib.path.display(),
                    lib.kind.soname()
                ),
                _ => format!(
                    "tenant {tenant}: not probing {}: {LIBRARIES_TOTAL} libraries found in \
                     processes are probed already (counted in libraries_skipped)",
                    lib.path.display()
                ),
            };
            // One warning per tenant and bound, counted.
            let key = WarningKey {
                tenant: Some(tenant.to_owned()),
                kind: bound,
                subject: String::new(),
            };
            self.warnings.warn(key, None, msg, Instant::now());
            return;
        }
        // The path as its users see it first; a library found in a process is reached through
        // that process's map_files entry (docs/security.md).
        let shown = lib.path.clone();
        let through = match &lib.found_by {
            FoundBy::Process { pid } => format!(
                "in pid {pid} as {}, through {}",
                lib.path.display(),
                lib.attach_path.display()
            ),
            FoundBy::Configured => "on the command line".to_string(),
            FoundBy::Host => "on the host".to_string(),
        };
        let id = lib.id;
        let found = lib.clone();
        match self.probes.attach_library(lib) {
            Ok(attached) => {
                if found.tenant.is_some() {
                    self.discovery.decide(&found, discovery::Verdict::Attached);
                }
                self.attached_at.insert(id, boot_time_ns());
                let missing: Vec<&str> =
                    attached.symbols.missing.iter().map(|a| a.name()).collect();
                log::info!(
                    "attached to {} [{}] ({} symbols; found {through})",
                    shown.display(),
                    attached.file.id,
                    attached.symbols.found.len(),
                );
                if !missing.is_empty() {
                    let msg = format!(
                        "{} does not export {} traced symbol(s), skipped: {}",
                        shown.display(),
                        missing.len(),
                        missing.join(", ")
                    );
                    self.warn_library(&found, "symbols_missing", msg);
                }
            }
            Err(e) => {
                let reason = match e {
                    ProbeError::NotADriver { .. } | ProbeError::NotElf { .. } => {
                        discovery::NOT_A_DRIVER
                    }
                    _ => discovery::ATTACH_FAILED,
                };
                if found.tenant.is_some() {
                    self.discovery
                        .decide(&found, discovery::Verdict::Skipped(reason));
                }
                let msg = format!(
                    "could not attach to {} (found {through}): {e}",
                    shown.display()
                );
                self.warn_library(&found, reason, msg);
            }
        }
    }

    /// Detaches and forgets the libraries found in processes that no live process has mapped
    /// for [`UNMAPPED_GRACE_POLLS`] polls; room made under a bound lets skipped ones be
    /// considered again.
    fn detach_unmapped(&mut self) {
        let gone =
            self.discovery
                .unmapped(UNMAPPED_GRACE_POLLS, UNMAPPED_GRACE_TIME, Instant::now());
        let mut freed = false;
        for (id, verdict) in gone {
            self.warnings.forget_subject(&id.to_string());
            if verdict == discovery::Verdict::Attached
                && let Some(lib) = self.probes.remove_library(id)
            {
                log::info!(
                    "{} [{id}] is mapped by no live process: detached",
                    lib.file.path.display()
                );
                self.attached_at.remove(&id);
                freed = true;
            }
        }
        if freed {
            self.discovery.reconsider_skipped();
        }
    }

    /// Looks for new libraries in processes and applies the launch-probe policy. Call often
    /// (every 0.5-1 s): a library that appears is attached at the next call.
    pub fn poll(&mut self) -> Result<(), ProbeError> {
        let scan = self.discovery.poll(&self.opts.host, self.maps_wait);
        let now = Instant::now();
        for r in scan.refused {
            let key = WarningKey {
                tenant: Some(r.tenant.to_string()),
                kind: "refused",
                subject: format!("{}:{}", r.pid, r.id),
            };
            self.warnings.warn(key, Some(r.pid), r.message, now);
        }
        for lib in scan.new {
            self.attach(lib);
        }
        self.detach_unmapped();
        let discovery = &self.discovery;
        self.warnings.expire(|pid| discovery.is_live(pid), now);
        let probes = &self.probes;
        let scan = crate::discovery::ProcessScan {
            users: scan
                .users
                .into_iter()
                .filter(|(_, id)| probes.is_attached(*id))
                .collect(),
            ..Default::default()
        };
        for (pid, id) in &scan.users {
            let files = self.pid_files.entry(*pid).or_default();
            if !files.contains(id) {
                files.push(*id);
            }
        }
        self.users = scan.users.clone();
        self.apply_scopes();
        for (pid, _) in scan.users {
            let stale = self.seen_processes.get(&pid).is_none_or(|f| {
                // A reused pid is another process.
                ProcessFacts::read(&self.opts.host.proc, pid)
                    .is_some_and(|now| now.start_ticks != f.start_ticks)
            });
            if stale && let Some(f) = ProcessFacts::read(&self.opts.host.proc, pid) {
                self.seen_processes.insert(pid, f);
            }
        }
        if self.schedule.is_some() {
            self.switch_due()?;
        }
        // One read of the aggregation maps for the probe time and the schedule's poll.
        let rows = probe_rows(&self.probes);
        let calls: Vec<(u32, u16, u64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
        let hits: Vec<(u32, u16, u64)> = rows.iter().map(|r| (r.0, r.1, r.2 + r.3)).collect();
        self.account_probe_time(&hits);
        if let Some(s) = &mut self.schedule {
            s.poll(Instant::now(), |kind| calls_of_kind(&calls, kind));
        } else if let LaunchProbes::Sampled { window, period } = self.opts.launches {
            let period_ns = period.as_nanos().max(1);
            let within = self.started.elapsed().as_nanos() % period_ns;
            let r = self.set_launches(within < window.as_nanos());
            self.settle(r)?;
        }
        Ok(())
    }

    /// The processes whose limiter records their launches, synchronisations and copies itself
    /// (a live slot in a region: see `identity::regions`). From the next poll, the CUDA
    /// libraries they map have those kinds attached only for their other users, so that the
    /// limiter's processes take no probe trap for what their limiter already counts exactly.
    pub fn set_limited(&mut self, pids: BTreeSet<u32>) {
        self.limited = pids;
    }

    /// Scopes each CUDA library's per-process kinds: to every process while none of its users
    /// is under the limiter, else to its other users (up to [`PER_PROCESS_MAX`]).
    fn apply_scopes(&mut self) {
        if !self.probes.can_scope() {
            return;
        }
        let mut users: BTreeMap<FileId, BTreeSet<u32>> = BTreeMap::new();
        for (pid, id) in &self.users {
            users.entry(*id).or_default().insert(*pid);
        }
        let ids: Vec<(FileId, PathBuf)> = self
            .probes
            .libraries()
            .filter(|l| l.file.kind == LibraryKind::Cuda)
            .map(|l| (l.file.id, l.file.path.clone()))
            .collect();
        for (id, path) in ids {
            let mut of = users.remove(&id).unwrap_or_default();
            // The agent itself (its NVML maps the driver): not a process to watch.
            of.remove(&std::process::id());
            let scope = scope_for(&of, &self.limited);
            if scope == ProcessScope::All && of.iter().any(|p| self.limited.contains(p)) {
                let key = WarningKey {
                    tenant: None,
                    kind: "per_process_max",
                    subject: id.to_string(),
                };
                let msg = format!(
                    "{}: more than {PER_PROCESS_MAX} processes not under the limiter use it: \
                     probed for every process (the limiter's processes take probe traps too)",
                    path.display(),
                );
                self.warnings.warn(key, None, msg, Instant::now());
            }
            let r = self.probes.set_scope(id, scope);
            if let Err(e) = self.settle(r) {
                self.warn(format!("scoping the probes of {}: {e}", path.display()));
            }
        }
    }

    /// When the sampling schedule next attaches or detaches a kind (`None` without a budget).
    pub fn next_switch(&self) -> Option<Instant> {
        self.schedule.as_ref().and_then(Schedule::next_due)
    }

    /// Attaches and detaches what the sampling schedule says is due now.
    pub fn switch_due(&mut self) -> Result<(), ProbeError> {
        let Some(mut schedule) = self.schedule.take() else {
            return Ok(());
        };
        let prices = self.hit_prices();
        let per_hit = |pid: u32| prices.price(pid);
        let rows = probe_rows(&self.probes);
        let read: Vec<(u32, u16, u64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
        let hit: Vec<(u32, u16, u64)> = rows.iter().map(|r| (r.0, r.1, r.2 + r.3)).collect();
        let calls = |kind| calls_of_kind(&read, kind);
        let hits = |kind| calls_of_kind(&hit, kind);
        let switches = schedule.due(Instant::now(), per_hit, calls, hits);
        let mut result = Ok(());
        for (kind, on) in switches {
            result = result.and(self.set_kind(kind, on));
            if on {
                // Counted from now, once the attach returned.
                let at = Instant::now();
                let read = sampled_calls(&self.probes);
                schedule.opened(kind, at, |kind| calls_of_kind(&read, kind));
            }
        }
        self.schedule = Some(schedule);
        result
    }

    /// The price of a hit in each process: its own library's class (known from the symbol table
    /// as soon as the library is attached) at the calibrated cost.
    fn hit_prices(&self) -> HitPrices {
        HitPrices {
            classes: self
                .pid_files
                .keys()
                .filter_map(|pid| Some((*pid, self.library_prologue(*pid)?)))
                .collect(),
            cost: self.calibrator.as_ref().map(|c| c.cost.clone()),
        }
    }

    /// Adds the hits since the last look (`hits`: the aggregation maps' rows, counted calls and
    /// unpaired returns) to each process's probe time.
    fn account_probe_time(&mut self, hits: &[(u32, u16, u64)]) {
        let hits = super::probe_time::hits_per_process(hits);
        let prices = self.hit_prices();
        self.probe_time.account(hits, |pid| prices.price(pid));
    }

    /// What the probes' hits cost `pid` so far, seconds (`None`: never hit).
    pub fn probe_seconds(&self, pid: u32) -> Option<f64> {
        self.probe_time.seconds(pid)
    }

    /// What the sampling schedule did (with a budget).
    pub fn sampling_status(&self) -> Option<&SamplingStatus> {
        self.schedule.as_ref().map(|s| &s.status)
    }

    fn set_kind(&mut self, kind: agent_common::ApiKind, on: bool) -> Result<(), ProbeError> {
        let r = if kind == agent_common::ApiKind::Launch {
            self.set_launches(on)
        } else {
            self.at_window_edge(|t| t.probes.set_kind(kind, on))
        };
        self.settle(r)
    }

    /// Runs a switch of sampled probes. Switching a kind while its calls run makes returns
    /// without an entry: calls in flight when the probes attach, and calls that begin between
    /// the detach of the entry probe and that of the return probe (tens of milliseconds on a
    /// busy host: a hundred launches). They are the sampling window's edges, calls outside it,
    /// not lost events, so what the switch adds is kept out of `return_without_entry`.
    fn at_window_edge<T>(&mut self, switch: impl FnOnce(&mut Self) -> T) -> T {
        let before = self.probes.read_health().ok();
        let r = switch(self);
        if let (Some(b), Ok(a)) = (before, self.probes.read_health()) {
            let i = agent_common::maps::Health::ReturnWithoutEntry as usize;
            self.edge_returns += a[i].saturating_sub(b[i]);
            log::debug!(
                "window edge: {} returns without entry",
                a[i].saturating_sub(b[i])
            );
        }
        r
    }

    fn set_launches(&mut self, on: bool) -> Result<(), Vec<(FileId, ProbeError)>> {
        if on == self.probes.launches_on() {
            return Ok(());
        }
        // The other libraries are switched even where one fails.
        let r = self.at_window_edge(|t| t.probes.set_launch_probes(on));
        if on {
            self.launch_on_since = Some(Instant::now());
        } else if let Some(since) = self.launch_on_since.take() {
            self.launch_on_total += since.elapsed();
        }
        r
    }

    /// Handles the libraries a switch failed on: one whose path is gone (the processes that
    /// mapped it through that path exited) is detached and forgotten, so that a live process
    /// mapping the same file brings it back through its own path; the first other failure is
    /// returned.
    fn settle(&mut self, r: Result<(), Vec<(FileId, ProbeError)>>) -> Result<(), ProbeError> {
        let Err(failed) = r else {
            return Ok(());
        };
        let mut first = None;
        for (id, e) in failed {
            let gone = self
                .probes
                .library(id)
                .is_some_and(|l| !l.file.attach_path.exists());
            if gone {
                if let Some(lib) = self.probes.remove_library(id) {
                    log::info!(
                        "{} is gone: detached, until a process maps the library again",
                        lib.file.attach_path.display()
                    );
                }
                self.discovery.forget(id);
                self.attached_at.remove(&id);
                self.warnings.forget_subject(&id.to_string());
            } else if first.is_none() {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub fn options_launches(&self) -> LaunchProbes {
        self.opts.launches
    }

    /// How long the launch probes have been attached in total.
    pub fn launch_probe_time(&self) -> Duration {
        self.launch_on_total
            + self
                .launch_on_since
                .map(|s| s.elapsed())
                .unwrap_or_default()
    }

    /// Processes that mapped a probed library at the last poll.
    pub fn users(&self) -> &[(u32, FileId)] {
        &self.users
    }

    /// When a library was attached, in CLOCK_BOOTTIME nanoseconds.
    pub fn attached_at_boot_ns(&self, id: FileId) -> Option<u64> {
        self.attached_at.get(&id).copied()
    }

    /// Removes exited processes' rows from the kernel maps and forgets them.
    /// Returns the allocation entries left in the kernel map.
    pub fn forget_processes(&mut self, pids: &[u32]) -> Result<usize, ProbeError> {
        for pid in pids {
            self.seen_processes.remove(pid);
            self.pid_files.remove(pid);
        }
        self.probe_time.forget(pids);
        if let Some(c) = &mut self.calibrator {
            c.forget(pids);
        }
        if let Some(s) = &mut self.schedule {
            s.forget(pids);
        }
        self.floors.forget(pids);
        self.probes.forget_processes(pids)
    }

    /// Processes seen mapping a probed library (including ones that exited since).
    pub fn seen_processes(&self) -> &HashMap<u32, ProcessFacts> {
        &self.seen_processes
    }

    /// What the model reports about each probed library.
    pub fn library_status(&self) -> Vec<crate::model::LibraryStatus> {
        self.probes
            .libraries()
            .map(|l| crate::model::LibraryStatus {
                path: l.file.path.display().to_string(),
                attach_path: l.file.attach_path.display().to_string(),
                dev: l.file.id.dev,
                inode: l.file.id.inode,
                found_by: l.file.found_by.clone(),
                symbols_attached: l.symbols.found.len(),
                symbols_missing: l
                    .symbols
                    .missing
                    .iter()
                    .map(|a| a.name().to_owned())
                    .collect(),
                prologues: l.symbols.found.iter().fold(Default::default(), |mut m, s| {
                    let name = serde_json::to_value(s.prologue)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned));
                    *m.entry(name.unwrap_or_default()).or_insert(0) += 1;
                    m
                }),
                kinds_attached: l.attached_kinds().map(|k| k.name().to_owned()).collect(),
                processes_scoped: match l.scope() {
                    ProcessScope::All => None,
                    ProcessScope::Only(pids) => Some(pids.iter().copied().collect()),
                },
            })
            .collect()
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Reads the kernel maps, then re-measures the probe cost and charges each process's probed
    /// calls since the last reading at it.
    pub fn read(&mut self) -> Result<RawReading, ProbeError> {
        let mut r = RawReading {
            stats: self.probes.read_stats()?,
            live: self.probes.read_live()?,
            nccl_stats: self.probes.read_nccl_stats()?,
            nccl_comms: self.probes.read_nccl_comms()?,
            alloc_sizes: self.probes.read_alloc_sizes()?,
            health: self.probes.read_health()?,
            losses: self.probes.read_losses()?,
            rows_reset: HashMap::new(),
        };
        // The calibration's own rows are removed between its batches: not floored.
        let calibration = agent_common::ProbeCookie::CALIBRATION_API;
        let (own, mut stats): (Vec<_>, Vec<_>) = std::mem::take(&mut r.stats)
            .into_iter()
            .partition(|(k, _)| k.api == calibration);
        let f = &mut self.floors;
        f.stats.apply(&mut stats, &mut f.resets);
        f.nccl.apply(&mut r.nccl_stats, &mut f.resets);
        f.sizes.apply(&mut r.alloc_sizes, &mut f.resets);
        stats.extend(own);
        r.stats = stats;
        r.rows_reset = f.resets.clone();
        let i = agent_common::maps::Health::ReturnWithoutEntry as usize;
        r.health[i] = r.health[i].saturating_sub(self.edge_returns);
        if self.calibrator.is_some() {
            let mut calls: std::collections::BTreeMap<(u32, Prologue), u64> = Default::default();
            let mut unpaired: std::collections::BTreeMap<(u32, Prologue), u64> = Default::default();
            let probed = r
                .stats
                .iter()
                .filter(|(k, _)| k.api != agent_common::ProbeCookie::CALIBRATION_API)
                .map(|(k, s)| (k.tgid, k.api, s.calls, s.unpaired))
                .chain(
                    r.nccl_stats
                        .iter()
                        .map(|(k, s)| (k.tgid, k.api, s.calls, s.unpaired)),
                );
            for (tgid, api, n, u) in probed {
                let class = self.prologue_of(tgid, api);
                *calls.entry((tgid, class)).or_default() += n;
                if u > 0 {
                    *unpaired.entry((tgid, class)).or_default() += u;
                }
            }
            if let Some(c) = &mut self.calibrator {
                c.remeasure(&calls, &unpaired, &self.probes);
            }
        }
        Ok(r)
    }

    /// The prologue class of most probed functions of the CUDA driver library that process `pid`
    /// maps (of its first probed library, if it maps no CUDA one).
    fn library_prologue(&self, pid: u32) -> Option<Prologue> {
        let libs: Vec<_> = self
            .pid_files
            .get(&pid)?
            .iter()
            .filter_map(|id| self.probes.library(*id))
            .collect();
        let lib = libs
            .iter()
            .find(|l| l.file.kind == LibraryKind::Cuda)
            .or(libs.first())?;
        main_prologue(&lib.symbols.found)
    }

    /// The prologue class of the function `api` in the probed library that process `pid` maps
    /// (the host driver's class when it is not known).
    fn prologue_of(&self, pid: u32, api: u16) -> Prologue {
        let api = agent_common::ApiId(api);
        self.pid_files
            .get(&pid)
            .into_iter()
            .flatten()
            .filter_map(|id| self.probes.library(*id))
            .find_map(|l| l.symbols.found.iter().find(|s| s.api == api))
            .map(|s| s.prologue)
            .or_else(|| self.calibrator.as_ref().map(|c| c.cost.prologue))
            .unwrap_or(Prologue::Other)
    }

    /// The measured probe cost, with what was charged to each process.
    pub fn probe_cost(&self) -> Option<&ProbeCost> {
        self.calibrator.as_ref().map(|c| &c.cost)
    }
}

/// The prologue class most of a library's probed functions have.
fn main_prologue(symbols: &[crate::probes::symbols::ResolvedSymbol]) -> Option<Prologue> {
    let mut count: HashMap<Prologue, usize> = HashMap::new();
    for s in symbols {
        *count.entry(s.prologue).or_default() += 1;
    }
    count.into_iter().max_by_key(|(_, n)| *n).map(|(p, _)| p)
}

fn prologue_name(p: Prologue) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Each process's probed calls of `kind` so far, from a reading of the stats map.
/// Which processes a CUDA library's per-process kinds are attached for, given its `users` and
/// the processes under the limiter: every process while none of its users is under the limiter
/// (or more than [`PER_PROCESS_MAX`] are not), else its users that are not.
fn scope_for(users: &BTreeSet<u32>, limited: &BTreeSet<u32>) -> ProcessScope {
    let rest: BTreeSet<u32> = users.difference(limited).copied().collect();
    if rest.len() == users.len() || rest.len() > PER_PROCESS_MAX {
        ProcessScope::All
    } else {
        ProcessScope::Only(rest)
    }
}

/// The price of a hit per process (see [`Tracer::hit_prices`]).
struct HitPrices {
    classes: HashMap<u32, Prologue>,
    cost: Option<crate::model::probing::ProbeCost>,
}

impl HitPrices {
    fn price(&self, pid: u32) -> f64 {
        self.cost
            .as_ref()
            .and_then(|c| match self.classes.get(&pid) {
                Some(p) => c.class(*p),
                None => c.class_of(pid),
            })
            .map(|c| c.last_per_hit_ns)
            .unwrap_or(crate::probes::sampling::UNCALIBRATED_PER_HIT_NS)
    }
}

/// Calls per (process, API) in the probes' aggregation maps, the CUDA driver's and NCCL's (a map
/// that cannot be read counts nothing: the schedule sees no calls).
fn sampled_calls(probes: &Probes) -> Vec<(u32, u16, u64)> {
    probe_rows(probes)
        .into_iter()
        .map(|(tgid, api, calls, _)| (tgid, api, calls))
        .collect()
}

/// Every aggregation row's process, API, counted calls and unpaired returns (calls that took a
/// hit at a window's edge without being counted: [`agent_common::maps::ApiStats::unpaired`]).
fn probe_rows(probes: &Probes) -> Vec<(u32, u16, u64, u64)> {
    let cuda = probes.read_stats().unwrap_or_default();
    let nccl = probes.read_nccl_stats().unwrap_or_default();
    cuda.iter()
        .map(|(k, s)| (k.tgid, k.api, s.calls, s.unpaired))
        .chain(
            nccl.iter()
                .map(|(k, s)| (k.tgid, k.api, s.calls, s.unpaired)),
        )
        .collect()
}

/// Each process's calls of a sampled kind (of NCCL, the calls a budget samples: not a
/// communicator's creation or end).
fn calls_of_kind(
    calls: &[(u32, u16, u64)],
    kind: agent_common::ApiKind,
) -> std::collections::BTreeMap<u32, u64> {
    let mut m = std::collections::BTreeMap::new();
    for &(tgid, api, n) in calls {
        if agent_common::ApiId(api).spec().is_some_and(|spec| {
            spec.kind == kind && (kind != agent_common::ApiKind::Nccl || spec.is_nccl_call())
        }) {
            *m.entry(tgid).or_default() += n;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library's high-rate probes go to every process until one of its users is under the
    /// limiter, then to its other users only; a tenant starting more than `PER_PROCESS_MAX`
    /// processes without the limiter makes it every process again, never a link per process
    /// without bound.
    #[test]
    fn the_scope_follows_the_users_under_the_limiter_and_is_bounded() {
        let set = |r: std::ops::Range<u32>| r.collect::<BTreeSet<u32>>();
        let none = BTreeSet::new();
        assert_eq!(scope_for(&set(1..4), &none), ProcessScope::All);
        assert_eq!(
            scope_for(&set(1..4), &set(1..2)),
            ProcessScope::Only(set(2..4))
        );
        // All its users under the limiter: attached for none of them.
        assert_eq!(
            scope_for(&set(1..4), &set(1..4)),
            ProcessScope::Only(BTreeSet::new())
        );
        // Limited processes elsewhere do not matter.
        assert_eq!(scope_for(&set(1..4), &set(10..12)), ProcessScope::All);
        let many = PER_PROCESS_MAX as u32 + 2;
        assert_eq!(
            scope_for(&set(1..many), &set(1..2)),
            ProcessScope::Only(set(2..many))
        );
        assert_eq!(scope_for(&set(1..many + 1), &set(1..2)), ProcessScope::All);
    }
}
