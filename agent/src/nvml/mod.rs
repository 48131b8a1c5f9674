//! What the NVIDIA driver says about the GPUs: per device utilisation, memory, power and
//! temperature, and per process memory and GPU use (SM and memory-bandwidth busy time, from the
//! per-process samples: [`process_use`]).
//!
//! Every NVML call goes through [`NvmlBackend`] (the real one is [`library::NvmlLibrary`]), and
//! [`NvmlGpuSource`] turns its answers into a [`GpuSnapshot`]. Nothing here panics or exits on a
//! missing driver, a missing GPU or a failing call: the snapshot lists what is missing in
//! `problems`, a failing field is `None` without dropping its device, and initialisation is
//! retried at most every [`RETRY_INIT_EVERY`] (a driver can be installed or loaded later).

pub mod calls;
pub mod library;
pub mod process_use;

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::error::NvmlError;
use serde::Serialize;

pub use self::calls::{CallTimes, NvmlCall};
use self::process_use::DeviceSampler;
pub use self::process_use::PidUse;
use crate::model::gpu_use::UseWindow;

/// How often a failed NVML initialisation is tried again.
pub const RETRY_INIT_EVERY: Duration = Duration::from_secs(30);

/// A source of GPU snapshots: NVML, or a fake in tests.
pub trait GpuSource {
    fn snapshot(&mut self) -> GpuSnapshot;

    /// Reads the driver at most this often: a snapshot within it of the last reading is that
    /// reading again.
    fn set_read_interval(&mut self, _every: Duration) {}
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuSnapshot {
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, e.g. `12.2`.
    pub cuda_driver_version: Option<String>,
    pub devices: Vec<DeviceReading>,
    /// What could not be read, for people: "GPU 0: power: not supported".
    pub problems: Vec<String>,
    /// The queries made to the driver so far (since the source was created), timed.
    #[serde(skip)]
    pub calls: CallTimes,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceReading {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub utilization_gpu_pct: Option<u32>,
    pub utilization_memory_pct: Option<u32>,
    /// Bytes.
    pub memory_used: Option<u64>,
    /// Bytes.
    pub memory_total: Option<u64>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    /// Processes with a context on this GPU or with utilisation samples, by pid (host pids: the
    /// driver ignores pid namespaces).
    pub processes: Vec<GpuProcess>,
    /// The span the processes' `busy` figures cover; `None` in the first reading (it starts
    /// the window) and where per-process utilisation cannot be read (`use_unavailable`).
    pub use_window: Option<UseWindow>,
    /// Why there is no per-process utilisation on this device (MIG, vGPU, an older GPU, a
    /// failed query), for people.
    pub use_unavailable: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// Bytes of GPU memory, when the driver reports it.
    pub used_memory: Option<u64>,
    /// SM and memory-controller busy time within `use_window` (zero for a process without
    /// samples: it was idle); `None` when the device has no window.
    pub busy: Option<PidUse>,
}

/// One process's memory on a device, as NVML's running-process lists give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub used: Option<u64>,
}

/// One process utilisation sample, as the limiter's SM correction reads them too.
pub use limiter_core::sm::samples::ProcessSample;

/// The NVML calls the agent makes, by device index.
pub trait NvmlBackend {
    fn driver_version(&self) -> Result<String, NvmlError>;
    /// As NVML encodes it: 1000 * major + 10 * minor.
    fn cuda_driver_version(&self) -> Result<i32, NvmlError>;
    fn device_count(&self) -> Result<u32, NvmlError>;
    fn uuid(&self, index: u32) -> Result<String, NvmlError>;
    fn name(&self, index: u32) -> Result<String, NvmlError>;
    /// (GPU, memory) utilisation in percent.
    fn utilization_pct(&self, index: u32) -> Result<(u32, u32), NvmlError>;
    /// (used, total) bytes.
    fn memory_used_total(&self, index: u32) -> Result<(u64, u64), NvmlError>;
    fn power_mw(&self, index: u32) -> Result<u32, NvmlError>;
    fn power_limit_mw(&self, index: u32) -> Result<u32, NvmlError>;
    fn temperature_c(&self, index: u32) -> Result<u32, NvmlError>;
    fn compute_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError>;
    fn graphics_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError>;
    /// Samples taken after `since` (all buffered samples for `None`); `NVML_ERROR_NOT_FOUND`
    /// when there are none.
    fn process_utilization(
        &self,
        index: u32,
        since: Option<u64>,
    ) -> Result<Vec<ProcessSample>, NvmlError>;
}

/// Why NVML gave nothing or less than everything. Its text is what `problems` shows.
#[derive(Debug, thiserror::Error)]
pub enum NvmlProblem {
    /// The library could not be loaded: no driver, or not where it was looked for.
    #[error("NVML not found: {library} could not be loaded (no NVIDIA driver?)")]
    NotFound {
        library: String,
        #[source]
        source: NvmlError,
    },
    /// The library loaded but `nvmlInit` failed.
    #[error("NVML could not be initialised from {library}: {}", describe(source))]
    Init {
        library: String,
        #[source]
        source: NvmlError,
    },
    /// A system-wide query failed.
    #[error("NVML: {what}: {}", describe(source))]
    System {
        what: &'static str,
        #[source]
        source: NvmlError,
    },
    /// Per-process utilisation samples over 100% (seen with zombie contexts), ignored.
    #[error("GPU {index}: process utilization: {count} samples over 100% ignored")]
    SamplesOutOfRange { index: u32, count: u32 },
    /// One field of one device could not be read.
    #[error("GPU {index}: {field}: {}", describe(source))]
    Field {
        index: u32,
        field: &'static str,
        #[source]
        source: NvmlError,
    },
}

/// NVML's errors in the words `problems` uses.
fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "not supported".to_owned(),
        NvmlError::NoPermission => "no permission".to_owned(),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_owned(),
        NvmlError::GpuLost => "the GPU fell off the bus".to_owned(),
        other => other.to_string(),
    }
}

/// How a backend is opened, so that tests can open a fake.
type Opener<B> = Box<dyn FnMut() -> Result<B, NvmlProblem> + Send>;

/// An answer worth keeping: asking again would only repeat it (until the driver is reloaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lasting {
    NotSupported,
    NoPermission,
    FunctionNotFound,
}

impl Lasting {
    fn of(e: &NvmlError) -> Option<Lasting> {
        match e {
            NvmlError::NotSupported => Some(Lasting::NotSupported),
            NvmlError::NoPermission => Some(Lasting::NoPermission),
            NvmlError::FunctionNotFound => Some(Lasting::FunctionNotFound),
            _ => None,
        }
    }

    fn error(self) -> NvmlError {
        match self {
            Lasting::NotSupported => NvmlError::NotSupported,
            Lasting::NoPermission => NvmlError::NoPermission,
            Lasting::FunctionNotFound => NvmlError::FunctionNotFound,
        }
    }
}

/// A kept answer: `None` until asked, or after a failure that may pass.
type Kept<T> = Option<Result<T, Lasting>>;

/// What only changes when the driver is reloaded, a GPU comes or goes, or (the power limit) an
/// operator sets it: asked once, then again every [`RECHECK_FACTS_EVERY`] or after a failure.
struct Facts {
    checked_at: Instant,
    driver_version: Kept<String>,
    cuda_driver_version: Kept<i32>,
    /// Per device, by index: as many as the driver counted.
    devices: Vec<DeviceFacts>,
    /// A query failed in a way that may mean the driver or a GPU changed: ask everything again
    /// at the next reading.
    recheck: bool,
}

#[derive(Clone, Default)]
struct DeviceFacts {
    uuid: Kept<String>,
    name: Kept<String>,
    power_limit_mw: Kept<u32>,
}

/// How often the driver version, the device count and each device's uuid, name and power limit
/// are asked again although nothing failed (an operator may change a power limit at any time).
pub const RECHECK_FACTS_EVERY: Duration = Duration::from_secs(60);

/// Asks `query` unless `kept` holds an answer worth keeping, and keeps its answer if it is one.
/// A failure that may pass sets `recheck`.
fn fact<T: Clone>(
    kept: &mut Kept<T>,
    calls: &mut CallTimes,
    call: NvmlCall,
    recheck: &mut bool,
    query: impl FnOnce() -> Result<T, NvmlError>,
) -> Result<T, NvmlError> {
    if let Some(answer) = kept {
        return answer.clone().map_err(Lasting::error);
    }
    let answer = calls.time(call, query);
    *kept = match &answer {
        Ok(v) => Some(Ok(v.clone())),
        Err(e) => Lasting::of(e).map(Err),
    };
    *recheck |= kept.is_none();
    answer
}

/// Snapshots from NVML, re-initialising after failures.
pub struct NvmlGpuSource<B: NvmlBackend = library::NvmlLibrary> {
    open: Opener<B>,
    backend: Option<B>,
    last_attempt: Option<Instant>,
    last_failure: Option<String>,
    retry_every: Duration,
    /// Per-process sampling state per device uuid (or index).
    samplers: HashMap<String, DeviceSampler>,
    /// What is not asked at every reading; `None` before the first and after losing the driver.
    facts: Option<Facts>,
    /// Every query made, timed.
    calls: CallTimes,
    /// NVML is read at most this often: snapshots in between carry the last reading.
    read_every: Duration,
    last_read: Option<(Instant, GpuSnapshot)>,
}

impl NvmlGpuSource<library::NvmlLibrary> {
    /// NVML from the library the loader finds (`libnvidia-ml.so.1`).
    #[cfg(test)]
    pub fn system() -> Self {
        Self::with_library(std::path::PathBuf::from(library::DEFAULT_LIBRARY))
    }

    /// NVML from a given library name or path.
    #[cfg(test)]
    pub fn with_library(path: std::path::PathBuf) -> Self {
        Self::with_opener(Box::new(move || open_library(&path)), RETRY_INIT_EVERY)
    }

    /// NVML for an agent that sees the host under `host.root`: the library the loader finds
    /// (the agent's own environment, or what the NVIDIA container toolkit injected into its
    /// container), else the host's own `libnvidia-ml.so.1`, found as the host's loader would find
    /// it (its `ld.so.cache`, then the driver directories) under the host root. The host's files
    /// are root's, not a tenant's: loading the host driver's NVML is what `nvidia-smi` on the
    /// host does. Looked up again at every retry, so a driver installed later is found.
    pub fn for_host(host: crate::host::HostPaths) -> Self {
        Self::with_opener(
            Box::new(move || open_here_or_on_host(&host, open_library)),
            RETRY_INIT_EVERY,
        )
    }
}

/// Opens NVML with `open`: the name the loader searches for first, then, if the loader found
/// nothing, the host's copy under the host root.
fn open_here_or_on_host<B>(
    host: &crate::host::HostPaths,
    open: impl Fn(&Path) -> Result<B, NvmlProblem>,
) -> Result<B, NvmlProblem> {
    match open(Path::new(library::DEFAULT_LIBRARY)) {
        Err(NvmlProblem::NotFound { library, source }) => {
            match crate::discovery::host_soname(host, library::DEFAULT_LIBRARY) {
                Some(on_host) => open(&on_host),
                None => Err(NvmlProblem::NotFound { library, source }),
            }
        }
        other => other,
    }
}

/// Loads and initialises NVML from `path` (a name the loader searches for, or a path).
fn open_library(path: &Path) -> Result<library::NvmlLibrary, NvmlProblem> {
    library::NvmlLibrary::open(path).map_err(|source| {
        let library = path.display().to_string();
        match source {
            NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
                NvmlProblem::NotFound { library, source }
            }
            source => NvmlProblem::Init { library, source },
        }
    })
}

impl<B: NvmlBackend> NvmlGpuSource<B> {
    pub fn with_opener(open: Opener<B>, retry_every: Duration) -> Self {
        NvmlGpuSource {
            open,
            backend: None,
            last_attempt: None,
            last_failure: None,
            retry_every,
            samplers: HashMap::new(),
            facts: None,
            calls: CallTimes::default(),
            read_every: Duration::ZERO,
            last_read: None,
        }
    }

    /// A snapshot as of `now` (which decides whether a failed initialisation is retried).
    pub fn snapshot_at(&mut self, now: Instant) -> GpuSnapshot {
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.snapshot_with(now, wall_us)
    }

    /// As [`Self::snapshot_at`], with the CPU time NVML's sample timestamps are compared with
    /// (`CLOCK_REALTIME`, microseconds). Within [`GpuSource::set_read_interval`] of the last
    /// reading, that reading again.
    pub fn snapshot_with(&mut self, now: Instant, wall_us: u64) -> GpuSnapshot {
        if let Some((at, last)) = &self.last_read
            && now.saturating_duration_since(*at) < self.read_every
        {
            return last.clone();
        }
        let mut snap = self.read(now, wall_us);
        snap.calls = self.calls.clone();
        self.last_read = Some((now, snap.clone()));
        snap
    }

    fn read(&mut self, now: Instant, wall_us: u64) -> GpuSnapshot {
        let mut snap = GpuSnapshot::default();
        if self.backend.is_none() {
            let due = self
                .last_attempt
                .is_none_or(|at| now.saturating_duration_since(at) >= self.retry_every);
            if due {
                self.last_attempt = Some(now);
                match self.calls.time(NvmlCall::Init, || (self.open)()) {
                    Ok(b) => {
                        self.backend = Some(b);
                        self.last_failure = None;
                    }
                    Err(problem) => {
                        log::debug!("{problem}");
                        self.last_failure = Some(problem.to_string());
                    }
                }
            }
        }
        let Some(backend) = &self.backend else {
            snap.problems.push(
                self.last_failure
                    .clone()
                    .unwrap_or_else(|| "NVML not initialised".to_owned()),
            );
            return snap;
        };
        let calls = &mut self.calls;
        let mut problems = Vec::new();
        let mut problem = |p: NvmlProblem| problems.push(p.to_string());
        let due = self.facts.as_ref().is_none_or(|f| {
            f.recheck || now.saturating_duration_since(f.checked_at) >= RECHECK_FACTS_EVERY
        });
        if due {
            let count = match calls.time(NvmlCall::DeviceCount, || backend.device_count()) {
                Ok(n) => n,
                Err(source) => {
                    problem(NvmlProblem::System {
                        what: "device count",
                        source,
                    });
                    // The driver may have gone away: start over after the retry interval.
                    self.backend = None;
                    self.last_attempt = Some(now);
                    self.samplers.clear();
                    self.facts = None;
                    snap.problems = problems;
                    return snap;
                }
            };
            self.facts = Some(Facts {
                checked_at: now,
                driver_version: None,
                cuda_driver_version: None,
                devices: vec![DeviceFacts::default(); count as usize],
                recheck: false,
            });
        }
        let facts = self.facts.as_mut().expect("facts set above");
        let mut recheck = false;
        match fact(
            &mut facts.driver_version,
            calls,
            NvmlCall::DriverVersion,
            &mut recheck,
            || backend.driver_version(),
        ) {
            Ok(v) => snap.driver_version = Some(v),
            Err(source) => problem(NvmlProblem::System {
                what: "driver version",
                source,
            }),
        }
        match fact(
            &mut facts.cuda_driver_version,
            calls,
            NvmlCall::CudaDriverVersion,
            &mut recheck,
            || backend.cuda_driver_version(),
        ) {
            Ok(v) => snap.cuda_driver_version = Some(format!("{}.{}", v / 1000, (v % 1000) / 10)),
            Err(source) => problem(NvmlProblem::System {
                what: "CUDA driver version",
                source,
            }),
        }
        let mut devices = Vec::with_capacity(facts.devices.len());
        for (index, device_facts) in (0u32..).zip(facts.devices.iter_mut()) {
            let mut q = Queries {
                backend,
                index,
                calls,
                facts: device_facts,
                recheck: &mut recheck,
                problem: &mut problem,
            };
            devices.push(q.read_device(wall_us, &mut self.samplers));
        }
        facts.recheck |= recheck;
        // A query failed in a way that may mean the driver went away: find out now, as a
        // reading that asked for the count would have.
        if recheck
            && !due
            && let Err(source) = calls.time(NvmlCall::DeviceCount, || backend.device_count())
        {
            problem(NvmlProblem::System {
                what: "device count",
                source,
            });
            self.backend = None;
            self.last_attempt = Some(now);
            self.samplers.clear();
            self.facts = None;
            snap.problems = problems;
            return snap;
        }
        // Devices that went away take their state with them.
        self.samplers.retain(|key, _| {
            devices
                .iter()
                .any(|d| device_key(d.uuid.as_deref(), d.index) == *key)
        });
        snap.devices = devices;
        snap.problems = problems;
        snap
    }
}

impl<B: NvmlBackend> GpuSource for NvmlGpuSource<B> {
    fn snapshot(&mut self) -> GpuSnapshot {
        self.snapshot_at(Instant::now())
    }

    fn set_read_interval(&mut self, every: Duration) {
        self.read_every = every;
    }
}

/// The key of a device's sampling state: its uuid, else its index.
fn device_key(uuid: Option<&str>, index: u32) -> String {
    uuid.map_or_else(|| format!("index {index}"), str::to_owned)
}

/// The queries of one reading of one device.
struct Queries<'a, B, P> {
    backend: &'a B,
    index: u32,
    calls: &'a mut CallTimes,
    facts: &'a mut DeviceFacts,
    /// Set when a query failed in a way that may pass (the GPU or the driver may have gone).
    recheck: &'a mut bool,
    problem: &'a mut P,
}

impl<B: NvmlBackend, P: FnMut(NvmlProblem)> Queries<'_, B, P> {
    /// Makes `call`; a failure is a problem of `field`.
    fn ask<T>(
        &mut self,
        call: NvmlCall,
        field: &'static str,
        query: impl FnOnce(&B, u32) -> Result<T, NvmlError>,
    ) -> Option<T> {
        let (backend, index) = (self.backend, self.index);
        let answer = self.calls.time(call, || query(backend, index));
        answer.map_err(|e| self.failed(field, e)).ok()
    }

    fn failed(&mut self, field: &'static str, source: NvmlError) {
        *self.recheck |= Lasting::of(&source).is_none();
        (self.problem)(NvmlProblem::Field {
            index: self.index,
            field,
            source,
        });
    }

    /// A kept fact, asked with `call` if it is not kept.
    fn fact<T: Clone>(
        &mut self,
        kept: fn(&mut DeviceFacts) -> &mut Kept<T>,
        call: NvmlCall,
        field: &'static str,
        query: impl FnOnce(&B, u32) -> Result<T, NvmlError>,
    ) -> Option<T> {
        let (backend, index) = (self.backend, self.index);
        let answer = fact(kept(self.facts), self.calls, call, self.recheck, || {
            query(backend, index)
        });
        answer
            .map_err(|e| {
                (self.problem)(NvmlProblem::Field {
                    index,
                    field,
                    source: e,
                })
            })
            .ok()
    }

    fn read_device(
        &mut self,
        wall_us: u64,
        samplers: &mut HashMap<String, DeviceSampler>,
    ) -> DeviceReading {
        let index = self.index;
        let mut d = DeviceReading {
            index,
            ..DeviceReading::default()
        };
        d.uuid = self.fact(|f| &mut f.uuid, NvmlCall::Uuid, "uuid", B::uuid);
        d.name = self.fact(|f| &mut f.name, NvmlCall::Name, "name", B::name);
        if let Some((gpu, mem)) = self.ask(NvmlCall::Utilization, "utilization", B::utilization_pct)
        {
            (d.utilization_gpu_pct, d.utilization_memory_pct) = (Some(gpu), Some(mem));
        }
        if let Some((used, total)) = self.ask(NvmlCall::Memory, "memory", B::memory_used_total) {
            (d.memory_used, d.memory_total) = (Some(used), Some(total));
        }
        d.power_mw = self.ask(NvmlCall::Power, "power", B::power_mw);
        d.power_limit_mw = self.fact(
            |f| &mut f.power_limit_mw,
            NvmlCall::PowerLimit,
            "power limit",
            B::power_limit_mw,
        );
        d.temperature_c = self.ask(NvmlCall::Temperature, "temperature", B::temperature_c);

        // Memory from the compute and graphics lists; a process in both is counted once.
        let mut by_pid: BTreeMap<u32, GpuProcess> = BTreeMap::new();
        for (call, what, query) in [
            (
                NvmlCall::ComputeProcesses,
                "compute processes",
                B::compute_processes as fn(&B, u32) -> _,
            ),
            (
                NvmlCall::GraphicsProcesses,
                "graphics processes",
                B::graphics_processes,
            ),
        ] {
            for p in self.ask(call, what, query).unwrap_or_default() {
                let entry = by_pid.entry(p.pid).or_insert(GpuProcess {
                    pid: p.pid,
                    used_memory: None,
                    busy: None,
                });
                entry.used_memory = entry.used_memory.max(p.used);
            }
        }
        // GPU use since the previous reading (see `process_use`).
        let sampler = samplers
            .entry(device_key(d.uuid.as_deref(), index))
            .or_default();
        let since = sampler.since();
        let (backend, calls) = (self.backend, &mut *self.calls);
        let samples = match calls.time(NvmlCall::ProcessUtilization, || {
            backend.process_utilization(index, since)
        }) {
            Ok(samples) => Ok(samples),
            // "Not found": no process was busy since `since`.
            Err(NvmlError::NotFound) => Ok(vec![]),
            Err(e) => Err(e),
        };
        let mut out_of_range = 0;
        match samples {
            Ok(samples) => {
                let reading = sampler.fold(wall_us, &samples);
                out_of_range = reading.out_of_range;
                if let Some(window) = reading.window {
                    d.use_window = Some(window);
                    for p in by_pid.values_mut() {
                        p.busy = Some(PidUse::default());
                    }
                    for (pid, used) in reading.by_pid {
                        by_pid
                            .entry(pid)
                            .or_insert(GpuProcess {
                                pid,
                                used_memory: None,
                                busy: None,
                            })
                            .busy = Some(used);
                    }
                }
            }
            Err(e) => {
                sampler.reset();
                d.use_unavailable = Some(match e {
                    NvmlError::NotSupported => {
                        "not supported on this device (MIG mode, a vGPU guest or an older GPU)"
                            .into()
                    }
                    ref other => describe(other),
                });
                self.failed("process utilization", e);
            }
        }
        if out_of_range > 0 {
            (self.problem)(NvmlProblem::SamplesOutOfRange {
                index,
                count: out_of_range,
            });
        }
        d.processes = by_pid.into_values().collect();
        d
    }
}

#[cfg(test)]
mod tests;
