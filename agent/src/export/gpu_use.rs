//! The GPU-use gauges: per container and device, the SM and memory-bandwidth busy share of the
//! latest NVML window (the model's per-process figures summed, `model::gpu_use`), and the same
//! per process for GPU processes outside any container, which no container series names. Per
//! container, not per process: the cardinality stays that of the other container families.

use super::{
    defs::{self, Def},
    metrics::{ContainerLabels, Exposition, FamilyData, Value},
};
use crate::model::Snapshot;

pub(super) fn families(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    out: &mut Exposition,
) {
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
    let mut fam = |def: &'static Def, samples: Vec<(Vec<String>, Value)>| {
        out.families.push(FamilyData::of(def, samples));
    };
    fam(&defs::CONTAINER_SM_UTILIZATION, sm);
    fam(&defs::CONTAINER_MEMORY_BANDWIDTH_UTILIZATION, mem);
    fam(&defs::HOST_PROCESS_SM_UTILIZATION, host_sm);
    fam(&defs::HOST_PROCESS_MEMORY_BANDWIDTH_UTILIZATION, host_mem);
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
