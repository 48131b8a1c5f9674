use std::{
    cell::RefCell,
    path::Path,
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
    samples: Vec<ProcessSample>,
}

#[derive(Default)]
struct FakeNvml {
    devices: Vec<FakeDevice>,
    /// The `since` argument of each process utilisation call.
    asked_since: RefCell<Vec<Option<u64>>>,
}

fn or_unsupported<T: Clone>(v: &Option<T>) -> Result<T, NvmlError> {
    v.clone().ok_or(NvmlError::NotSupported)
}

impl NvmlBackend for FakeNvml {
    fn driver_version(&self) -> Result<String, NvmlError> {
        Ok("550.54.15".into())
    }
    fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
        Ok(12040)
    }
    fn device_count(&self) -> Result<u32, NvmlError> {
        Ok(self.devices.len() as u32)
    }
    fn uuid(&self, index: u32) -> Result<String, NvmlError> {
        or_unsupported(&self.devices[index as usize].uuid)
    }
    fn name(&self, _: u32) -> Result<String, NvmlError> {
        Ok("NVIDIA H100 80GB HBM3".into())
    }
    fn utilization_pct(&self, _: u32) -> Result<(u32, u32), NvmlError> {
        Ok((87, 40))
    }
    fn memory_used_total(&self, _: u32) -> Result<(u64, u64), NvmlError> {
        Ok((3 << 30, 80 << 30))
    }
    fn power_mw(&self, index: u32) -> Result<u32, NvmlError> {
        or_unsupported(&self.devices[index as usize].power_mw)
    }
    fn power_limit_mw(&self, _: u32) -> Result<u32, NvmlError> {
        Err(NvmlError::NoPermission)
    }
    fn temperature_c(&self, _: u32) -> Result<u32, NvmlError> {
        Ok(51)
    }
    fn compute_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        Ok(self.devices[index as usize].compute.clone())
    }
    fn graphics_processes(&self, index: u32) -> Result<Vec<ProcessMemory>, NvmlError> {
        Ok(self.devices[index as usize].graphics.clone())
    }
    fn process_utilization(
        &self,
        index: u32,
        since: Option<u64>,
    ) -> Result<Vec<ProcessSample>, NvmlError> {
        self.asked_since.borrow_mut().push(since);
        let samples: Vec<_> = self.devices[index as usize]
            .samples
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

fn sample(pid: u32, timestamp_us: u64, sm_util_pct: u32) -> ProcessSample {
    ProcessSample {
        pid,
        timestamp_us,
        sm_util_pct,
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
                samples: vec![sample(200, 10, 30), sample(200, 20, 60), sample(300, 15, 5)],
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

#[test]
fn reads_devices_fields_and_processes() {
    let mut source = source_of(two_gpus());
    let snap = source.snapshot_at(Instant::now());
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
    assert_eq!(
        gpu0.processes,
        vec![
            GpuProcess {
                pid: 100,
                used_memory: None,
                sm_util_pct: None
            },
            GpuProcess {
                pid: 200,
                used_memory: Some(1 << 30),
                sm_util_pct: Some(60)
            },
            GpuProcess {
                pid: 300,
                used_memory: None,
                sm_util_pct: Some(5)
            },
        ]
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
    assert_eq!(json["devices"][0]["processes"][1]["sm_util_pct"], 60);
}

#[test]
fn process_utilization_continues_from_the_newest_sample() {
    let mut source = source_of(two_gpus());
    let t0 = Instant::now();
    let first = source.snapshot_at(t0);
    let second = source.snapshot_at(t0 + Duration::from_secs(1));
    let backend = source.backend.as_ref().unwrap();
    // Device 0 (uuid GPU-a) from nothing, then from 20; device 1 never had samples.
    assert_eq!(
        *backend.asked_since.borrow(),
        vec![None, None, Some(20), None]
    );
    assert_eq!(first.devices[0].processes.len(), 3);
    // Nothing newer than 20: memory still reported, no utilisation.
    assert_eq!(
        second.devices[0].processes,
        vec![
            GpuProcess {
                pid: 100,
                used_memory: None,
                sm_util_pct: None
            },
            GpuProcess {
                pid: 200,
                used_memory: Some(1 << 30),
                sm_util_pct: None
            },
        ]
    );
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
