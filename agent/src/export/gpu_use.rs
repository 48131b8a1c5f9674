//! The GPU-use gauges: per container and device, the SM and memory-bandwidth busy share of the
//! latest NVML window (the model's per-process figures summed, `model::gpu_use`), and the same
//! per process for GPU processes outside any container, which no container series names. Per
//! container, not per process: the cardinality stays that of the other container families.

use super::{
    defs::{self, Def},
    exposition::{ContainerLabels, Exposition, FamilyData, Value},
};
use crate::model::Snapshot;

pub(super) fn families(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    out: &mut Exposition,
) {
    let (sm, mem) = nvml_families(snap, labels_of);
    let (mut host_sm, mut host_mem) = (vec![], vec![]);
    for c in snap.containers.iter().filter(|c| !c.containerised) {
        for p in c.processes.iter().filter_map(|k| snap.process(*k)) {
            for n in &p.nvml {
                let (Some(s), Some(_)) = (n.sm_util_pct, n.use_window) else {
                    continue;
                };
                let l = vec![p.key.pid.to_string(), p.comm.clone(), n.device.to_string()];
                host_sm.push((l.clone(), Value::Float(s / 100.0)));
                host_mem.push((l, Value::Float(n.mem_util_pct.unwrap_or(0.0) / 100.0)));
            }
        }
    }
    let (busy, kernels) = limiter_families(snap, labels_of, &sm);
    let mut fam = |def: &'static Def, samples: Vec<(Vec<String>, Value)>| {
        out.families.push(FamilyData::of(def, samples));
    };
    fam(&defs::CONTAINER_SM_UTILIZATION, sm);
    fam(&defs::CONTAINER_GPU_BUSY, busy);
    fam(&defs::CONTAINER_KERNEL_TIME, kernels);
    fam(&defs::CONTAINER_MEMORY_BANDWIDTH_UTILIZATION, mem);
    fam(&defs::HOST_PROCESS_SM_UTILIZATION, host_sm);
    fam(&defs::HOST_PROCESS_MEMORY_BANDWIDTH_UTILIZATION, host_mem);
}

pub(super) type Samples = Vec<(Vec<String>, Value)>;

/// NVML's SM and memory-bandwidth busy shares per container and device (labels: the
/// container's, then the device).
fn nvml_families(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
) -> (Samples, Samples) {
    let (mut sm, mut mem) = (vec![], vec![]);
    for c in &snap.containers {
        let labels = labels_of(&c.key);
        for d in snap.gpu_use_of(&c.processes).devices {
            let l: Vec<String> = labels
                .iter()
                .cloned()
                .chain([d.device.to_string()])
                .collect();
            sm.push((l.clone(), Value::Float(d.sm_util_pct / 100.0)));
            mem.push((l, Value::Float(d.mem_util_pct / 100.0)));
        }
    }
    // Several containers can share labels (two unnamed ones): their shares add up.
    for v in [&mut sm, &mut mem] {
        sum_same_labels(v);
    }
    (sm, mem)
}

/// The GPU busy share per container, device and source (labels: the container's, the device,
/// the source) and the kernel time per container (labels: the container's, the kernel name,
/// at most 9 a container), as `/metrics` shows them: what OTLP exports too.
pub(super) fn gpu_time_series(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
) -> (Samples, Samples) {
    let (sm, _) = nvml_families(snap, labels_of);
    limiter_families(snap, labels_of, &sm)
}

/// The GPU busy share per container, device and source (the limiter's, and NVML's beside it
/// from `nvml_sm`), and the limiter's kernel time per container: its top
/// [`TOP_KERNELS`](crate::model::gpu_use::TOP_KERNELS) names, the rest as `other` (at most 9
/// series a container).
fn limiter_families(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    nvml_sm: &Samples,
) -> (Samples, Samples) {
    use crate::model::gpu_use::{GpuSource, OTHER_KERNELS, TOP_KERNELS};
    let mut busy: Samples = vec![];
    let mut kernels: Samples = vec![];
    for c in &snap.containers {
        let labels = labels_of(&c.key);
        let mut by_device: std::collections::BTreeMap<u32, f64> = Default::default();
        let mut by_kernel: std::collections::BTreeMap<String, u64> = Default::default();
        for l in c
            .processes
            .iter()
            .filter_map(|k| snap.process(*k))
            .filter_map(|p| p.limiter.as_ref())
        {
            for t in &l.gpu_time {
                if let Some(r) = t.busy_ratio {
                    *by_device.entry(t.device).or_default() += r;
                }
            }
            for k in &l.kernels {
                *by_kernel.entry(k.name.clone()).or_default() += k.estimated_ns;
            }
        }
        for (device, r) in by_device {
            let l: Vec<String> = labels
                .iter()
                .cloned()
                .chain([device.to_string(), GpuSource::Limiter.name().into()])
                .collect();
            busy.push((l, Value::Float(r)));
        }
        let mut ranked: Vec<(String, u64)> = by_kernel.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut other = 0u64;
        let mut any_other = false;
        for (i, (name, ns)) in ranked.into_iter().enumerate() {
            if i < TOP_KERNELS && name != OTHER_KERNELS {
                let l: Vec<String> = labels.iter().cloned().chain([name]).collect();
                kernels.push((l, Value::Float(ns as f64 / 1e9)));
            } else {
                other += ns;
                any_other = true;
            }
        }
        if any_other {
            let l: Vec<String> = labels
                .iter()
                .cloned()
                .chain([OTHER_KERNELS.to_string()])
                .collect();
            kernels.push((l, Value::Float(other as f64 / 1e9)));
        }
    }
    // NVML's share beside the limiter's (the same figure as vgpu_container_sm_utilization).
    for (l, v) in nvml_sm {
        let l: Vec<String> = l
            .iter()
            .cloned()
            .chain([GpuSource::Nvml.name().into()])
            .collect();
        busy.push((l, v.clone()));
    }
    for v in [&mut busy, &mut kernels] {
        sum_same_labels(v);
    }
    (busy, kernels)
}

fn sum_same_labels(v: &mut Vec<(Vec<String>, Value)>) {
    let mut m: std::collections::BTreeMap<Vec<String>, f64> = Default::default();
    for (l, val) in v.drain(..) {
        if let Value::Float(f) = val {
            *m.entry(l).or_default() += f;
        }
    }
    v.extend(m.into_iter().map(|(l, f)| (l, Value::Float(f))));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::export::{
        encode::{Body, Format},
        metrics::{MetricsOptions, MetricsView},
    };

    #[test]
    fn per_container_and_device_and_host_processes_apart() {
        let snap = crate::tui::fixture::snapshot();
        let e = MetricsView::new(MetricsOptions::default(), Arc::default()).update(&snap);
        let sm = e.family(&defs::CONTAINER_SM_UTILIZATION);
        let value = |container: &str| {
            sm.iter()
                .find(|(l, _)| l[0] == container)
                .map(|(l, v)| (l[3].clone(), v.clone()))
        };
        // The trainer pod's two processes (62% + 20%) on device 0.
        let (device, v) = value("pytorch").unwrap();
        assert_eq!(device, "0");
        match v {
            Value::Float(f) => assert!((f - 0.82).abs() < 1e-9, "{f}"),
            other => panic!("{other:?}"),
        }
        assert!(value("notebook").is_none(), "MIG: n/a, no series (never 0)");
        let host = e.family(&defs::HOST_PROCESS_SM_UTILIZATION);
        assert_eq!(host.len(), 1, "only the process outside containers");
        assert_eq!(&host[0].0[..], ["777", "blender", "0"]);
        let text = Body::encode(&e).text(Format::OpenMetrics);
        assert!(
            text.contains("vgpu_container_memory_bandwidth_utilization_ratio{container=\"pytorch\",pod=\"trainer-0\",namespace=\"ml-team\",device=\"0\"} 0.75"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod limiter_tests {
    use std::sync::Arc;

    use super::*;
    use crate::export::{
        encode::{Body, Format},
        metrics::{MetricsOptions, MetricsView},
    };

    /// The limiter's busy share sits beside NVML's, each labelled with its source; kernels are
    /// the container's top names by GPU time.
    #[test]
    fn gpu_busy_by_source_and_kernel_time_per_container() {
        let snap = crate::tui::fixture::snapshot();
        let e = MetricsView::new(MetricsOptions::default(), Arc::default()).update(&snap);
        let busy: Vec<(String, String)> = e
            .family(&defs::CONTAINER_GPU_BUSY)
            .iter()
            .filter(|(l, _)| l[0] == "pytorch")
            .map(|(l, v)| (l[4].clone(), format!("{v:?}")))
            .collect();
        assert_eq!(busy.len(), 2, "{busy:?}");
        assert!(
            busy.iter()
                .any(|(s, v)| s == "limiter" && v.contains("0.34")),
            "{busy:?}"
        );
        assert!(busy.iter().any(|(s, _)| s == "nvml"), "{busy:?}");
        let kernels: Vec<String> = e
            .family(&defs::CONTAINER_KERNEL_TIME)
            .iter()
            .filter(|(l, _)| l[0] == "pytorch")
            .map(|(l, _)| l[3].clone())
            .collect();
        assert_eq!(kernels.len(), 4, "{kernels:?}");
        assert!(kernels.contains(&"graph".to_string()));
        assert!(kernels.contains(&"other".to_string()));
        let text = Body::encode(&e).text(Format::OpenMetrics);
        assert!(
            text.contains("vgpu_container_kernel_seconds_total{container=\"pytorch\",pod=\"trainer-0\",namespace=\"ml-team\",kernel=\"flash_fwd_kernel\"} 9.8"),
            "{text}"
        );
        assert!(
            text.contains("vgpu_container_gpu_busy_ratio{container=\"pytorch\",pod=\"trainer-0\",namespace=\"ml-team\",device=\"0\",source=\"limiter\"} 0.34"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod two_gpu_tests {
    use std::sync::Arc;

    use super::*;
    use crate::export::metrics::{MetricsOptions, MetricsView};

    /// A container on two GPUs has a series per device for its memory (limiter and NVML views),
    /// its limit and its SM use, not one number for both.
    #[test]
    fn a_container_on_two_gpus_has_series_per_device() {
        let snap = crate::tui::fixture::two_gpus::snapshot();
        let e = MetricsView::new(MetricsOptions::default(), Arc::default()).update(&snap);
        let of = |def: &defs::Def, extra: usize| -> Vec<(Vec<String>, Value)> {
            let mut v: Vec<(Vec<String>, Value)> = e
                .family(def)
                .iter()
                .filter(|(l, _)| l[0] == "trainer")
                .map(|(l, v)| (l[3..3 + extra].to_vec(), v.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        const GIB: u64 = 1 << 30;
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            of(&defs::CONTAINER_MEMORY_USED, 2),
            [
                (s(&["0", "limiter"]), Value::Int(6 * GIB)),
                (s(&["0", "nvml"]), Value::Int(6 * GIB + (20 << 20))),
                (s(&["1", "limiter"]), Value::Int(9 * GIB)),
                (s(&["1", "nvml"]), Value::Int(9 * GIB + (20 << 20))),
            ]
        );
        assert_eq!(
            of(&defs::CONTAINER_MEMORY_LIMIT, 1),
            [
                (s(&["0"]), Value::Int(8 * GIB)),
                (s(&["1"]), Value::Int(12 * GIB))
            ]
        );
        let sm: Vec<String> = of(&defs::CONTAINER_SM_UTILIZATION, 1)
            .into_iter()
            .map(|(l, _)| l[0].clone())
            .collect();
        assert_eq!(sm, ["0", "1"]);
    }
}
