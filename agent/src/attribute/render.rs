//! The attribution report as a terminal table.

use std::fmt::Write;

use super::{components::NAMES, report::AttributionReport};
use crate::units::bytes;

fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2}s")
    } else if s >= 1e-3 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{:.0}us", s * 1e6)
    }
}

pub fn table(r: &AttributionReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "vgpu-agent attribute: {:.1}s window ({}), launch probes {} ({:.1}s attached), probe cost {:.0} ns/call ({:.2}% of wall time)",
        r.duration_seconds,
        r.source.replace('_', "-"),
        r.sampling.launch_probes,
        r.sampling.launch_probe_seconds,
        r.sampling.probe_cost_per_call_ns,
        r.sampling.probe_cost_share * 100.0
    );
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out.push_str(&super::gpu_use::table(&r.gpu_use));
    if r.processes.is_empty() {
        let _ = writeln!(out, "\nno CUDA or NCCL calls were seen in the window.");
        return out;
    }
    let header = format!("  {:<28} {:>9} {:>9}", "", "WALL", "IN API");
    let cols: String = NAMES
        .iter()
        .map(|n| format!(" {:>12}", n.to_uppercase()))
        .collect();
    for c in &r.containers {
        let _ = writeln!(out, "\nCONTAINER {} [{}]", c.name, c.key);
        let _ = writeln!(out, "{header}{cols}");
        let row = |label: &str, wall: f64, in_api: f64, comps: &super::components::Components| {
            let vals: String = NAMES
                .iter()
                .map(|n| format!(" {:>12}", secs(comps.get(n))))
                .collect();
            format!("  {label:<28} {:>9} {:>9}{vals}", secs(wall), secs(in_api))
        };
        let _ = writeln!(
            out,
            "{}",
            row(
                "(all processes)",
                c.wall_seconds,
                c.in_api_seconds,
                &c.components
            )
        );
        for p in r.processes.iter().filter(|p| p.container == c.key) {
            let label = format!("{} {}", p.pid, p.comm);
            let _ = writeln!(
                out,
                "{}",
                row(&label, p.wall_seconds, p.in_api_seconds, &p.components)
            );
        }
        let mut apis: Vec<_> = r
            .processes
            .iter()
            .filter(|p| p.container == c.key)
            .flat_map(|p| p.apis.iter())
            .collect();
        apis.sort_by(|a, b| (b.seconds + b.hook_seconds).total_cmp(&(a.seconds + a.hook_seconds)));
        let _ = writeln!(
            out,
            "  top APIs: {}",
            apis.iter()
                .take(6)
                .map(|a| format!(
                    "{} {} ({} calls, {})",
                    a.api,
                    secs(a.seconds + a.hook_seconds),
                    a.calls,
                    a.measured_by
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let classes: Vec<String> = c
            .allocation_classes
            .iter()
            .filter(|k| k.direct_count + k.pool_count > 0)
            .map(|k| {
                format!(
                    "{}: {} direct in {}, {} pooled in {}",
                    k.class,
                    bytes(k.direct_bytes),
                    k.direct_count,
                    bytes(k.pool_bytes),
                    k.pool_count
                )
            })
            .collect();
        if !classes.is_empty() {
            let _ = writeln!(out, "  allocations: {}", classes.join("; "));
        }
    }
    if let Some(b) = &r.baseline {
        let _ = writeln!(
            out,
            "\nAGAINST BASELINE {}: time inside the API {:.1} ms -> {:.1} ms per wall second",
            b.baseline_file,
            b.in_api_baseline * 1e3,
            b.in_api_now * 1e3
        );
        for c in &b.changes {
            let _ = writeln!(
                out,
                "  {:<14} {:>9.2} -> {:>9.2} ms/s  ({:+.2} ms/s, {:.0}% of the increase)",
                c.component,
                c.baseline * 1e3,
                c.now * 1e3,
                c.delta * 1e3,
                c.share_of_slowdown * 100.0
            );
        }
    }
    out
}
