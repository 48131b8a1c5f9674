//! The `stat` report as a terminal table.

use std::fmt::Write;

use super::report::{ApiRow, StatReport};
use crate::{
    model::{
        Source,
        by_device::DeviceMemory,
        gpu_use::{GpuBusy, KernelShare, WindowUse},
        probing::LaunchProbes,
    },
    units::{bytes, nanos},
};

fn api_table(out: &mut String, apis: &[ApiRow]) {
    let _ = writeln!(
        out,
        "  {:<32} {:>7} {:>10} {:>8} {:>9} {:>9} {:>12}",
        "API", "SOURCE", "CALLS", "ERRORS", "P50", "P99", "BYTES"
    );
    for a in apis {
        let _ = writeln!(
            out,
            "  {:<32} {:>7} {:>10} {:>8} {:>9} {:>9} {:>12}",
            a.api,
            match a.source {
                Source::Probes => "probes",
                Source::Limiter => "limiter",
            },
            // `~`: estimated from the calls a probe budget sampled.
            if a.estimated {
                format!("~{}", a.calls)
            } else {
                a.calls.to_string()
            },
            a.errors,
            a.p50_ns.map(nanos).unwrap_or_else(|| "-".into()),
            a.p99_ns.map(nanos).unwrap_or_else(|| "-".into()),
            if a.bytes > 0 {
                bytes(a.bytes)
            } else {
                "-".into()
            },
        );
    }
}

/// `  FROZEN: ...` for a frozen container (`FROZEN (in-process)` when its processes froze
/// themselves).
fn frozen_line(out: &mut String, frozen: Option<&crate::model::Frozen>) {
    if let Some(f) = frozen {
        let _ = writeln!(
            out,
            "  FROZEN{}: {} of GPU memory held in host memory until its next CUDA call thaws it",
            if f.in_process { " (in-process)" } else { "" },
            bytes(f.host_bytes)
        );
    }
}

/// `  QoS: GPU0 guaranteed 30%, allocated 70% (held back)` for each device with a tier.
fn qos_line(out: &mut String, regions: &[crate::model::RegionInfo]) {
    let parts: Vec<String> = regions
        .iter()
        .flat_map(|r| &r.devices)
        .filter_map(|d| Some(format!("GPU{} {}", d.index, d.qos.as_ref()?.summary())))
        .collect();
    if !parts.is_empty() {
        let _ = writeln!(out, "  QoS: {}", parts.join(", "));
    }
}

/// `  GPU use: GPU0 SM 87% mem 41%, GPU1 SM ? (not observed)` over the window (NVML's
/// per-process samples); nothing without samples.
fn gpu_use_line(out: &mut String, uses: &[WindowUse]) {
    if uses.is_empty() {
        return;
    }
    let pct = |v: Option<f64>| v.map_or_else(|| "?".to_string(), |v| format!("{v:.0}%"));
    let parts: Vec<String> = uses
        .iter()
        .map(|u| {
            format!(
                "GPU{} SM {} mem {}{}",
                u.device,
                pct(u.sm_util_pct),
                pct(u.mem_util_pct),
                if u.sm_util_pct.is_none() {
                    " (not observed)"
                } else {
                    ""
                }
            )
        })
        .collect();
    let _ = writeln!(out, "  GPU use: {}", parts.join(", "));
}

/// `  GPU busy: GPU0 limiter 16.0% (412 samples) nvml 10.1%`: the share of the window each
/// source saw the GPU kept busy; the limiter's figure is the one to trust on a shared GPU.
fn gpu_busy_line(out: &mut String, busy: &[GpuBusy]) {
    if !busy
        .iter()
        .any(|b| b.source == crate::model::gpu_use::GpuSource::Limiter)
    {
        return;
    }
    let mut devices: Vec<u32> = busy.iter().map(|b| b.device).collect();
    devices.dedup();
    let parts: Vec<String> = devices
        .iter()
        .map(|&d| {
            let of: Vec<String> = busy
                .iter()
                .filter(|b| b.device == d)
                .map(|b| {
                    let pct = b
                        .busy_ratio
                        .map_or_else(|| "?".to_string(), |r| format!("{:.1}%", r * 100.0));
                    match b.samples {
                        Some(n) => format!("{} {pct} ({n} samples)", b.source.name()),
                        None => format!("{} {pct}", b.source.name()),
                    }
                })
                .collect();
            format!("GPU{d} {}", of.join(" "))
        })
        .collect();
    let _ = writeln!(out, "  GPU busy: {}", parts.join(", "));
}

/// `  kernels (limiter): gemm 61% 1.23s, softmax 20% 0.40s, other 19% 0.38s`.
fn kernels_line(out: &mut String, kernels: &[KernelShare]) {
    if kernels.is_empty() {
        return;
    }
    let parts: Vec<String> = kernels
        .iter()
        .map(|k| format!("{} {:.0}% {:.3}s", k.name, k.share * 100.0, k.gpu_seconds))
        .collect();
    let _ = writeln!(out, "  kernels (limiter): {}", parts.join(", "));
}

/// `  memory by GPU: GPU0 limiter 1.50 GiB nvml 1.52 GiB, GPU1 ...`, shown when there is more
/// than one device or the views are per device only.
fn memory_by_device_line(out: &mut String, memory: &[DeviceMemory]) {
    if memory.len() < 2 {
        return;
    }
    let parts: Vec<String> = memory
        .iter()
        .map(|m| {
            let mut views = Vec::new();
            if let Some(l) = m.limiter {
                views.push(format!("limiter {}", bytes(l)));
            }
            if let Some(n) = m.nvml {
                views.push(format!("nvml {}", bytes(n)));
            }
            if views.is_empty() {
                views.push("-".into());
            }
            format!("GPU{} {}", m.device, views.join(" "))
        })
        .collect();
    let _ = writeln!(out, "  memory by GPU: {}", parts.join(", "));
}

/// `freeze pool: 48.00 GiB of 64.00 GiB ready, 16.00 GiB lent (1 loan out, 12 in all); refused:
/// empty 2`, and why it does not populate, if it does not.
fn freeze_pool_line(p: &crate::model::FreezePoolStatus) -> String {
    let mut line = format!(
        "freeze pool: {} of {} ready, {} lent ({} loan(s) out, {} in all)",
        crate::units::bytes(p.ready_bytes),
        crate::units::bytes(p.size_bytes),
        crate::units::bytes(p.lent_bytes),
        p.loans,
        p.loans_total
    );
    if p.kept_bytes > 0 {
        line += &format!(
            ", {} kept by borrowers after their loans",
            crate::units::bytes(p.kept_bytes)
        );
    }
    if !p.refusals.is_empty() {
        let refused: Vec<String> = p.refusals.iter().map(|(k, v)| format!("{k} {v}")).collect();
        line += &format!("; refused: {}", refused.join(", "));
    }
    if let Some(why) = &p.problem {
        line += &format!("; not populating: {why}");
    }
    line
}

pub fn table(r: &StatReport) -> String {
    let mut out = String::new();
    let p = &r.probes;
    let launches = match p.launch_probes {
        LaunchProbes::Off => "off".to_string(),
        LaunchProbes::On => "on".to_string(),
        LaunchProbes::Budget => format!(
            "under the probe budget ({:.1}s attached)",
            p.launch_probe_seconds
        ),
        LaunchProbes::Sampled { window, period } => {
            format!(
                "sampled {window:?} every {period:?} ({:.1}s attached)",
                p.launch_probe_seconds
            )
        }
    };
    let _ = writeln!(
        out,
        "vgpu-agent stat: {:.1}s ({}), {} librar{} probed, launch probes {launches}",
        r.duration_seconds,
        r.source.replace('_', "-"),
        p.libraries.len(),
        if p.libraries.len() == 1 { "y" } else { "ies" },
    );
    if let Some(b) = &p.budget {
        let kinds: Vec<String> = b
            .kinds
            .iter()
            .map(|k| {
                if k.duty >= 1.0 {
                    format!("{} whole", k.kind)
                } else {
                    format!("{} {:.0}% of the time", k.kind, k.duty * 100.0)
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "probe budget {:.2}% of each process's time: {}{}",
            b.share * 100.0,
            kinds.join(", "),
            if b.kinds.iter().any(|k| k.duty < 1.0) {
                " (~: estimated from the calls probed)"
            } else {
                ""
            }
        );
    }
    if let Some(why) = &p.unavailable {
        let _ = writeln!(out, "probes unavailable: {why}");
    }
    if let Some(c) = &p.cost {
        let _ = writeln!(
            out,
            "probe cost: {} per probed call (measured on {})",
            nanos(c.per_hit_ns as u64),
            c.target
        );
    }
    let lost: u64 = r.health.values().sum();
    if lost > 0 {
        let parts: Vec<String> = r
            .health
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(out, "events lost or unmatched: {}", parts.join(", "));
    }
    let snap = &r.snapshot;
    if snap.stale {
        let _ = writeln!(
            out,
            "STALE: the last snapshot is {:.1}s old (the collector has not finished a newer one)",
            snap.age_seconds
        );
    }
    for u in &snap.regions_unread {
        let what = if u.reason == "blocked" {
            format!("its read has been blocked for {:.1}s", u.blocked_seconds)
        } else {
            format!(
                "read budget exhausted ({}), {} slot(s) unread",
                u.reason, u.slots
            )
        };
        let _ = writeln!(out, "region not read whole: {} ({what})", u.path);
    }
    let maps = &snap.maps_scan;
    if maps.deferred > 0 || !maps.blocked.is_empty() || maps.late_polls > 0 {
        let _ = writeln!(
            out,
            "maps scan: {} process(es) deferred, {} read(s) blocked, {} poll(s) late in the \
             window ({} processes known, last cycle {:.2}s)",
            maps.deferred,
            maps.blocked.len(),
            maps.late_polls,
            maps.processes,
            maps.cycle_seconds
        );
    }
    for t in &snap.skipped_by_tenant {
        let _ = writeln!(out, "skipped for tenant {}: {}", t.tenant, t.summary());
    }
    if let Some(f) = &r.idle_freeze {
        let who = match f.after_seconds {
            Some(s) => format!(
                "containers idle for {:?} (or less where they ask) are frozen",
                std::time::Duration::from_secs_f64(s)
            ),
            None => "containers that ask for it are frozen when idle".into(),
        };
        let demand = f.on_demand_seconds.map_or(String::new(), |s| {
            format!(
                "; containers idle for {:?} are frozen for an allocation waiting for memory",
                std::time::Duration::from_secs_f64(s)
            )
        });
        let _ = writeln!(
            out,
            "idle freeze: {who}{demand}; host memory {} of {} reserved",
            crate::units::bytes(f.host_reserved_bytes),
            crate::units::bytes(f.host_budget_bytes)
        );
    }
    if let Some(p) = &r.freeze_pool {
        let _ = writeln!(out, "{}", freeze_pool_line(p));
    }
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if r.processes.is_empty() {
        let _ = writeln!(out, "\nno CUDA driver or NCCL calls were seen.");
        return out;
    }
    for proc in &r.processes {
        let m = &proc.memory;
        let mut views = vec![format!("probes {}", bytes(proc.live_bytes))];
        if let Some(l) = m.limiter {
            views.push(format!("limiter {}", bytes(l)));
        }
        if let Some(n) = m.nvml {
            views.push(format!("nvml {}", bytes(n)));
        }
        let _ = writeln!(
            out,
            "\nPROCESS {} {} ({}) cgroup {}  GPU memory: {}{}",
            proc.pid,
            proc.comm.as_deref().unwrap_or("?"),
            if proc.alive { "running" } else { "exited" },
            proc.cgroup_path.as_deref().unwrap_or("?"),
            views.join(", "),
            m.drift
                .as_ref()
                .map(|d| format!("  DRIFT {} ({})", bytes(d.bytes), d.between))
                .unwrap_or_default(),
        );
        if let Some(w) = &proc.waiting_for_memory {
            let _ = writeln!(
                out,
                "  WAITING: an allocation of {} on its device {} waits for GPU memory (VGPU_OOM_WAIT)",
                bytes(w.bytes),
                w.device
            );
        }
        if let Some(share) = proc.probe_share {
            let budget = r
                .probes
                .budget
                .as_ref()
                .map(|b| format!(" (budget {:.2}%)", b.share * 100.0))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  probes: {:.2}% of the window, its hits at the calibrated price{budget}",
                share * 100.0
            );
        }
        memory_by_device_line(&mut out, &proc.memory_by_device);
        gpu_use_line(&mut out, &proc.gpu_use);
        gpu_busy_line(&mut out, &proc.gpu_busy);
        kernels_line(&mut out, &proc.kernels);
        api_table(&mut out, &proc.apis);
        if proc.apis.iter().any(|a| a.latency.is_some()) {
            let _ = writeln!(
                out,
                "  (nccl latency is host-side enqueue time: collectives run asynchronously)"
            );
        }
        if !proc.communicators.is_empty() {
            let _ = writeln!(
                out,
                "  {:<20} {:>6} {:>7} {:>10} {:>8} {:>12}",
                "NCCL COMMUNICATOR", "RANK", "NRANKS", "CALLS", "ERRORS", "BYTES"
            );
            for c in &proc.communicators {
                let num = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
                let _ = writeln!(
                    out,
                    "  {:<20} {:>6} {:>7} {:>10} {:>8} {:>12}{}",
                    c.comm,
                    num(c.rank),
                    num(c.nranks),
                    c.calls,
                    c.errors,
                    if c.bytes > 0 {
                        bytes(c.bytes)
                    } else {
                        "-".into()
                    },
                    if c.destroyed { "  (destroyed)" } else { "" },
                );
                if let Some(id) = &c.comm_id {
                    let _ = writeln!(out, "    commId {id}");
                }
            }
        }
    }
    for cg in &r.cgroups {
        let _ = writeln!(
            out,
            "\nCGROUP {}  processes {:?}  live GPU memory {}",
            cg.cgroup_path.as_deref().unwrap_or("?"),
            cg.pids,
            bytes(cg.live_bytes),
        );
        api_table(&mut out, &cg.apis);
    }
    for c in &r.containers {
        let limits: Vec<String> = c
            .regions
            .iter()
            .flat_map(|reg| reg.devices.iter().map(move |d| (reg, d)))
            .map(|(reg, d)| {
                let limit = if d.memory_limit == 0 {
                    "unlimited".to_string()
                } else {
                    bytes(d.memory_limit)
                };
                format!(
                    "GPU{} {} of {} ({} region)",
                    d.index,
                    bytes(d.reserved),
                    limit,
                    reg.format
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "\nCONTAINER {} [{}]  processes {:?}  {}",
            c.name,
            c.key,
            c.pids,
            limits.join(", ")
        );
        memory_by_device_line(&mut out, &c.memory_by_device);
        gpu_use_line(&mut out, &c.gpu_use);
        gpu_busy_line(&mut out, &c.gpu_busy);
        kernels_line(&mut out, &c.kernels);
        qos_line(&mut out, &c.regions);
        frozen_line(&mut out, c.frozen.as_ref());
        for reg in &c.regions {
            for problem in &reg.problems {
                let _ = writeln!(out, "  region {}: {problem}", reg.path);
            }
            if let Some(w) = &reg.writable_by_others {
                let _ = writeln!(out, "  region {}: writable by other uids: {w}", reg.path);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::report::{ProbeInfo, SnapshotStatus};

    /// What the probes' hits cost a process in the window is said under it, beside the budget.
    #[test]
    fn a_processs_probe_share_is_said_beside_the_budget() {
        let mut first = crate::tui::fixture::two_gpus::snapshot();
        let mut last = first.clone();
        last.taken_at_unix_ms = first.taken_at_unix_ms + 10_000;
        let set = |snap: &mut crate::model::Snapshot, s: f64| {
            let p = snap
                .processes
                .iter_mut()
                .find(|p| p.key.pid == 7200)
                .unwrap();
            p.probe_seconds = Some(s);
        };
        set(&mut first, 0.01);
        set(&mut last, 0.06);
        let r = crate::stat::report::build(&first, &last, "daemon", 10.0, |_| None);
        let row = r.processes.iter().find(|p| p.pid == 7200).unwrap();
        assert!((row.probe_share.unwrap() - 0.005).abs() < 1e-9, "{row:?}");
        assert!(
            r.processes
                .iter()
                .filter(|p| p.pid != 7200)
                .all(|p| p.probe_share.is_none())
        );
        let t = table(&r);
        assert!(
            t.contains("  probes: 0.50% of the window, its hits at the calibrated price"),
            "{t}"
        );
    }

    /// A process whose allocation waits for GPU memory says so under its line; the others do not.
    #[test]
    fn a_process_waiting_for_memory_says_so() {
        let mut last = crate::tui::fixture::two_gpus::snapshot();
        let p = last
            .processes
            .iter_mut()
            .find(|p| p.key.pid == 7200)
            .unwrap();
        p.limiter.as_mut().unwrap().waiting_for_memory = Some(crate::model::WaitingForMemory {
            device: 0,
            bytes: 4 << 30,
            wait: 1,
        });
        let r = crate::stat::report::build(&last, &last, "daemon", 10.0, |_| None);
        let t = table(&r);
        let line = "  WAITING: an allocation of 4.00 GiB on its device 0 waits for GPU memory (VGPU_OOM_WAIT)";
        let proc_of = |pid: &str| {
            t.split("\nPROCESS ")
                .find(|p| p.starts_with(pid))
                .unwrap_or_else(|| panic!("no process {pid} in {t}"))
                .to_string()
        };
        assert!(proc_of("7200 ").contains(line), "{t}");
        assert_eq!(t.matches("WAITING:").count(), 1, "{t}");
        let json = serde_json::to_value(&r).unwrap();
        let rows = json["processes"].as_array().unwrap();
        let waiting: Vec<&serde_json::Value> = rows
            .iter()
            .filter(|p| p.get("waiting_for_memory").is_some())
            .collect();
        assert_eq!(waiting.len(), 1, "{json}");
        assert_eq!(waiting[0]["pid"], 7200);
        assert_eq!(waiting[0]["waiting_for_memory"]["bytes"], 4u64 << 30);
    }

    #[test]
    fn gpu_use_and_memory_by_gpu_are_in_the_table() {
        let last = crate::tui::fixture::two_gpus::snapshot();
        let r = crate::stat::report::build(&last, &last, "daemon", 10.0, |_| None);
        let t = table(&r);
        let pipeline = t
            .split("\nPROCESS ")
            .find(|p| p.starts_with("7200 "))
            .unwrap_or_else(|| panic!("no process 7200 in {t}"));
        assert!(
            pipeline.contains("memory by GPU: GPU0 limiter 3.00 GiB nvml 3.02 GiB, GPU1 limiter 5.50 GiB nvml 5.52 GiB"),
            "{pipeline}"
        );
        assert!(pipeline.contains("  GPU use: GPU0 SM "), "{pipeline}");
        let containers: Vec<&str> = t.split("\nCONTAINER ").skip(1).collect();
        assert!(
            containers
                .iter()
                .any(|c| c.contains("memory by GPU: GPU0 ") && c.contains(", GPU1 ")),
            "{t}"
        );
    }

    #[test]
    fn a_containers_qos_tier_and_allocation_are_said() {
        use crate::model::{RegionDevice, RegionInfo, RegionQos};
        let device = |index, qos| RegionDevice {
            index,
            memory_limit: 0,
            sm_limit_pct: 0,
            reserved: 0,
            denied: 0,
            context_charge: None,
            qos,
        };
        let region = RegionInfo {
            path: "/r".into(),
            format: "vgpu".into(),
            devices: vec![
                device(
                    0,
                    Some(RegionQos {
                        tier: "guaranteed".into(),
                        guarantee: 0.3,
                        allocated: 0.7,
                        held: true,
                        short: false,
                    }),
                ),
                device(1, None),
                device(
                    2,
                    Some(RegionQos {
                        tier: "best-effort".into(),
                        guarantee: 0.0,
                        allocated: 0.1,
                        held: false,
                        short: false,
                    }),
                ),
            ],
            problems: vec![],
            read_retries: 0,
            writable_by_others: None,
            freeze_after_seconds: None,
        };
        let mut out = String::new();
        qos_line(&mut out, &[region]);
        assert_eq!(
            out,
            "  QoS: GPU0 guaranteed 30%, allocated 70% (held back), GPU2 best-effort, allocated 10%\n"
        );
        let mut none = String::new();
        qos_line(&mut none, &[]);
        assert!(none.is_empty());
        let mut frozen = String::new();
        frozen_line(
            &mut frozen,
            Some(&crate::model::Frozen {
                host_bytes: 4 << 30,
                in_process: false,
            }),
        );
        assert_eq!(
            frozen,
            "  FROZEN: 4.00 GiB of GPU memory held in host memory until its next CUDA call thaws it\n"
        );
        let mut own = String::new();
        frozen_line(
            &mut own,
            Some(&crate::model::Frozen {
                host_bytes: 4 << 30,
                in_process: true,
            }),
        );
        assert_eq!(
            own,
            "  FROZEN (in-process): 4.00 GiB of GPU memory held in host memory until its next CUDA call thaws it\n"
        );
        frozen_line(&mut none, None);
        assert!(none.is_empty());
    }

    #[test]
    fn a_stale_snapshot_and_unread_regions_are_said() {
        let r = StatReport {
            schema: crate::stat::report::SCHEMA,
            source: "daemon",
            duration_seconds: 10.0,
            probes: ProbeInfo {
                unavailable: None,
                attach_mode: None,
                launch_probes: LaunchProbes::Off,
                launch_probe_seconds: 0.0,
                cost: None,
                libraries: vec![],
                budget: Some(crate::stat::report::BudgetInfo {
                    share: 0.005,
                    window_seconds: 0.1,
                    kinds: vec![
                        crate::model::probing::KindSampling {
                            kind: "sync".into(),
                            duty: 0.25,
                            overrun: 1.0,
                            rate_per_second: 8000.0,
                            attached_seconds: 2.5,
                        },
                        crate::model::probing::KindSampling {
                            kind: "copy".into(),
                            duty: 1.0,
                            overrun: 1.0,
                            rate_per_second: 10.0,
                            attached_seconds: 10.0,
                        },
                    ],
                }),
            },
            health: Default::default(),
            warnings: vec![],
            snapshot: SnapshotStatus {
                age_seconds: 7.31,
                stale: true,
                collect_seconds: 0.1,
                regions_unread: vec![crate::model::RegionUnread {
                    path: "/r/hostile.cache".into(),
                    reason: "retries".into(),
                    slots: 1020,
                    blocked_seconds: 0.0,
                }],
                maps_scan: Default::default(),
                skipped_by_tenant: vec![],
            },
            nvml_calls: Default::default(),
            idle_freeze: Some(crate::model::IdleFreezeStatus {
                after_seconds: Some(600.0),
                host_budget_bytes: 64 << 30,
                host_reserved_bytes: 12 << 30,
                on_demand_seconds: Some(30.0),
            }),
            freeze_pool: Some(crate::model::FreezePoolStatus {
                size_bytes: 64 << 30,
                ready_bytes: 48 << 30,
                lent_bytes: 16 << 30,
                kept_bytes: 0,
                loans: 1,
                loans_total: 12,
                refusals: [("empty".to_owned(), 2), ("not_freezing".to_owned(), 1)].into(),
                problem: None,
            }),
            processes: vec![],
            cgroups: vec![],
            containers: vec![],
        };
        let t = table(&r);
        assert!(t.contains("STALE: the last snapshot is 7.3s old"), "{t}");
        assert!(
            t.contains(
                "freeze pool: 48.00 GiB of 64.00 GiB ready, 16.00 GiB lent (1 loan(s) out, 12 in all); refused: empty 2, not_freezing 1"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "idle freeze: containers idle for 600s (or less where they ask) are frozen; containers idle for 30s are frozen for an allocation waiting for memory; host memory 12.00 GiB of 64.00 GiB reserved"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "probe budget 0.50% of each process's time: sync 25% of the time, copy whole (~: estimated from the calls probed)"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "region not read whole: /r/hostile.cache (read budget exhausted (retries), 1020 slot(s) unread)"
            ),
            "{t}"
        );
    }

    /// What a tenant made the agent skip is said per tenant in the table and the JSON: the
    /// libraries not attached by reason, the warnings not kept, its processes whose maps were
    /// deferred or whose read blocks; the maps scan's late polls are counted within the window.
    #[test]
    fn what_each_tenant_made_the_agent_skip_is_said() {
        let first = crate::tui::fixture::snapshot();
        let mut last = first.clone();
        let a = &mut last.agent;
        a.libraries_skipped.insert(
            "/hostile".into(),
            [
                ("mappings".to_string(), 4984),
                ("not_a_driver".to_string(), 8),
            ]
            .into(),
        );
        a.warnings_suppressed.insert("/hostile".into(), 12);
        a.maps_scan = crate::model::MapsScanStatus {
            processes: 40,
            read: 3,
            bytes: 1 << 20,
            deferred: 9,
            deferred_by_tenant: [("/hostile".to_string(), 7), ("/victim".to_string(), 2)].into(),
            blocked: vec![crate::model::MapsBlocked {
                pid: 100,
                tenant: "/hostile".into(),
                seconds: 12.34,
            }],
            cycle_seconds: 0.251,
            late_polls: first.agent.maps_scan.late_polls + 4,
        };
        let r = crate::stat::report::build(&first, &last, "daemon", 10.0, |_| None);
        let t = table(&r);
        for line in [
            "maps scan: 9 process(es) deferred, 1 read(s) blocked, 4 poll(s) late in the window \
             (40 processes known, last cycle 0.25s)",
            "skipped for tenant /hostile: libraries skipped 4992 (mappings 4984, not_a_driver 8), \
             warnings suppressed 12, maps deferred 7, maps read blocked: pid 100 for 12.3s",
            "skipped for tenant /victim: maps deferred 2",
        ] {
            assert!(t.lines().any(|l| l == line), "no line {line:?} in\n{t}");
        }
        let json = serde_json::to_value(&r).unwrap();
        let snap = &json["snapshot"];
        assert_eq!(snap["maps_scan"]["late_polls"], 4);
        assert_eq!(snap["maps_scan"]["blocked"][0]["pid"], 100);
        assert_eq!(snap["maps_scan"]["deferred_by_tenant"]["/victim"], 2);
        let hostile = &snap["skipped_by_tenant"][0];
        assert_eq!(hostile["tenant"], "/hostile");
        assert_eq!(hostile["libraries_skipped"]["mappings"], 4984);
        assert_eq!(hostile["warnings_suppressed"], 12);
        assert_eq!(hostile["maps_deferred"], 7);
        assert_eq!(hostile["maps_blocked"][0]["seconds"], 12.34);
        // Nothing skipped: no such lines.
        let quiet = table(&crate::stat::report::build(
            &first,
            &first,
            "daemon",
            10.0,
            |_| None,
        ));
        assert!(
            !quiet.contains("maps scan:") && !quiet.contains("skipped for"),
            "{quiet}"
        );
    }
}
