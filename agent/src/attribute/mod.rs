//! `vgpu-agent attribute`: during an incident, where did the time inside CUDA and NCCL calls go?
//! Records a window of the model (from the daemon, or collected here with launch probes sampled
//! in short windows), splits each process's time inside the API into driver time, limiter hook
//! self-time, throttling, synchronisation and copy waits, NCCL host time and the probes' own
//! cost, and optionally compares with a baseline recording.

mod components;
pub mod filter;
mod gpu_use;
mod html;
mod render;
pub mod report;
mod uncertainty;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use thiserror::Error;

use crate::{
    collector::{
        CollectorOptions,
        window::{self, WindowError},
    },
    probe_options::TraceOptions,
};
pub use report::AttributionReport;

#[derive(Debug, Error)]
pub enum AttributeError {
    #[error(transparent)]
    Window(#[from] WindowError),
    #[error("reading the baseline {}: {source}", path.display())]
    BaselineRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an attribution recording (vgpu-agent attribute --out writes report.json): {source}", path.display())]
    BaselineFormat {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct AttributeOptions {
    pub duration: Duration,
    pub poll_interval: Duration,
    pub trace: TraceOptions,
    pub region_dirs: Vec<PathBuf>,
    pub socket: Option<PathBuf>,
    pub nvml: bool,
    /// Read NVML at most this often (`None`: every snapshot).
    pub nvml_interval: Option<Duration>,
    pub filter: filter::Filter,
    pub baseline: Option<PathBuf>,
}

fn read_baseline(path: &Path) -> Result<AttributionReport, AttributeError> {
    let text = std::fs::read_to_string(path).map_err(|source| AttributeError::BaselineRead {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| AttributeError::BaselineFormat {
        path: path.to_owned(),
        source,
    })
}

/// Seconds since a process started (same boot clock as the snapshots).
fn age_seconds(p: &crate::model::Process) -> Option<f64> {
    if p.key.start_ticks == 0 {
        return None;
    }
    let tck = crate::sys::clock::ticks_per_second().unwrap_or(1) as f64;
    let started = p.key.start_ticks as f64 / tck;
    Some((crate::sys::clock::boot_time_ns() as f64 / 1e9 - started).max(0.0))
}

/// Records the window and builds the report.
pub fn run(opts: AttributeOptions) -> Result<AttributionReport, AttributeError> {
    crate::signals::install();
    // Read the baseline first: a bad file should fail before a 30 s recording.
    let baseline = opts.baseline.as_deref().map(read_baseline).transpose()?;
    let w = record(&opts)?;
    let mut r = report::build(
        &w.first,
        &w.last,
        w.source,
        w.seconds,
        &opts.filter,
        age_seconds,
    );
    if let (Some(b), Some(path)) = (baseline, &opts.baseline) {
        r.baseline = Some(report::compare(&r, &b, &path.display().to_string()));
    }
    Ok(r)
}

fn record(opts: &AttributeOptions) -> Result<window::Window, WindowError> {
    window::record(window::WindowOptions {
        duration: opts.duration,
        poll_interval: opts.poll_interval,
        socket: opts.socket.clone(),
        collector: CollectorOptions {
            trace: Some(opts.trace.clone()),
            region_dirs: opts.region_dirs.clone(),
            host: opts.trace.host.clone(),
            nvml: opts.nvml,
            nvml_interval: opts.nvml_interval,
            exited_retention: crate::collector::EXITED_RETENTION,
        },
        verb: "recording",
    })
}

/// Writes `report.json` and `report.html` into `dir`.
pub fn write(r: &AttributionReport, dir: &Path) -> Result<(), AttributeError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| AttributeError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    let json = dir.join("report.json");
    let body = serde_json::to_vec_pretty(r).expect("the report serialises");
    std::fs::write(&json, body).map_err(err(&json))?;
    let html = dir.join("report.html");
    std::fs::write(&html, html::render(r)).map_err(err(&html))?;
    Ok(())
}

pub fn table(r: &AttributionReport) -> String {
    render::table(r)
}

#[cfg(test)]
mod tests {
    use super::{components::Components, report::*, *};

    fn report(driver: f64, hook: f64, sync: f64) -> AttributionReport {
        let components = Components {
            driver,
            limiter_hook: hook,
            sync_wait: sync,
            ..Default::default()
        };
        AttributionReport {
            schema: SCHEMA.into(),
            hostname: "h".into(),
            started_at_unix_ms: 0,
            duration_seconds: 10.0,
            source: "in_process".into(),
            sampling: SamplingInfo {
                launch_probes: "budget".into(),
                launch_probe_seconds: 0.2,
                probe_cost_per_call_ns: 1500.0,
                probe_cost_per_call_uncertainty: None,
                probe_inband_ns: 700.0,
                probe_cost_per_class_ns: Default::default(),
                probe_cost_share: 0.001,
                budget_share: Some(0.01),
                sampled_kinds: vec![SampledKind {
                    kind: "launch".into(),
                    attached_seconds: 0.5,
                    duty: 0.05,
                    rate_per_second: 90_000.0,
                    overrun: 1.2,
                    gaps_by_reference: 0.8,
                }],
            },
            totals: components.clone(),
            totals_uncertainty: Default::default(),
            containers: vec![ContainerAttribution {
                key: "abc".into(),
                name: "ns/pod/trainer".into(),
                pids: vec![1],
                wall_seconds: 10.0,
                in_api_seconds: components.total(),
                components: components.clone(),
                uncertainty: Default::default(),
                allocation_classes: vec![SizeClass {
                    class: "1-16 MiB".into(),
                    direct_count: 3,
                    direct_bytes: 3 << 20,
                    pool_count: 0,
                    pool_bytes: 0,
                }],
            }],
            processes: vec![ProcessAttribution {
                pid: 1,
                comm: "python3".into(),
                cmdline: "python3 train.py".into(),
                container: "abc".into(),
                wall_seconds: 10.0,
                in_api_seconds: components.total(),
                components,
                uncertainty: Default::default(),
                apis: vec![],
                allocation_classes: vec![],
                unpaired_probe_hits: 0,
            }],
            baseline: None,
            notes: vec![],
            gpu_use: vec![],
        }
    }

    #[test]
    fn the_baseline_comparison_ranks_what_explains_the_slowdown() {
        let before = report(1.0, 0.0, 2.0);
        let after = report(1.2, 0.6, 2.1);
        let b = compare(&after, &before, "before.json");
        assert_eq!(b.changes[0].component, "limiter_hook");
        assert!((b.changes[0].share_of_slowdown - 0.6 / 0.9).abs() < 1e-9);
        assert_eq!(b.changes[1].component, "driver");
        assert_eq!(b.changes[2].component, "sync_wait");
        let total: f64 = b.changes.iter().map(|c| c.share_of_slowdown).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!((b.in_api_now - 0.39).abs() < 1e-9 && (b.in_api_baseline - 0.3).abs() < 1e-9);
    }

    #[test]
    fn throttling_is_a_component_of_the_comparison_table_and_html() {
        let before = report(1.0, 0.1, 2.0);
        let mut after = report(1.05, 0.1, 2.0);
        after.totals.throttled = 1.5;
        after.processes[0].components.throttled = 1.5;
        after.containers[0].components.throttled = 1.5;
        let b = compare(&after, &before, "before.json");
        assert_eq!(b.changes[0].component, "throttled");
        assert!((b.changes[0].delta - 0.15).abs() < 1e-9);
        assert!((b.changes[0].share_of_slowdown - 1.5 / 1.55).abs() < 1e-9);
        after.baseline = Some(b);
        let text = table(&after);
        assert!(
            text.contains("THROTTLED") && text.contains("1.50s") && text.contains("throttled "),
            "{text}"
        );
        let html = html::render(&after);
        assert!(html.contains("throttled"), "legend and bars name it");
        let json = serde_json::to_value(&after).unwrap();
        assert_eq!(json["totals"]["throttled"], 1.5);
    }

    #[test]
    fn writes_json_that_reads_back_as_a_baseline_and_a_readable_html_report() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = report(1.2, 0.6, 2.1);
        r.baseline = Some(compare(&r, &report(1.0, 0.0, 2.0), "before.json"));
        write(&r, dir.path()).unwrap();
        let back = read_baseline(&dir.path().join("report.json")).unwrap();
        assert_eq!(back, r);
        let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert!(
            html.contains("<svg")
                && html.contains("ns/pod/trainer")
                && html.contains("limiter_hook")
        );
        assert!(html.contains("What the colours mean") && html.contains("Against the baseline"));
        assert!(!html.contains("<script"), "self-contained, no scripts");
        let text = table(&r);
        assert!(
            text.contains("CONTAINER ns/pod/trainer") && text.contains("AGAINST BASELINE"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_recording_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, b"{\"schema\": 1}").unwrap();
        let e = read_baseline(&p).unwrap_err().to_string();
        assert!(e.contains("not an attribution recording"), "{e}");
        let e = read_baseline(&dir.path().join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
