//! What the NVIDIA driver says about the GPUs: per device utilisation, memory, power and
//! temperature, and per process memory and GPU use (SM and memory-bandwidth busy time, from the
//! per-process samples: [`process_use`]).
//!
//! Every NVML call goes through [`NvmlBackend`] (the real one is [`library::NvmlLibrary`]), and
//! [`NvmlGpuSource`] turns its answers into a [`GpuSnapshot`]. Nothing here panics or exits on a
//! missing driver, a missing GPU or a failing call: the snapshot lists what is missing in
//! `problems`, a failing field is `None` without dropping its device, and initialisation is
//! retried at most every [`RETRY_INIT_EVERY`] (a driver can be installed or loaded later).

mod backend;
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

pub use self::backend::{NvmlBackend, ProcessSample};
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
mod tests {
    use std::{
        cell::{Cell, RefCell},
        path::{Path, PathBuf},
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
    };

    use super::{backend::ProcessMemory, *};

    /// A fake GPU: `None` fields answer "not supported".
    #[derive(Clone, Default)]
    struct FakeDevice {
        uuid: Option<String>,
        power_mw: Option<u32>,
        compute: Vec<ProcessMemory>,
        graphics: Vec<ProcessMemory>,
        samples: RefCell<Vec<ProcessSample>>,
        /// What the process utilisation query fails with instead of answering.
        utilization_error: Option<fn() -> NvmlError>,
    }

    #[derive(Default)]
    struct FakeNvml {
        devices: Vec<FakeDevice>,
        /// The `since` argument of each process utilisation call.
        asked_since: RefCell<Vec<Option<u64>>>,
        /// Every query made, in order.
        asked: RefCell<Vec<NvmlCall>>,
        /// Queries that fail, by kind, with what they fail with (every device).
        failing: RefCell<BTreeMap<NvmlCall, fn() -> NvmlError>>,
        /// Every query fails with this (the driver went away).
        gone: Cell<Option<fn() -> NvmlError>>,
        /// Queries that take this long, by kind.
        slow: BTreeMap<NvmlCall, Duration>,
    }

    impl FakeNvml {
        /// Logs a query of kind `call`, and fails it if it is set to fail.
        fn query(&self, call: NvmlCall) -> Result<(), NvmlError> {
            self.asked.borrow_mut().push(call);
            if let Some(took) = self.slow.get(&call) {
                std::thread::sleep(*took);
            }
            match self
                .gone
                .get()
                .or(self.failing.borrow().get(&call).copied())
            {
                Some(e) => Err(e()),
                None => Ok(()),
            }
        }

        /// How many queries of each kind were made since the last time this was asked.
        fn take_asked(&self) -> BTreeMap<NvmlCall, u64> {
            let mut n = BTreeMap::new();
            for c in self.asked.take() {
                *n.entry(c).or_default() += 1;
            }
            n
        }
    }

    fn or_unsupported<T: Clone>(v: &Option<T>) -> Result<T, NvmlError> {
        v.clone().ok_or(NvmlError::NotSupported)
    }

    impl NvmlBackend for FakeNvml {
        fn driver_version(&self) -> Result<String, NvmlError> {
            self.query(NvmlCall::DriverVersion)?;
            Ok("550.54.15".into())
        }
        fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
            self.query(NvmlCall::CudaDriverVersion)?;
            Ok(12040)
        }
        fn device_count(&self) -> Result<u32, NvmlError> {
            self.query(NvmlCall::DeviceCount)?;
            Ok(self.devices.len() as u32)
        }
        fn uuid(&self, index: u32) -> Result<String, NvmlError> {
            self.query(NvmlCall::Uuid)?;
            or_unsupported(&self.devices[index as usize].uuid)
        }
        fn name(&self, _: u32) -> Result<String, NvmlError> {
            self.query(NvmlCall::Name)?;
            Ok("NVIDIA H100 80GB HBM3".into())
        }
        fn utilization_pct(&self, _: u32) -> Result<(u32, u32), NvmlError> {
            self.query(NvmlCall::Utilization)?;
            Ok((87, 40))
        }
        fn memory_used_total(&self, _: u32) -> Result<(u64, u64), NvmlError> {
            self.query(NvmlCall::Memory)?;
            Ok((3 << 30, 80 << 30))
        }
        fn power_mw(&self, index: u32) -> Result<u32, NvmlError> {
            self.query(NvmlCall::Power)?;
            or_unsupported(&self.devices[index as usize].power_mw)
        }
        fn power_limit_mw(&self, _: u32) -> Result<u32, NvmlError> {
            self.query(NvmlCall::PowerLimit)?;
            Err(NvmlError::NoPermission)
        }
        fn temperature_c(&self, _: u32) -> Result<u32, NvmlError> {
            self.query(NvmlCall::Temperature)?;
            Ok(51)
        }
        fn compute_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
            self.query(NvmlCall::ComputeProcesses)?;
            Ok(self.devices[index as usize].compute.clone())
        }
        fn graphics_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
            self.query(NvmlCall::GraphicsProcesses)?;
            Ok(self.devices[index as usize].graphics.clone())
        }
        fn process_utilization(
            &self,
            index: u32,
            since: Option<u64>,
        ) -> Result<Vec<ProcessSample>, NvmlError> {
            self.query(NvmlCall::ProcessUtilization)?;
            self.asked_since.borrow_mut().push(since);
            let device = &self.devices[index as usize];
            if let Some(e) = device.utilization_error {
                return Err(e());
            }
            let samples: Vec<_> = device
                .samples
                .borrow()
                .iter()
                .filter(|s| since.is_none_or(|t| s.timestamp_us > t))
                .cloned()
                .collect();
            if samples.is_empty() {
                Err(NvmlError::NotFound)
            } else {
                Ok(samples)
            }
        }
    }

    const SEC: u64 = 1_000_000;

    fn sample(pid: u32, timestamp_us: u64, sm_util_pct: u32) -> ProcessSample {
        ProcessSample {
            pid,
            timestamp_us,
            sm_util_pct,
            mem_util_pct: sm_util_pct / 2,
        }
    }

    fn two_gpus() -> FakeNvml {
        FakeNvml {
            devices: vec![
                FakeDevice {
                    uuid: Some("GPU-a".into()),
                    power_mw: Some(312_000),
                    compute: vec![
                        ProcessMemory {
                            pid: 200,
                            used: Some(1 << 30),
                        },
                        ProcessMemory {
                            pid: 100,
                            used: None,
                        },
                    ],
                    graphics: vec![ProcessMemory {
                        pid: 200,
                        used: Some(1 << 30),
                    }],
                    samples: RefCell::new(vec![
                        sample(200, 99 * SEC + 10, 30),
                        sample(200, 99 * SEC + 20, 60),
                        sample(300, 99 * SEC + 15, 5),
                    ]),
                    ..FakeDevice::default()
                },
                FakeDevice::default(),
            ],
            ..FakeNvml::default()
        }
    }

    /// A source that opens `fake` once; a second open would be a bug in the retry logic.
    fn source_of(fake: FakeNvml) -> NvmlGpuSource<FakeNvml> {
        let mut once = Some(fake);
        NvmlGpuSource::with_opener(
            Box::new(move || {
                once.take().ok_or(NvmlProblem::System {
                    what: "second open",
                    source: NvmlError::Unknown,
                })
            }),
            RETRY_INIT_EVERY,
        )
    }

    fn process(pid: u32, used_memory: Option<u64>, busy: Option<PidUse>) -> GpuProcess {
        GpuProcess {
            pid,
            used_memory,
            busy,
        }
    }

    #[test]
    fn reads_devices_fields_and_processes() {
        let mut source = source_of(two_gpus());
        let snap = source.snapshot_with(Instant::now(), 100 * SEC);
        assert_eq!(snap.driver_version.as_deref(), Some("550.54.15"));
        assert_eq!(snap.cuda_driver_version.as_deref(), Some("12.4"));
        assert_eq!(snap.devices.len(), 2);
        let gpu0 = &snap.devices[0];
        assert_eq!(gpu0.uuid.as_deref(), Some("GPU-a"));
        assert_eq!(gpu0.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(
            (gpu0.utilization_gpu_pct, gpu0.utilization_memory_pct),
            (Some(87), Some(40))
        );
        assert_eq!(
            (gpu0.memory_used, gpu0.memory_total),
            (Some(3 << 30), Some(80 << 30))
        );
        assert_eq!(gpu0.power_mw, Some(312_000));
        assert_eq!(gpu0.power_limit_mw, None);
        assert_eq!(gpu0.temperature_c, Some(51));
        // The first reading starts the utilisation window: memory now, use from the next reading.
        assert_eq!(
            gpu0.processes,
            vec![process(100, None, None), process(200, Some(1 << 30), None)]
        );
        assert_eq!(
            (gpu0.use_window, gpu0.use_unavailable.as_deref()),
            (None, None)
        );
        // A failing field leaves the device in place and says what is missing.
        let gpu1 = &snap.devices[1];
        assert_eq!((gpu1.uuid.as_deref(), gpu1.power_mw), (None, None));
        assert_eq!(gpu1.temperature_c, Some(51));
        assert!(
            snap.problems
                .contains(&"GPU 1: power: not supported".to_owned()),
            "{:?}",
            snap.problems
        );
        assert!(
            snap.problems
                .contains(&"GPU 1: uuid: not supported".to_owned())
        );
        assert!(
            snap.problems
                .contains(&"GPU 0: power limit: no permission".to_owned())
        );
        // "No samples since" is not a problem.
        assert!(
            !snap.problems.iter().any(|p| p.contains("utilization")),
            "{:?}",
            snap.problems
        );
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(
            json["devices"][0]["processes"][1]["used_memory"],
            1u64 << 30
        );
    }

    #[test]
    fn gpu_use_per_process_over_the_window_between_readings() {
        let mut source = source_of(two_gpus());
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        // The next second: process 200 at 60% in six samples of 1/6 s, process 300 (no context any
        // more: it exited) busy in one, process 100 idle (no samples).
        {
            let backend = source.backend.as_ref().unwrap();
            let mut samples = backend.devices[0].samples.borrow_mut();
            samples.extend((1..=6).map(|i| sample(200, 100 * SEC + i * SEC / 6, 60)));
            samples.push(sample(300, 100 * SEC + SEC / 2, 30));
        }
        let snap = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        let gpu0 = &snap.devices[0];
        let w = gpu0.use_window.expect("a window");
        assert_eq!((w.from_unix_us, w.to_unix_us), (100 * SEC, 101 * SEC));
        assert!(w.sample_period_us.abs_diff(SEC / 6) <= 1, "{w:?}");
        let busy = |pid: u32| {
            gpu0.processes
                .iter()
                .find(|p| p.pid == pid)
                .and_then(|p| p.busy)
                .unwrap_or_else(|| panic!("{pid}: {:?}", gpu0.processes))
        };
        assert_eq!(busy(100), PidUse::default(), "idle: 0, not unknown");
        let b200 = busy(200);
        assert_eq!(b200.samples, 6);
        assert!(b200.sm_busy_us.abs_diff(600_000) <= 6, "{b200:?}");
        assert!(b200.mem_busy_us.abs_diff(300_000) <= 6, "{b200:?}");
        assert!(busy(300).sm_busy_us.abs_diff(SEC / 6 * 30 / 100) <= 1);
        // Device 0 (uuid GPU-a) asked from nothing, then from the first reading minus the
        // look-back; device 1 likewise.
        let backend = source.backend.as_ref().unwrap();
        let since = Some(100 * SEC - process_use::LOOKBACK_US);
        assert_eq!(
            *backend.asked_since.borrow(),
            vec![None, None, since, since]
        );
        // Device 1 had no samples at all ("not found"): a window in which everything was idle.
        assert!(snap.devices[1].use_window.is_some());
        assert!(snap.problems.iter().all(|p| !p.contains("utilization")));
    }

    #[test]
    fn unsupported_or_failing_per_process_utilisation_is_n_a_never_zero() {
        let mut fake = two_gpus();
        fake.devices[0].utilization_error = Some(|| NvmlError::NotSupported);
        fake.devices[1].utilization_error = Some(|| NvmlError::Unknown);
        let mut source = source_of(fake);
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        let snap = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        let gpu0 = &snap.devices[0];
        assert_eq!(gpu0.use_window, None);
        assert!(
            gpu0.use_unavailable
                .as_deref()
                .is_some_and(|u| u.contains("MIG")),
            "{gpu0:?}"
        );
        assert!(gpu0.processes.iter().all(|p| p.busy.is_none()), "{gpu0:?}");
        assert!(
            gpu0.processes.iter().any(|p| p.used_memory.is_some()),
            "memory is still read"
        );
        assert!(
            snap.problems
                .contains(&"GPU 0: process utilization: not supported".to_owned()),
            "{:?}",
            snap.problems
        );
        assert!(snap.devices[1].use_unavailable.is_some());
    }

    #[test]
    fn samples_out_of_range_are_ignored_and_said() {
        let mut source = source_of(two_gpus());
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        source.backend.as_ref().unwrap().devices[0]
            .samples
            .borrow_mut()
            .push(sample(200, 100 * SEC + 5, 4_000_000_000));
        let snap = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        assert!(
            snap.problems
                .contains(&"GPU 0: process utilization: 1 samples over 100% ignored".to_owned()),
            "{:?}",
            snap.problems
        );
        let p200 = snap.devices[0].processes.iter().find(|p| p.pid == 200);
        assert_eq!(p200.and_then(|p| p.busy), Some(PidUse::default()));
    }

    #[test]
    fn failed_initialisation_is_retried_every_30_seconds() {
        let opens = Arc::new(AtomicUsize::new(0));
        let mut source: NvmlGpuSource<FakeNvml> = NvmlGpuSource::with_opener(
            Box::new({
                let opens = opens.clone();
                move || {
                    if opens.fetch_add(1, Ordering::SeqCst) == 0 {
                        Err(NvmlProblem::Init {
                            library: "libnvidia-ml.so.1".into(),
                            source: NvmlError::DriverNotLoaded,
                        })
                    } else {
                        Ok(two_gpus())
                    }
                }
            }),
            RETRY_INIT_EVERY,
        );
        let t0 = Instant::now();
        let failed = source.snapshot_at(t0);
        assert!(failed.devices.is_empty());
        assert_eq!(
            failed.problems,
            vec![
                "NVML could not be initialised from libnvidia-ml.so.1: the NVIDIA driver is not loaded"
            ]
        );
        let still = source.snapshot_at(t0 + Duration::from_secs(10));
        assert_eq!(still.problems, failed.problems);
        assert_eq!(opens.load(Ordering::SeqCst), 1);
        let recovered = source.snapshot_at(t0 + Duration::from_secs(31));
        assert_eq!(opens.load(Ordering::SeqCst), 2);
        assert_eq!(recovered.devices.len(), 2);
    }

    #[test]
    fn no_library_is_a_clear_problem() {
        let mut source =
            NvmlGpuSource::with_library(PathBuf::from("/nonexistent/libnvidia-ml.so.1"));
        let snap = source.snapshot();
        assert!(snap.devices.is_empty());
        assert_eq!(
            snap.problems,
            vec![
                "NVML not found: /nonexistent/libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)"
            ]
        );
    }

    /// The Debian `libnvidia-ml1` library, on a machine without a GPU or driver: `nvmlInit` fails
    /// and the snapshot says so.
    #[test]
    fn real_nvml_without_a_gpu_reports_a_problem() {
        let lib = Path::new("/opt/vgpu-agent/test-driver/libnvidia-ml.so.1");
        if !lib.exists() {
            eprintln!("skipping: {} is not installed", lib.display());
            return;
        }
        let mut source = NvmlGpuSource::with_library(lib.to_owned());
        let snap = source.snapshot();
        assert!(snap.devices.is_empty(), "{snap:?}");
        assert_eq!(snap.problems.len(), 1, "{snap:?}");
        assert!(
            snap.problems[0].starts_with(&format!(
                "NVML could not be initialised from {}",
                lib.display()
            )),
            "{snap:?}"
        );
        // A second snapshot within the retry interval does not call into the library again.
        assert_eq!(source.snapshot().problems, snap.problems);
    }

    /// Whatever this machine has (a driver or not), the default source answers without panicking
    /// and says something: devices, or why there are none.
    #[test]
    fn the_system_library_answers_either_way() {
        assert_eq!(library::DEFAULT_LIBRARY, "libnvidia-ml.so.1");
        let snap = NvmlGpuSource::system().snapshot();
        assert!(
            !snap.devices.is_empty() || !snap.problems.is_empty(),
            "{snap:?}"
        );
    }

    /// In a container that sees the host under `--host-root` and has no NVML of its own (the
    /// DaemonSet's image), the host driver's NVML is opened where the host's loader would find it;
    /// what the loader finds itself comes first; without either, the loader's miss is reported.
    #[test]
    fn the_host_nvml_is_opened_when_the_loader_finds_none() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("usr/lib/x86_64-linux-gnu/nvidia/current");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnvidia-ml.so.1"), b"\x7fELF").unwrap();
        let host = crate::host::HostPaths::system().with_root(root.path().to_owned());
        let not_found = |p: &Path| NvmlProblem::NotFound {
            library: p.display().to_string(),
            source: NvmlError::LibraryNotFound,
        };
        let tried = RefCell::new(Vec::new());
        let loader_has_none = |p: &Path| {
            tried.borrow_mut().push(p.to_owned());
            if p.is_absolute() {
                Ok(p.to_owned())
            } else {
                Err(not_found(p))
            }
        };
        assert_eq!(
            open_here_or_on_host(&host, loader_has_none).unwrap(),
            dir.join("libnvidia-ml.so.1")
        );
        assert_eq!(
            tried.take(),
            [
                PathBuf::from("libnvidia-ml.so.1"),
                dir.join("libnvidia-ml.so.1")
            ]
        );
        let loader_has_one = |p: &Path| Ok::<_, NvmlProblem>(p.to_owned());
        assert_eq!(
            open_here_or_on_host(&host, loader_has_one).unwrap(),
            PathBuf::from("libnvidia-ml.so.1")
        );
        let empty = tempfile::tempdir().unwrap();
        let host = crate::host::HostPaths::system().with_root(empty.path().to_owned());
        let err = open_here_or_on_host(&host, |p: &Path| Err::<(), _>(not_found(p))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NVML not found: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)"
        );
    }

    /// What a reading of `devices` GPUs asks of the driver besides the facts: each device's
    /// changing fields and processes.
    fn changing_queries(devices: u64) -> BTreeMap<NvmlCall, u64> {
        [
            NvmlCall::Utilization,
            NvmlCall::Memory,
            NvmlCall::Power,
            NvmlCall::Temperature,
            NvmlCall::ComputeProcesses,
            NvmlCall::GraphicsProcesses,
            NvmlCall::ProcessUtilization,
        ]
        .into_iter()
        .map(|c| (c, devices))
        .collect()
    }

    /// The facts a reading of `devices` GPUs asks for when it asks for them.
    fn fact_queries(devices: u64) -> BTreeMap<NvmlCall, u64> {
        let mut n = changing_queries(devices);
        n.extend([
            (NvmlCall::DriverVersion, 1),
            (NvmlCall::CudaDriverVersion, 1),
            (NvmlCall::DeviceCount, 1),
            (NvmlCall::Uuid, devices),
            (NvmlCall::Name, devices),
            (NvmlCall::PowerLimit, devices),
        ]);
        n
    }

    fn backend(source: &NvmlGpuSource<FakeNvml>) -> &FakeNvml {
        source.backend.as_ref().expect("NVML open")
    }

    /// The driver and CUDA versions, the device count and each device's uuid, name and power limit
    /// are asked once; later readings ask only what changes, and show the same facts and the same
    /// lasting problems (a field the device does not support, a permission it does not give).
    #[test]
    fn a_second_reading_asks_only_what_can_change() {
        let mut source = source_of(two_gpus());
        let t0 = Instant::now();
        let first = source.snapshot_with(t0, 100 * SEC);
        assert_eq!(backend(&source).take_asked(), fact_queries(2));
        let second = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        assert_eq!(backend(&source).take_asked(), changing_queries(2));
        assert_eq!(second.driver_version, first.driver_version);
        assert_eq!(second.cuda_driver_version, first.cuda_driver_version);
        assert_eq!(second.devices.len(), 2);
        for (a, b) in first.devices.iter().zip(&second.devices) {
            assert_eq!(
                (&a.uuid, &a.name, a.power_limit_mw),
                (&b.uuid, &b.name, b.power_limit_mw)
            );
        }
        assert_eq!(second.devices[0].uuid.as_deref(), Some("GPU-a"));
        assert_eq!(second.problems, first.problems);
        assert!(
            second
                .problems
                .contains(&"GPU 0: power limit: no permission".to_owned())
                && second
                    .problems
                    .contains(&"GPU 1: uuid: not supported".to_owned()),
            "{:?}",
            second.problems
        );
    }

    /// The facts are asked again every minute (a power limit can be changed, a GPU can come): a
    /// GPU added shows within a minute, with its uuid and name.
    #[test]
    fn the_facts_are_asked_again_every_minute() {
        let mut source = source_of(two_gpus());
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        backend(&source).take_asked();
        source.backend.as_mut().unwrap().devices.push(FakeDevice {
            uuid: Some("GPU-c".into()),
            ..FakeDevice::default()
        });
        let before = source.snapshot_with(t0 + Duration::from_secs(30), 130 * SEC);
        assert_eq!(before.devices.len(), 2, "the count is kept for a minute");
        assert_eq!(backend(&source).take_asked(), changing_queries(2));
        let after = source.snapshot_with(t0 + RECHECK_FACTS_EVERY, 160 * SEC);
        assert_eq!(backend(&source).take_asked(), fact_queries(3));
        assert_eq!(after.devices.len(), 3);
        assert_eq!(after.devices[2].uuid.as_deref(), Some("GPU-c"));
        // The new minute starts from that reading.
        source.snapshot_with(t0 + RECHECK_FACTS_EVERY + Duration::from_secs(1), 161 * SEC);
        assert_eq!(backend(&source).take_asked(), changing_queries(3));
    }

    /// A query that fails in a way that may pass (not "not supported" or "no permission") has
    /// everything asked again at the next reading; a fact that failed so is not kept.
    #[test]
    fn a_failure_that_may_pass_asks_the_facts_again() {
        let mut source = source_of(two_gpus());
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        let fake = backend(&source);
        fake.take_asked();
        fake.failing
            .borrow_mut()
            .insert(NvmlCall::Temperature, || NvmlError::Unknown);
        let failed = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        assert_eq!(failed.devices[0].temperature_c, None);
        assert!(
            failed
                .problems
                .iter()
                .any(|p| p.starts_with("GPU 0: temperature:")),
            "{:?}",
            failed.problems
        );
        // The reading checked that the driver is still there: the count.
        let mut asked = changing_queries(2);
        asked.insert(NvmlCall::DeviceCount, 1);
        assert_eq!(backend(&source).take_asked(), asked);
        let fake = backend(&source);
        fake.failing.borrow_mut().clear();
        fake.failing
            .borrow_mut()
            .insert(NvmlCall::Name, || NvmlError::GpuLost);
        let lost = source.snapshot_with(t0 + Duration::from_secs(2), 102 * SEC);
        assert_eq!(backend(&source).take_asked(), fact_queries(2));
        assert_eq!(lost.devices[0].name, None);
        assert!(
            lost.problems
                .contains(&"GPU 0: name: the GPU fell off the bus".to_owned()),
            "{:?}",
            lost.problems
        );
        // The name was not kept: it is asked again, and kept once answered.
        backend(&source).failing.borrow_mut().clear();
        let back = source.snapshot_with(t0 + Duration::from_secs(3), 103 * SEC);
        assert_eq!(backend(&source).take_asked(), fact_queries(2));
        assert_eq!(
            back.devices[0].name.as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        source.snapshot_with(t0 + Duration::from_secs(4), 104 * SEC);
        assert_eq!(backend(&source).take_asked(), changing_queries(2));
    }

    /// When the driver goes away between readings, the reading that sees it fails says so and drops
    /// NVML, as before the facts were kept; NVML is opened again after the retry interval.
    #[test]
    fn a_driver_that_goes_away_is_dropped_at_the_reading_that_sees_it() {
        let opens = Arc::new(AtomicUsize::new(0));
        let mut source: NvmlGpuSource<FakeNvml> = NvmlGpuSource::with_opener(
            Box::new({
                let opens = opens.clone();
                move || {
                    opens.fetch_add(1, Ordering::SeqCst);
                    Ok(two_gpus())
                }
            }),
            RETRY_INIT_EVERY,
        );
        let t0 = Instant::now();
        assert_eq!(source.snapshot_with(t0, 100 * SEC).devices.len(), 2);
        backend(&source)
            .gone
            .set(Some(|| NvmlError::DriverNotLoaded));
        let gone = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        assert!(gone.devices.is_empty(), "{gone:?}");
        assert!(
            gone.problems
                .contains(&"NVML: device count: the NVIDIA driver is not loaded".to_owned()),
            "{:?}",
            gone.problems
        );
        assert!(source.backend.is_none() && source.facts.is_none());
        assert!(source.samplers.is_empty());
        source.snapshot_with(t0 + Duration::from_secs(2), 102 * SEC);
        assert_eq!(
            opens.load(Ordering::SeqCst),
            1,
            "not before the retry interval"
        );
        let back = source.snapshot_with(t0 + Duration::from_secs(1) + RETRY_INIT_EVERY, 131 * SEC);
        assert_eq!(opens.load(Ordering::SeqCst), 2);
        assert_eq!(back.devices.len(), 2);
        assert_eq!(backend(&source).take_asked(), fact_queries(2));
    }

    /// Every query is timed by kind, the failed ones and the opening included: the tallies count
    /// exactly the queries the driver saw, and a slow query's time shows in its total and maximum.
    #[test]
    fn every_query_is_timed_by_kind() {
        let slow = Duration::from_millis(3);
        let mut fake = two_gpus();
        fake.slow.insert(NvmlCall::ProcessUtilization, slow);
        let mut source = source_of(fake);
        let t0 = Instant::now();
        source.snapshot_with(t0, 100 * SEC);
        let snap = source.snapshot_with(t0 + Duration::from_secs(1), 101 * SEC);
        let mut asked = fact_queries(2);
        for (call, n) in changing_queries(2) {
            *asked.entry(call).or_default() += n;
        }
        assert_eq!(backend(&source).take_asked(), asked);
        for (call, tally) in snap.calls.iter() {
            let expected = if call == NvmlCall::Init {
                1
            } else {
                asked.get(&call).copied().unwrap_or(0)
            };
            assert_eq!(tally.calls, expected, "{call:?}");
            assert!(tally.max_ns <= tally.total_ns, "{call:?}: {tally:?}");
        }
        let pu = snap.calls.get(NvmlCall::ProcessUtilization);
        assert_eq!(pu.calls, 4);
        let slow_ns = slow.as_nanos() as u64;
        assert!(pu.total_ns >= 4 * slow_ns, "{pu:?}");
        assert!(pu.max_ns >= slow_ns, "{pu:?}");
        eprintln!("process_utilization with a {slow:?} fake: {pu:?}");
        // The names are the fixed set /metrics labels with.
        let names: Vec<&str> = NvmlCall::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), 14);
        assert!(names.contains(&"process_utilization") && names.contains(&"init"));
    }

    /// With a read interval longer than the snapshots', the snapshots in between carry the last
    /// reading without asking the driver anything; the next reading measures GPU use over the whole
    /// time since the previous one (the per-process estimate weighs samples by the time they cover,
    /// not by the number of readings).
    #[test]
    fn a_read_interval_carries_the_last_reading_and_measures_use_over_it() {
        let mut source = source_of(two_gpus());
        source.set_read_interval(Duration::from_secs(5));
        let t0 = Instant::now();
        let first = source.snapshot_with(t0, 100 * SEC);
        backend(&source).take_asked();
        {
            // Five seconds of process 200 at 60%, one sample every 1/6 s.
            let mut samples = backend(&source).devices[0].samples.borrow_mut();
            samples.extend((1..=30).map(|i| sample(200, 100 * SEC + i * SEC / 6, 60)));
        }
        for s in 1..5 {
            let carried = source.snapshot_with(t0 + Duration::from_secs(s), (100 + s) * SEC);
            assert_eq!(carried, first, "snapshot {s}");
        }
        assert!(
            backend(&source).take_asked().is_empty(),
            "nothing asked in between"
        );
        let snap = source.snapshot_with(t0 + Duration::from_secs(5), 105 * SEC);
        assert_eq!(backend(&source).take_asked(), changing_queries(2));
        let gpu0 = &snap.devices[0];
        let w = gpu0.use_window.expect("a window");
        assert_eq!((w.from_unix_us, w.to_unix_us), (100 * SEC, 105 * SEC));
        let b200 = gpu0
            .processes
            .iter()
            .find(|p| p.pid == 200)
            .and_then(|p| p.busy)
            .expect("process 200 measured");
        assert_eq!(b200.samples, 30);
        assert!(b200.sm_busy_us.abs_diff(3 * SEC) <= 30, "{b200:?}");
        // Back to every snapshot: the next one reads.
        source.set_read_interval(Duration::ZERO);
        source.snapshot_with(t0 + Duration::from_secs(6), 106 * SEC);
        assert_eq!(backend(&source).take_asked(), changing_queries(2));
    }

    /// docs/metrics.md lists every kind of query with the NVML functions behind it.
    #[test]
    fn the_docs_list_every_kind_of_query() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
                .unwrap();
        for call in NvmlCall::ALL {
            let row = format!("| `{}` | {} |", call.name(), call.functions());
            assert!(doc.contains(&row), "docs/metrics.md should have {row}");
        }
    }
}
