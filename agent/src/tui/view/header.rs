//! The header: host, driver and CUDA version, where snapshots come from; one line per GPU with
//! utilisation, memory and power and their recent history; the agent's own state.

use ratatui::{
    Frame,
    layout::Rect,
    text::{Line, Span},
    widgets::Paragraph,
};

use super::{
    text::{fit, format_interval, short_bytes, spark},
    theme::Theme,
};
use crate::{
    model::{Snapshot, probing::LaunchProbes},
    tui::app::{Model, ViewState},
    units::nanos,
};

pub fn lines(model: &Model, state: &ViewState, t: &Theme, width: u16) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut title = vec![Span::styled("vgpu-agent top", t.title())];
    let snap = model.snapshot.as_ref();
    if let Some(s) = snap {
        title.push(Span::raw(format!("  {}", s.hostname)));
        if let Some(d) = &s.driver_version {
            title.push(Span::raw(format!("  driver {d}")));
        }
        if let Some(c) = &s.cuda_driver_version {
            title.push(Span::raw(format!("  CUDA {c}")));
        }
    }
    // The daemon's socket path only where there is room for it.
    let source = if width >= 120 {
        model.source.name.as_str()
    } else {
        model.source.name.split(' ').next().unwrap_or("")
    };
    title.push(Span::styled(
        format!("  {source} every {}", format_interval(state.interval)),
        t.dim(),
    ));
    if state.paused {
        title.push(Span::styled("  PAUSED", t.bad()));
    } else if let Some(age) = model.stale_seconds {
        title.push(Span::styled(format!("  STALE {age}s"), t.bad()));
    }
    out.push(Line::from(title));
    if let Some(e) = &model.source.error {
        out.push(Line::from(Span::styled(format!("source: {e}"), t.bad())));
    }
    match snap {
        None => {}
        Some(s) => {
            out.extend(gpu_lines(s, model, t, width));
            out.push(agent_line(s, t));
        }
    }
    out
}

fn gpu_lines(s: &Snapshot, model: &Model, t: &Theme, width: u16) -> Vec<Line<'static>> {
    if s.gpus.is_empty() {
        let problems = &s.agent.nvml_problems;
        let text = if problems.iter().any(|p| p.starts_with("NVML not found")) {
            "no NVIDIA driver (NVML not found): showing what the probes and regions see".to_string()
        } else if problems.iter().any(|p| p == "NVML disabled") {
            "GPUs: NVML disabled (--no-nvml)".to_string()
        } else if let Some(p) = problems.first() {
            format!("GPUs: NVML: {p}")
        } else {
            "GPUs: none found".to_string()
        };
        return vec![Line::from(Span::styled(text, t.warn()))];
    }
    // Sparklines get what is left of the line after the figures.
    let hist = (width as usize).saturating_sub(70).clamp(0, 40) / 2;
    s.gpus
        .iter()
        .map(|g| {
            let h = model.history.gpus.get(&g.index);
            let name = g
                .name
                .as_deref()
                .unwrap_or("?")
                .trim_start_matches("NVIDIA ");
            let mut spans = vec![
                Span::styled(format!("GPU{} ", g.index), t.key()),
                Span::raw(format!("{:<16}", fit(name, 16))),
            ];
            let util = g
                .utilization_pct
                .map(|u| format!("{u:>3}%"))
                .unwrap_or("  -".into());
            spans.push(Span::raw(format!(" util {util}")));
            if let Some(h) = h.filter(|_| hist > 0) {
                spans.push(Span::styled(
                    format!(
                        " {:<hist$}",
                        spark(&h.utilization.last(hist), hist, Some(100))
                    ),
                    t.good(),
                ));
            }
            let mem = match (g.memory_used, g.memory_total) {
                (Some(u), Some(tot)) => format!("{}/{}", short_bytes(u), short_bytes(tot)),
                (Some(u), None) => short_bytes(u),
                _ => "-".into(),
            };
            spans.push(Span::raw(format!("  mem {mem:>11}")));
            if let Some(h) = h.filter(|_| hist > 0) {
                spans.push(Span::styled(
                    format!(
                        " {:<hist$}",
                        spark(&h.memory.last(hist), hist, g.memory_total)
                    ),
                    t.good(),
                ));
            }
            let power = g
                .power_mw
                .map(|p| format!("{:>4} W", p / 1000))
                .unwrap_or("   - W".into());
            spans.push(Span::raw(format!("  {power}")));
            if let Some(c) = g.temperature_c {
                spans.push(Span::raw(format!(" {c}°C")));
            }
            Line::from(spans)
        })
        .collect()
}

fn agent_line(s: &Snapshot, t: &Theme) -> Line<'static> {
    let a = &s.agent;
    let mut spans = vec![Span::styled("probes ", t.key())];
    match &a.probes_unavailable {
        Some(why) => spans.push(Span::styled(format!("off ({why})"), t.warn())),
        None => {
            let libs = a.libraries.len();
            spans.push(Span::raw(format!(
                "{libs} lib{}",
                if libs == 1 { "" } else { "s" }
            )));
            let launches = match a.launch_probes {
                LaunchProbes::Off => "launch off".to_string(),
                LaunchProbes::On => "launch on".to_string(),
                LaunchProbes::Budget => "launch budget".to_string(),
                LaunchProbes::Sampled { window, period } => format!(
                    "launch sampled {}/{}",
                    format_interval(window),
                    format_interval(period)
                ),
            };
            spans.push(Span::raw(format!(", {launches}")));
            if let Some(b) = &a.sampling {
                // Kinds it probes only part of the time: their counts are estimates (`~`).
                let sampled: Vec<&str> = b
                    .kinds
                    .iter()
                    .filter(|k| k.duty < 1.0)
                    .map(|k| k.kind.as_str())
                    .collect();
                spans.push(Span::raw(format!(", budget {}%", b.budget_share * 100.0)));
                if !sampled.is_empty() {
                    spans.push(Span::styled(
                        format!(" (~{})", sampled.join(" ~")),
                        t.warn(),
                    ));
                }
            }
            if let Some(c) = &a.probe_cost {
                spans.push(Span::raw(format!(", {}/hit", nanos(c.per_hit_ns as u64))));
            }
        }
    }
    let lost: u64 = a.events_lost.values().sum();
    spans.push(Span::styled("  lost ", t.key()));
    spans.push(Span::styled(
        lost.to_string(),
        if lost > 0 { t.warn() } else { t.good() },
    ));
    spans.push(Span::styled("  regions ", t.key()));
    spans.push(Span::raw(a.regions_read.to_string()));
    if !a.regions_unread.is_empty() {
        spans.push(Span::styled("  unread ", t.key()));
        spans.push(Span::styled(a.regions_unread.len().to_string(), t.warn()));
    }
    let errors =
        a.region_errors + a.warnings.len() + a.claims_refused.len() + a.region_listing_cuts.len();
    spans.push(Span::styled("  errors ", t.key()));
    spans.push(Span::styled(
        errors.to_string(),
        if errors > 0 { t.bad() } else { t.good() },
    ));
    // Tenants that made the agent skip something (libraries, warnings, maps reads): `e` lists
    // them. Last, so that a narrow terminal cuts it before `errors`.
    let skipped = crate::model::skips::by_tenant(a).len();
    if skipped > 0 {
        spans.push(Span::styled("  skipped ", t.key()));
        spans.push(Span::styled(skipped.to_string(), t.warn()));
    }
    Line::from(spans)
}

pub fn render(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>) {
    frame.render_widget(Paragraph::new(lines), area);
}
