//! GPU use per process and per container: how much of a device's time a process kept its SMs
//! and its memory controller (bandwidth) busy, from NVML's per-process samples (`crate::nvml::
//! process_use`). Always measured, with or without a limit.
//!
//! Each process's [`crate::model::NvmlProcess`] carries the latest window's percentages (for
//! `top` and the gauges) and cumulative busy time ([`Busy`]: for any window between two
//! snapshots, as `stat` and `attribute` take them). A container's use of a device is the sum of
//! its processes' ([`Snapshot::gpu_use_of`], [`window_use`]): 150% SM on one device cannot
//! happen, 150% over two devices can.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ProcessKey, Snapshot};

/// The span of time one reading covers, CPU time (`CLOCK_REALTIME`) in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UseWindow {
    pub from_unix_us: u64,
    pub to_unix_us: u64,
    /// The driver's sample period as estimated (see the module documentation).
    pub sample_period_us: u64,
}

impl UseWindow {
    pub fn micros(&self) -> u64 {
        self.to_unix_us.saturating_sub(self.from_unix_us)
    }
}

/// Cumulative busy time of a process on a device while the agent watched it, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    /// SM busy time (utilisation x time).
    pub sm_us: u64,
    /// Memory-controller busy time (memory bandwidth utilisation x time).
    pub mem_us: u64,
    /// Time the device's samples covered while the process was watched.
    pub observed_us: u64,
}

impl Busy {
    /// The difference `self - earlier` (saturating: the counters never go back).
    pub fn since(&self, earlier: Option<&Busy>) -> Busy {
        let e = earlier.copied().unwrap_or_default();
        Busy {
            sm_us: self.sm_us.saturating_sub(e.sm_us),
            mem_us: self.mem_us.saturating_sub(e.mem_us),
            observed_us: self.observed_us.saturating_sub(e.observed_us),
        }
    }

    pub fn add(&mut self, o: &Busy) {
        self.sm_us += o.sm_us;
        self.mem_us += o.mem_us;
        self.observed_us += o.observed_us;
    }
}

/// Percent of `of` microseconds (`None` for an empty span).
pub fn pct(busy_us: u64, of_us: u64) -> Option<f64> {
    (of_us > 0).then(|| busy_us as f64 / of_us as f64 * 100.0)
}

/// Some processes' use of one device in the latest window, summed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceUse {
    pub device: u32,
    pub sm_util_pct: f64,
    pub mem_util_pct: f64,
    /// Processes measured on the device (busy or idle).
    pub processes: usize,
    /// The window of the latest figures (the widest of the processes').
    pub window: Option<UseWindow>,
}

/// Some processes' use of one device over a window between two snapshots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowUse {
    pub device: u32,
    /// Percent of the device's time over the window (`null`: the processes were not observed
    /// there, e.g. the device gives no per-process utilisation: not measured, never 0).
    pub sm_util_pct: Option<f64>,
    pub mem_util_pct: Option<f64>,
    pub sm_busy_seconds: f64,
    pub mem_busy_seconds: f64,
    /// The time the device's samples covered during the window.
    pub observed_seconds: f64,
}

/// How processes are measured on devices: per device, figures or why there are none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    pub devices: Vec<DeviceUse>,
    /// Devices the processes use where per-process utilisation is not available, with the
    /// reason (MIG, vGPU, an older GPU, a failing query).
    pub unavailable: Vec<(u32, String)>,
}

impl Snapshot {
    /// The latest window's use of each device by these processes, summed per device.
    pub fn gpu_use_of(&self, keys: &[ProcessKey]) -> Measured {
        let mut by: BTreeMap<u32, DeviceUse> = BTreeMap::new();
        let mut unavailable: BTreeMap<u32, String> = BTreeMap::new();
        for p in keys.iter().filter_map(|k| self.process(*k)) {
            for n in &p.nvml {
                if let Some(why) = &n.use_unavailable {
                    unavailable.entry(n.device).or_insert_with(|| why.clone());
                }
                let (Some(sm), Some(w)) = (n.sm_util_pct, n.use_window) else {
                    continue;
                };
                let e = by.entry(n.device).or_insert(DeviceUse {
                    device: n.device,
                    sm_util_pct: 0.0,
                    mem_util_pct: 0.0,
                    processes: 0,
                    window: None,
                });
                e.sm_util_pct += sm;
                e.mem_util_pct += n.mem_util_pct.unwrap_or(0.0);
                e.processes += 1;
                if e.window.is_none_or(|cur| w.micros() > cur.micros()) {
                    e.window = Some(w);
                }
            }
        }
        for d in by.keys() {
            unavailable.remove(d);
        }
        Measured {
            devices: by.into_values().collect(),
            unavailable: unavailable.into_iter().collect(),
        }
    }
}

/// The use of each device by the processes `keys` over the window `first..last`: their busy
/// time summed, as a share of the time the device's samples covered in the window (the longest
/// any process on it was observed in the window). A process that is not in `first` counts
/// whole (it started in the window).
pub fn window_use(first: &Snapshot, last: &Snapshot, keys: &[ProcessKey]) -> Vec<WindowUse> {
    let mut covered: BTreeMap<u32, u64> = BTreeMap::new();
    for p in &last.processes {
        for n in &p.nvml {
            let earlier = first
                .process(p.key)
                .and_then(|b| b.nvml.iter().find(|e| e.device == n.device))
                .map(|e| &e.busy);
            let d = n.busy.since(earlier).observed_us;
            let e = covered.entry(n.device).or_default();
            *e = (*e).max(d);
        }
    }
    let mut sums: BTreeMap<u32, Busy> = BTreeMap::new();
    for p in keys.iter().filter_map(|k| last.process(*k)) {
        for n in &p.nvml {
            let earlier = first
                .process(p.key)
                .and_then(|b| b.nvml.iter().find(|e| e.device == n.device))
                .map(|e| &e.busy);
            sums.entry(n.device)
                .or_default()
                .add(&n.busy.since(earlier));
        }
    }
    sums.into_iter()
        .map(|(device, b)| {
            // Processes never observed (no per-process utilisation there) are not measured.
            let of = if b.observed_us == 0 {
                0
            } else {
                covered.get(&device).copied().unwrap_or(0)
            };
            WindowUse {
                device,
                sm_util_pct: pct(b.sm_us, of),
                mem_util_pct: pct(b.mem_us, of),
                sm_busy_seconds: b.sm_us as f64 / 1e6,
                mem_busy_seconds: b.mem_us as f64 / 1e6,
                observed_seconds: of as f64 / 1e6,
            }
        })
        .collect()
}
