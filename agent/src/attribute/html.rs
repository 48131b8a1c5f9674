//! A self-contained HTML report: stacked bars per container and per API, drawn as inline SVG, with
//! a legend that says what each colour means. No scripts, no external files.

use std::fmt::Write;

use super::{
    components::{Components, NAMES},
    report::AttributionReport,
    uncertainty::{MARK_ABOVE, Uncertainty},
};

const COLOURS: [&str; 7] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
];

const MEANING: [&str; 7] = [
    "inside the NVIDIA driver (libcuda), outside synchronisation and copies",
    "the limiter's own work in its hooks",
    "launches held back by the limiter to keep an SM share",
    "waiting for the GPU in synchronisation calls",
    "inside memory copies",
    "NCCL calls on the host (enqueueing collectives)",
    "what vgpu-agent's own probes added",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// How sure a figure is, as a span: `±4%`, or marked (`±15%!`, `±?!`) past [`MARK_ABOVE`].
fn sureness(u: Option<&Uncertainty>) -> String {
    match u {
        Some(u) if u.marked => format!(
            " <span class=unsure title=\"an estimate: its standard error is over {:.0}% of it, or unknown\">{}</span>",
            MARK_ABOVE * 100.0,
            esc(&u.short())
        ),
        Some(u) => format!(" <span class=sure>{}</span>", esc(&u.short())),
        None => String::new(),
    }
}

/// One horizontal stacked bar of `c`, scaled so that `scale` seconds fill the width; `in_api`:
/// how sure its total is, where it is an estimate.
fn bar(
    out: &mut String,
    label: &str,
    c: &Components,
    wall: f64,
    scale: f64,
    in_api: Option<&Uncertainty>,
) {
    const W: f64 = 640.0;
    let _ = write!(
        out,
        "<div class=row><div class=label>{}</div><svg width=\"{W}\" height=\"22\" role=img>",
        esc(label)
    );
    let mut x = 0.0;
    for (i, n) in NAMES.iter().enumerate() {
        let v = c.get(n);
        let w = if scale > 0.0 { v / scale * W } else { 0.0 };
        if w > 0.0 {
            let _ = write!(
                out,
                "<rect x=\"{x:.1}\" y=\"2\" width=\"{w:.1}\" height=\"18\" fill=\"{}\"><title>{}: {:.3} ms</title></rect>",
                COLOURS[i],
                n,
                v * 1e3
            );
        }
        x += w;
    }
    let _ = write!(
        out,
        "</svg><div class=value>{:.1} ms{} in API of {:.2} s wall ({:.1}%)</div></div>",
        c.total() * 1e3,
        sureness(in_api),
        wall,
        if wall > 0.0 {
            c.total() / wall * 100.0
        } else {
            0.0
        }
    );
}

/// Every estimated figure of every process, with how sure it is.
fn how_sure(out: &mut String, r: &AttributionReport) {
    let mut rows = String::new();
    for p in &r.processes {
        for (name, u) in &p.uncertainty {
            let value = if name == "in_api" {
                p.in_api_seconds
            } else {
                p.components.get(name)
            };
            let _ = write!(
                rows,
                "<tr><td>{} {}</td><td>{}</td><td>{:.3} ms</td><td>{}</td><td>{}</td></tr>",
                p.pid,
                esc(&p.comm),
                esc(name),
                value * 1e3,
                u.standard_error
                    .map_or("unknown".to_owned(), |se| format!("{:.3} ms", se * 1e3)),
                sureness(Some(u))
            );
        }
        for a in &p.apis {
            // The count is an estimate where sampled; the time also wherever a probe hit's
            // price enters it (the in-band correction, the hits inside the limiter's timing).
            if let Some(c) = &a.calls_uncertainty {
                let _ = write!(
                    rows,
                    "<tr><td>{} {}</td><td>{} calls ({})</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    p.pid,
                    esc(&p.comm),
                    esc(&a.api),
                    esc(&a.measured_by),
                    a.calls,
                    c.standard_error
                        .map_or("unknown".to_owned(), |se| format!("{se:.0}")),
                    sureness(Some(c)),
                );
            }
            if let Some(s) = &a.seconds_uncertainty {
                let _ = write!(
                    rows,
                    "<tr><td>{} {}</td><td>{} time ({})</td><td>{:.3} ms</td><td>{}</td><td>{}</td></tr>",
                    p.pid,
                    esc(&p.comm),
                    esc(&a.api),
                    esc(&a.measured_by),
                    a.seconds * 1e3,
                    s.standard_error
                        .map_or("unknown".to_owned(), |se| format!("{:.3} ms", se * 1e3)),
                    sureness(Some(s))
                );
            }
        }
    }
    if rows.is_empty() {
        out.push_str("<h2>How sure these figures are</h2><p>Every figure was measured whole (no sampled estimates).</p>");
        return;
    }
    let _ = write!(
        out,
        "<h2>How sure these figures are</h2><p>Estimated figures and one standard error, from the sampling (the spread between sampled windows, the spread of the probe cost's re-measurements) and from the price of a probe hit (what a hit costs the probed function beyond its calibration: a quarter of the price). Those marked <span class=unsure>!</span> are unsure by more than {:.0}% (or could not be estimated): read them as a range.</p><table><tr><th>process</th><th>figure</th><th>estimate</th><th>standard error</th><th></th></tr>{rows}</table>",
        MARK_ABOVE * 100.0
    );
}

pub fn render(r: &AttributionReport) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html><head><meta charset=utf-8><title>vgpu-agent attribution</title><style>\
         body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} h2{{margin-top:1.6em}}\
         .row{{display:flex;align-items:center;gap:.8em;margin:.2em 0}} .label{{width:18em;font-family:monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}}\
         .value{{font-size:.9em;color:#555}} table{{border-collapse:collapse}} td,th{{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}} td:first-child,th:first-child{{text-align:left}}\
         .key{{display:inline-block;width:1em;height:1em;margin-right:.4em;vertical-align:middle}}\
         .unsure{{background:#fde68a;color:#7c2d12;font-weight:bold;padding:0 .2em}} .sure{{color:#555}}</style></head><body>"
    );
    let _ = write!(
        out,
        "<h1>Where the time inside CUDA and NCCL calls went</h1><p>Host <b>{}</b>, a {:.1} s window. \
         Each bar is the time processes spent inside CUDA/NCCL API calls, split by cause; hover a segment for its value. \
         Launch probes: {} ({:.1} s attached); each probed call cost {:.0} ns{} ({:.2}% of wall time in all).</p>",
        esc(&r.hostname),
        r.duration_seconds,
        esc(&r.sampling.launch_probes),
        r.sampling.launch_probe_seconds,
        r.sampling.probe_cost_per_call_ns,
        sureness(r.sampling.probe_cost_per_call_uncertainty.as_ref()),
        r.sampling.probe_cost_share * 100.0
    );
    out.push_str("<h2>What the colours mean</h2><ul>");
    for (i, n) in NAMES.iter().enumerate() {
        let _ = write!(
            out,
            "<li><span class=key style=\"background:{}\"></span><b>{n}</b>: {}</li>",
            COLOURS[i], MEANING[i]
        );
    }
    out.push_str("</ul>");
    for n in &r.notes {
        let _ = write!(out, "<p><i>Note: {}</i></p>", esc(n));
    }
    let scale = r
        .containers
        .iter()
        .map(|c| c.components.total())
        .fold(0.0, f64::max);
    out.push_str("<h2>Per container</h2>");
    for c in &r.containers {
        bar(
            &mut out,
            &c.name,
            &c.components,
            c.wall_seconds,
            scale,
            c.uncertainty.get("in_api"),
        );
    }
    for c in &r.containers {
        let _ = write!(out, "<h2>{} — per API</h2>", esc(&c.name));
        let mut apis: Vec<_> = r
            .processes
            .iter()
            .filter(|p| p.container == c.key)
            .flat_map(|p| p.apis.iter())
            .collect();
        apis.sort_by(|a, b| (b.seconds + b.hook_seconds).total_cmp(&(a.seconds + a.hook_seconds)));
        let api_scale = apis
            .first()
            .map(|a| a.seconds + a.hook_seconds)
            .unwrap_or(0.0);
        for a in apis.iter().take(12) {
            let mut comps = Components::default();
            match a.kind.as_str() {
                "sync" => comps.sync_wait = a.seconds,
                "copy" => comps.copy_wait = a.seconds,
                "nccl" => comps.nccl_host = a.seconds,
                _ => comps.driver = a.seconds,
            }
            comps.limiter_hook = a.hook_seconds;
            bar(
                &mut out,
                &format!("{} ({} calls, {})", a.api, a.calls, a.measured_by),
                &comps,
                c.wall_seconds,
                api_scale,
                a.seconds_uncertainty.as_ref(),
            );
        }
        let classes: Vec<_> = c
            .allocation_classes
            .iter()
            .filter(|k| k.direct_count + k.pool_count > 0)
            .collect();
        if !classes.is_empty() {
            out.push_str("<table><tr><th>allocation size</th><th>direct: count</th><th>direct: bytes</th><th>pool: count</th><th>pool: bytes</th></tr>");
            for k in classes {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&k.class),
                    k.direct_count,
                    crate::units::bytes(k.direct_bytes),
                    k.pool_count,
                    crate::units::bytes(k.pool_bytes)
                );
            }
            out.push_str("</table>");
        }
    }
    how_sure(&mut out, r);
    if let Some(b) = &r.baseline {
        let _ = write!(
            out,
            "<h2>Against the baseline</h2><p>Time inside the API per second of wall time went from {:.1} ms to {:.1} ms. \
             Components, largest increase first:</p><table><tr><th>component</th><th>baseline ms/s</th><th>now ms/s</th><th>change</th><th>share of the increase</th></tr>",
            b.in_api_baseline * 1e3,
            b.in_api_now * 1e3
        );
        for c in &b.changes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{:+.2}</td><td>{:.0}%</td></tr>",
                c.component,
                c.baseline * 1e3,
                c.now * 1e3,
                c.delta * 1e3,
                c.share_of_slowdown * 100.0
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</body></html>\n");
    out
}
