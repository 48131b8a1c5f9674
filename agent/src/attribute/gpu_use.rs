//! Which tenant used the GPU during the window: per container and device, the SM and
//! memory-bandwidth busy share over the window from NVML's per-process samples
//! (`model::gpu_use`), busiest first. Independent of the probes and of any limit.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::filter::Filter;
use crate::model::{Snapshot, gpu_use::window_use};

/// One container's use of one device over the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantUse {
    pub container: String,
    pub name: String,
    pub device: u32,
    /// Percent of the device's time (`null`: the device gives no per-process utilisation).
    pub sm_util_pct: Option<f64>,
    pub mem_util_pct: Option<f64>,
    pub sm_busy_seconds: f64,
    pub mem_busy_seconds: f64,
    /// The time the device's samples covered in the window.
    pub observed_seconds: f64,
}

/// Per container (those the filter keeps) and device, busiest first.
pub fn build(first: &Snapshot, last: &Snapshot, filter: &Filter) -> Vec<TenantUse> {
    let mut out = Vec::new();
    for c in &last.containers {
        let keys: Vec<_> = c
            .processes
            .iter()
            .filter_map(|k| last.process(*k))
            .filter(|p| filter.keeps(p, &c.name))
            .map(|p| p.key)
            .collect();
        if keys.is_empty() {
            continue;
        }
        for u in window_use(first, last, &keys) {
            out.push(TenantUse {
                container: c.key.clone(),
                name: c.name.clone(),
                device: u.device,
                sm_util_pct: u.sm_util_pct,
                mem_util_pct: u.mem_util_pct,
                sm_busy_seconds: u.sm_busy_seconds,
                mem_busy_seconds: u.mem_busy_seconds,
                observed_seconds: u.observed_seconds,
            });
        }
    }
    out.sort_by(|a, b| {
        b.sm_busy_seconds
            .total_cmp(&a.sm_busy_seconds)
            .then(a.device.cmp(&b.device))
    });
    out
}

/// The terminal table's section (nothing without NVML figures).
pub fn table(uses: &[TenantUse]) -> String {
    let mut out = String::new();
    if uses.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nGPU USE (NVML per-process samples, over the window)\n  {:<40} {:>4} {:>7} {:>9} {:>8}",
        "CONTAINER", "GPU", "SM", "SM BUSY", "MEM BW"
    );
    let pct = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}%"));
    for u in uses {
        let _ = writeln!(
            out,
            "  {:<40} {:>4} {:>7} {:>8.2}s {:>8}",
            u.name.chars().take(40).collect::<String>(),
            u.device,
            pct(u.sm_util_pct),
            u.sm_busy_seconds,
            pct(u.mem_util_pct)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::gpu_use::Busy,
        tui::fixture::{self, SQUEEZED_ID, TRAIN_ID},
    };

    /// The fixture 10 s later: the trainer's processes busy 6.2 s and 2 s more, llm-serve 3 s.
    fn window() -> (Snapshot, Snapshot) {
        let first = fixture::snapshot();
        let mut last = first.clone();
        for p in &mut last.processes {
            let extra = match p.key.pid {
                4101 => 6_200_000,
                4102 => 2_000_000,
                5200 => 3_000_000,
                _ => 0,
            };
            for n in &mut p.nvml {
                if n.use_window.is_some() {
                    n.busy.add(&Busy {
                        sm_us: extra,
                        mem_us: extra / 2,
                        observed_us: 10_000_000,
                    });
                }
            }
        }
        (first, last)
    }

    #[test]
    fn tenants_by_gpu_time_over_the_window() {
        let (first, last) = window();
        let uses = build(&first, &last, &Filter::default());
        let by = |key: &str| uses.iter().find(|u| u.container == key).unwrap();
        assert_eq!(uses[0].container, TRAIN_ID, "busiest first: {uses:?}");
        assert!((by(TRAIN_ID).sm_util_pct.unwrap() - 82.0).abs() < 1e-9);
        assert!((by(SQUEEZED_ID).sm_busy_seconds - 3.0).abs() < 1e-9);
        let notebook = uses.iter().find(|u| u.name == "notebook").unwrap();
        assert_eq!(notebook.sm_util_pct, None, "MIG: n/a, never 0");
        let only = build(
            &first,
            &last,
            &Filter {
                container: None,
                pid: Some(4102),
            },
        );
        assert_eq!(only.len(), 1);
        assert!((only[0].sm_util_pct.unwrap() - 20.0).abs() < 1e-9);
        let text = table(&uses);
        assert!(text.contains("GPU USE"), "{text}");
        assert!(text.contains("82.0%") && text.contains("n/a"), "{text}");
        assert_eq!(table(&[]), "");
    }
}
