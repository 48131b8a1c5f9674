//! The attribution report as a terminal table.

use std::fmt::Write;

use std::collections::BTreeMap;

use super::{components::NAMES, report::AttributionReport, uncertainty::Uncertainty};
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

/// A figure and, where it is an estimate, how sure it is (`1.23s ±4%`, `!` past 10%).
fn with_uncertainty(figure: String, u: Option<&Uncertainty>) -> String {
    match u {
        Some(u) => format!("{figure} {}", u.short()),
        None => figure,
    }
}

pub fn table(r: &AttributionReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "vgpu-agent attribute: {:.1}s window ({}), launch probes {} ({:.1}s attached), probe cost {} ns/call ({:.2}% of wall time)",
        r.duration_seconds,
        r.source.replace('_', "-"),
        r.sampling.launch_probes,
        r.sampling.launch_probe_seconds,
        with_uncertainty(
            format!("{:.0}", r.sampling.probe_cost_per_call_ns),
            r.sampling.probe_cost_per_call_uncertainty.as_ref()
        ),
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
    let header = format!("  {:<28} {:>9} {:>15}", "", "WALL", "IN API");
    let cols: String = NAMES
        .iter()
        .map(|n| format!(" {:>15}", n.to_uppercase()))
        .collect();
    for c in &r.containers {
        let _ = writeln!(out, "\nCONTAINER {} [{}]", c.name, c.key);
        let _ = writeln!(out, "{header}{cols}");
        let row = |label: &str,
                   wall: f64,
                   in_api: f64,
                   comps: &super::components::Components,
                   unsure: &BTreeMap<String, Uncertainty>| {
            let vals: String = NAMES
                .iter()
                .map(|n| {
                    format!(
                        " {:>15}",
                        with_uncertainty(secs(comps.get(n)), unsure.get(*n))
                    )
                })
                .collect();
            format!(
                "  {label:<28} {:>9} {:>15}{vals}",
                secs(wall),
                with_uncertainty(secs(in_api), unsure.get("in_api"))
            )
        };
        let _ = writeln!(
            out,
            "{}",
            row(
                "(all processes)",
                c.wall_seconds,
                c.in_api_seconds,
                &c.components,
                &c.uncertainty
            )
        );
        for p in r.processes.iter().filter(|p| p.container == c.key) {
            let label = format!("{} {}", p.pid, p.comm);
            let _ = writeln!(
                out,
                "{}",
                row(
                    &label,
                    p.wall_seconds,
                    p.in_api_seconds,
                    &p.components,
                    &p.uncertainty
                )
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
                    with_uncertainty(
                        secs(a.seconds + a.hook_seconds),
                        a.seconds_uncertainty.as_ref()
                    ),
                    with_uncertainty(a.calls.to_string(), a.calls_uncertainty.as_ref()),
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
