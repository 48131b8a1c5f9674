//! What `top` shows of GPU time, from one snapshot: each GPU's busy share by source, side by
//! side (the limiter's timing of the processes' launches over the latest interval, NVML's SM
//! samples over its latest window), how far the limiter's timing covers the processes, and the
//! top kernels by GPU time since each process started. The GPU-time view (`u`) draws it; the
//! table's GPU% column takes [`limiter_busy`] where the limiter timed a process.
//!
//! NVML's per-process samples go to whichever process was running when sampled, so on a shared
//! GPU only the limiter's figure is each tenant's own; both are shown, each named.

use std::collections::BTreeMap;

use crate::model::{
    Process, ProcessKey, Snapshot,
    gpu_use::{KernelShare, TOP_KERNELS},
};

/// The share of the latest interval the limiter measured the process keeping its GPUs busy,
/// summed over GPUs (two busy GPUs: 2.0); `None` where the limiter timed none of its launches
/// (no limiter, no record yet, or the first snapshot it is in).
pub fn limiter_busy(p: &Process) -> Option<f64> {
    let ratios: Vec<f64> = p
        .limiter
        .iter()
        .flat_map(|l| &l.gpu_time)
        .filter_map(|t| t.busy_ratio)
        .collect();
    (!ratios.is_empty()).then(|| ratios.iter().sum())
}

/// Whether the limiter times a process's launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Its region has GPU-time records for it.
    Timed,
    /// The limiter is loaded but has no GPU-time record for it: no launch timed yet, timing off
    /// (`VGPU_GPU_TIME_SAMPLE=0`), no event functions in the driver, or a region without records
    /// (HAMi-core's).
    NoRecords,
    /// Not under the limiter: only NVML's samples measure it.
    NoLimiter,
}

impl Timing {
    pub fn of(p: &Process) -> Timing {
        match &p.limiter {
            None => Timing::NoLimiter,
            Some(l) if l.gpu_time.is_empty() => Timing::NoRecords,
            Some(_) => Timing::Timed,
        }
    }
}

/// One GPU's busy share by source, for some processes (ratios of the device's time: 0.34 is
/// 34%; summed over the processes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceBusy {
    pub device: u32,
    /// The limiter's timing over the latest interval; `None`: no process here timed on it.
    pub limiter: Option<f64>,
    /// Event pairs behind the limiter's figure (cumulative).
    pub samples: u64,
    /// NVML's SM share over its latest window; `None`: not measured.
    pub nvml: Option<f64>,
    /// Why NVML gives no per-process figure on the device (MIG, vGPU, an older GPU).
    pub nvml_unavailable: Option<String>,
}

/// One process's busy share (summed over GPUs) by source.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessBusy {
    pub key: ProcessKey,
    pub comm: String,
    pub timing: Timing,
    pub limiter: Option<f64>,
    pub nvml: Option<f64>,
}

/// What the GPU-time view shows of some processes (a container's, or one).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuTime {
    pub devices: Vec<DeviceBusy>,
    /// Each live process, the timed ones first.
    pub processes: Vec<ProcessBusy>,
    /// The top kernels since each process started ([`TOP_KERNELS`], then `other`).
    pub kernels: Vec<KernelShare>,
    /// Samples whose event calls failed, and samples not taken, in all (cumulative).
    pub sample_errors: u64,
    pub samples_skipped: u64,
}

impl GpuTime {
    /// Processes the limiter timed, of those shown.
    pub fn timed(&self) -> usize {
        self.processes
            .iter()
            .filter(|p| p.timing == Timing::Timed)
            .count()
    }

    /// The whole set's timing: timed when every process is, else the best any has.
    pub fn timing(&self) -> Timing {
        let of = |t| self.processes.iter().any(|p| p.timing == t);
        if of(Timing::Timed) {
            Timing::Timed
        } else if of(Timing::NoRecords) {
            Timing::NoRecords
        } else {
            Timing::NoLimiter
        }
    }
}

fn at(by: &mut BTreeMap<u32, DeviceBusy>, device: u32) -> &mut DeviceBusy {
    by.entry(device).or_insert(DeviceBusy {
        device,
        ..DeviceBusy::default()
    })
}

/// What the GPU-time view shows of the processes `keys` (exited ones left out).
pub fn gpu_time(s: &Snapshot, keys: &[ProcessKey]) -> GpuTime {
    let procs: Vec<&Process> = keys
        .iter()
        .filter_map(|k| s.process(*k))
        .filter(|p| p.alive)
        .collect();
    let mut by: BTreeMap<u32, DeviceBusy> = BTreeMap::new();
    let mut out = GpuTime {
        devices: vec![],
        processes: vec![],
        kernels: s.kernels_since_start(&procs.iter().map(|p| p.key).collect::<Vec<_>>()),
        sample_errors: 0,
        samples_skipped: 0,
    };
    for p in &procs {
        if let Some(l) = &p.limiter {
            out.sample_errors += l.sample_errors;
            out.samples_skipped += l.samples_skipped;
            for t in &l.gpu_time {
                let d = at(&mut by, t.device);
                if let Some(r) = t.busy_ratio {
                    d.limiter = Some(d.limiter.unwrap_or(0.0) + r);
                }
                d.samples += t.samples;
            }
        }
        let mut nvml = None;
        for n in &p.nvml {
            let d = at(&mut by, n.device);
            if let Some(sm) = n.sm_util_pct {
                d.nvml = Some(d.nvml.unwrap_or(0.0) + sm / 100.0);
                nvml = Some(nvml.unwrap_or(0.0) + sm / 100.0);
            } else if let Some(why) = &n.use_unavailable {
                d.nvml_unavailable.get_or_insert_with(|| why.clone());
            }
        }
        out.processes.push(ProcessBusy {
            key: p.key,
            comm: p.comm.clone(),
            timing: Timing::of(p),
            limiter: limiter_busy(p),
            nvml,
        });
    }
    for d in by.values_mut().filter(|d| d.nvml.is_some()) {
        d.nvml_unavailable = None;
    }
    out.devices = by.into_values().collect();
    out.processes
        .sort_by_key(|p| (p.timing != Timing::Timed, p.key.pid));
    debug_assert!(out.kernels.len() <= TOP_KERNELS + 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;

    fn keys_of(s: &Snapshot, container: &str) -> Vec<ProcessKey> {
        s.containers
            .iter()
            .find(|c| c.key == container)
            .unwrap()
            .processes
            .clone()
    }

    /// The trainer pod: rank 0 timed by the limiter (34% where NVML's samples say 62%), rank 1
    /// under the limiter without records (NVML only): the limiter's figure covers rank 0 alone,
    /// and the view says so.
    #[test]
    fn each_source_per_gpu_and_how_far_the_limiter_covers() {
        let s = fixture::snapshot();
        let g = gpu_time(&s, &keys_of(&s, fixture::TRAIN_ID));
        assert_eq!(g.devices.len(), 1);
        let d = &g.devices[0];
        assert_eq!(d.device, 0);
        assert_eq!(d.limiter, Some(0.34));
        assert_eq!(d.samples, 12_000);
        assert!((d.nvml.unwrap() - 0.82).abs() < 1e-9, "{d:?}");
        assert_eq!(d.nvml_unavailable, None);
        assert_eq!(g.timed(), 1);
        assert_eq!(g.timing(), Timing::Timed);
        let p: Vec<(u32, Timing, Option<f64>)> = g
            .processes
            .iter()
            .map(|p| (p.key.pid, p.timing, p.limiter))
            .collect();
        assert_eq!(
            p,
            [
                (4101, Timing::Timed, Some(0.34)),
                (4102, Timing::NoRecords, None)
            ]
        );
        // Kernels since start, largest first, shares of the timed GPU time.
        let names: Vec<&str> = g.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn",
                "flash_fwd_kernel",
                "graph",
                "other"
            ]
        );
        assert!(
            (g.kernels[0].share - 0.6).abs() < 1e-9,
            "{:?}",
            g.kernels[0]
        );
        assert!((g.kernels.iter().map(|k| k.share).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn without_the_limiter_nvml_alone_and_why_not_where_it_has_none() {
        let s = fixture::snapshot();
        let host = gpu_time(&s, &keys_of(&s, "host"));
        assert_eq!(host.timing(), Timing::NoLimiter);
        assert!(host.kernels.is_empty());
        assert_eq!(host.devices[0].limiter, None);
        assert!((host.devices[0].nvml.unwrap() - 0.04).abs() < 1e-9);
        // MIG: NVML has no per-process figure, and says why.
        let nb = gpu_time(&s, &keys_of(&s, fixture::UNLIMITED_ID));
        assert_eq!(nb.devices[0].nvml, None);
        assert!(nb.devices[0].nvml_unavailable.is_some());
        // Under the limiter with no record: said apart from no limiter at all.
        let serve = gpu_time(&s, &keys_of(&s, fixture::SQUEEZED_ID));
        assert_eq!(serve.timing(), Timing::NoRecords);
    }

    #[test]
    fn limiter_busy_sums_over_gpus_and_is_none_before_a_ratio() {
        let mut s = fixture::snapshot();
        let p = &mut s.processes[0];
        assert_eq!(limiter_busy(p), Some(0.34));
        let l = p.limiter.as_mut().unwrap();
        let mut second = l.gpu_time[0];
        second.device = 1;
        second.busy_ratio = Some(0.5);
        l.gpu_time.push(second);
        assert!((limiter_busy(p).unwrap() - 0.84).abs() < 1e-9);
        for t in &mut p.limiter.as_mut().unwrap().gpu_time {
            t.busy_ratio = None;
        }
        assert_eq!(
            limiter_busy(p),
            None,
            "the first snapshot: not measured yet"
        );
        assert_eq!(limiter_busy(&s.processes[1]), None, "no records");
    }
}
