//! `vgpu-agent stat`: the model over a window, per process, per cgroup and per container, per API:
//! calls, errors, p50, p99, bytes and live GPU memory. Read from a running `vgpu-agent run` when
//! one answers on its socket (no second set of probes), else collected in-process.

pub mod render;
pub mod report;

use std::{path::PathBuf, time::Duration};

use crate::{
    collector::{CollectorOptions, window},
    identity::CgroupIndex,
    model::Snapshot,
    probe_options::TraceOptions,
};
pub use report::StatReport;

pub use crate::collector::window::WindowError as StatError;

#[derive(Clone, Debug)]
pub struct StatOptions {
    pub duration: Duration,
    /// How often to look for new driver libraries and switch sampled launch probes.
    pub poll_interval: Duration,
    pub trace: TraceOptions,
    pub region_dirs: Vec<PathBuf>,
    /// Read from the daemon on this socket when it answers.
    pub socket: Option<PathBuf>,
    pub nvml: bool,
    /// Read NVML at most this often (`None`: every snapshot).
    pub nvml_interval: Option<std::time::Duration>,
}

/// Collects for `duration` (or until SIGINT/SIGTERM) and returns the report.
pub fn run(opts: StatOptions) -> Result<StatReport, StatError> {
    let w = window::record(window::WindowOptions {
        duration: opts.duration,
        poll_interval: opts.poll_interval,
        socket: opts.socket,
        collector: CollectorOptions {
            trace: Some(opts.trace.clone()),
            region_dirs: opts.region_dirs,
            host: opts.trace.host.clone(),
            nvml: opts.nvml,
            nvml_interval: opts.nvml_interval,
            exited_retention: crate::collector::EXITED_RETENTION,
        },
        verb: "tracing",
    })?;
    let mut report = finish(&w.first, &w.last, w.source, w.seconds);
    let now = crate::model::now_unix_ms();
    report.snapshot.age_seconds = w.last.age_at(now);
    report.snapshot.stale = w.last.is_stale_at(now, opts.poll_interval);
    Ok(report)
}

fn finish(first: &Snapshot, last: &Snapshot, source: &'static str, seconds: f64) -> StatReport {
    let mount = CgroupIndex::new().mount().map(|m| m.to_owned());
    // A cgroup's id is the inode of its directory (gone cgroups have none).
    report::build(first, last, source, seconds, |path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(mount.as_ref()?.join(path.trim_start_matches('/')))
            .ok()
            .map(|md| md.ino())
    })
}
