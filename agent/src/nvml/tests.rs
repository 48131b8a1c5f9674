use std::{
    cell::{Cell, RefCell},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::*;

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
    let mut source = NvmlGpuSource::with_library(PathBuf::from("/nonexistent/libnvidia-ml.so.1"));
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
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .unwrap();
    for call in NvmlCall::ALL {
        let row = format!("| `{}` | {} |", call.name(), call.functions());
        assert!(doc.contains(&row), "docs/metrics.md should have {row}");
    }
}
