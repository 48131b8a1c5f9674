//! GPU use per process and per container: how much of a device's time a process kept its SMs
//! and its memory controller (bandwidth) busy, from NVML's per-process samples (`crate::nvml::
//! process_use`). Always measured, with or without a limit.
//!
//! Beside it, for processes under the limiter, the GPU time the limiter measured itself
//! ([`LimiterGpuTime`], [`KernelTime`]: sampled event pairs around launches): NVML's samples
//! record which process was running at each sample, so once tenants share a GPU they go to
//! whoever was caught (true shares of 16.0% and 34.2% read as 10.1% and 43.3% on an H100,
//! driver 580.159.04, against CUPTI). Every figure says which source it comes from
//! ([`GpuSource`]).
//!
//! Each process's [`crate::model::NvmlProcess`] carries the latest window's percentages (for
//! `top` and the gauges) and cumulative busy time ([`Busy`]: for any window between two
//! snapshots, as `stat` and `attribute` take them). A container's use of a device is the sum of
//! its processes' ([`Snapshot::gpu_use_of`], [`window_use`]): 150% SM on one device cannot
//! happen, 150% over two devices can.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::gpu_time::{Busy, KernelTime, LimiterGpuTime, UseWindow};
use super::{LimiterProcess, ProcessKey, Snapshot};

/// Where a GPU-use figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuSource {
    /// Timed by the limiter inside the process (event pairs around sampled launches).
    Limiter,
    /// NVML's per-process utilisation samples (winner-take-all under sharing).
    Nvml,
}

impl GpuSource {
    pub fn name(self) -> &'static str {
        match self {
            GpuSource::Limiter => "limiter",
            GpuSource::Nvml => "nvml",
        }
    }
}

/// The share of a device's time one source saw some processes keep it busy over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuBusy {
    pub device: u32,
    pub source: GpuSource,
    /// Busy time over the window's length (0..1 per process; a container's may pass 1 on a
    /// device only through overlapping streams); `null`: not measured.
    pub busy_ratio: Option<f64>,
    pub busy_seconds: f64,
    /// Samples behind the figure (limiter: event pairs; absent for NVML).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
}

/// Kernels shown per container before the rest is summed as `other`.
pub const TOP_KERNELS: usize = 8;

/// A kernel's GPU time over a window (a container's, its processes' merged by name).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelShare {
    pub name: String,
    pub source: GpuSource,
    pub gpu_seconds: f64,
    /// Of the container's limiter-timed GPU time in the window.
    pub share: f64,
    pub samples: u64,
    pub launches: u64,
}

/// The limiter's GPU time of the processes `keys` over `first..last`, per device.
pub fn limiter_window(
    first: &Snapshot,
    last: &Snapshot,
    keys: &[ProcessKey],
) -> Vec<LimiterGpuTime> {
    let mut by: BTreeMap<u32, LimiterGpuTime> = BTreeMap::new();
    for p in keys.iter().filter_map(|k| last.process(*k)) {
        let Some(l) = &p.limiter else { continue };
        let before = first.process(p.key).and_then(|b| b.limiter.as_ref());
        for t in &l.gpu_time {
            let earlier = before.and_then(|b| b.gpu_time.iter().find(|e| e.device == t.device));
            let d = t.since(earlier);
            let e = by.entry(t.device).or_insert(LimiterGpuTime {
                device: t.device,
                ..LimiterGpuTime::default()
            });
            e.estimated_ns += d.estimated_ns;
            e.sampled_ns += d.sampled_ns;
            e.samples += d.samples;
            e.launches += d.launches;
        }
    }
    by.into_values().collect()
}

/// GPU busy shares of the processes `keys` over a window of `seconds`: the limiter's per device,
/// then NVML's, each labelled with its source.
pub fn busy_over(
    first: &Snapshot,
    last: &Snapshot,
    keys: &[ProcessKey],
    seconds: f64,
    nvml: &[WindowUse],
) -> Vec<GpuBusy> {
    let mut out: Vec<GpuBusy> = limiter_window(first, last, keys)
        .into_iter()
        .map(|t| {
            let busy = t.estimated_ns as f64 / 1e9;
            GpuBusy {
                device: t.device,
                source: GpuSource::Limiter,
                busy_ratio: (seconds > 0.0).then(|| busy / seconds),
                busy_seconds: busy,
                samples: Some(t.samples),
            }
        })
        .collect();
    out.extend(nvml.iter().map(|u| GpuBusy {
        device: u.device,
        source: GpuSource::Nvml,
        busy_ratio: u.sm_util_pct.map(|p| p / 100.0),
        busy_seconds: u.sm_busy_seconds,
        samples: None,
    }));
    out.sort_by_key(|b| (b.device, b.source));
    out
}

/// The top kernels of the processes `keys` over `first..last` (merged by name), the largest
/// [`TOP_KERNELS`] and the rest summed as `other`.
pub fn top_kernels(first: &Snapshot, last: &Snapshot, keys: &[ProcessKey]) -> Vec<KernelShare> {
    merge_kernels(
        keys.iter()
            .filter_map(|k| last.process(*k))
            .filter_map(|p| {
                let before = first.process(p.key).and_then(|b| b.limiter.as_ref());
                p.limiter.as_ref().map(|l| (l, before))
            }),
    )
}

impl Snapshot {
    /// The top kernels of the processes `keys` since each started (the limiter's cumulative
    /// figures, merged by name), as [`top_kernels`] ranks them: for a view of one snapshot.
    pub fn kernels_since_start(&self, keys: &[ProcessKey]) -> Vec<KernelShare> {
        merge_kernels(
            keys.iter()
                .filter_map(|k| self.process(*k))
                .filter_map(|p| p.limiter.as_ref().map(|l| (l, None))),
        )
    }
}

/// Kernels of some processes' limiter records merged by name, each less its earlier record's
/// (where there is one): the largest [`TOP_KERNELS`], then the rest summed as `other`.
fn merge_kernels<'a>(
    records: impl Iterator<Item = (&'a LimiterProcess, Option<&'a LimiterProcess>)>,
) -> Vec<KernelShare> {
    let mut by: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for (l, before) in records {
        for k in &l.kernels {
            let e = before.and_then(|b| b.kernels.iter().find(|e| e.name == k.name));
            let slot = by.entry(k.name.clone()).or_default();
            slot.0 += k
                .estimated_ns
                .saturating_sub(e.map_or(0, |e| e.estimated_ns));
            slot.1 += k.samples.saturating_sub(e.map_or(0, |e| e.samples));
            slot.2 += k.launches.saturating_sub(e.map_or(0, |e| e.launches));
        }
    }
    let total: u64 = by.values().map(|v| v.0).sum();
    let mut rows: Vec<(String, (u64, u64, u64))> =
        by.into_iter().filter(|(_, v)| v.1 > 0).collect();
    rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let mut rest = (0u64, 0u64, 0u64);
    let mut out = Vec::new();
    for (i, (name, v)) in rows.into_iter().enumerate() {
        if i < TOP_KERNELS && name != OTHER_KERNELS {
            out.push((name, v));
        } else {
            rest = (rest.0 + v.0, rest.1 + v.1, rest.2 + v.2);
        }
    }
    if rest.1 > 0 {
        out.push((OTHER_KERNELS.to_string(), rest));
    }
    out.into_iter()
        .map(|(name, (ns, samples, launches))| KernelShare {
            name,
            source: GpuSource::Limiter,
            gpu_seconds: ns as f64 / 1e9,
            share: if total == 0 {
                0.0
            } else {
                ns as f64 / total as f64
            },
            samples,
            launches,
        })
        .collect()
}

/// The name the kernels past the limiter's table, and past the top ones, are summed under.
pub const OTHER_KERNELS: &str = "other";

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
