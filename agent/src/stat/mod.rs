//! `vgpu-agent stat`: the model over a window, per process, per cgroup and per container, per API:
//! calls, errors, p50, p99, bytes and live GPU memory. Read from a running `vgpu-agent run` when
//! one answers on its socket (no second set of probes), else collected in-process.

pub mod render;
pub mod report;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    collector::{Collector, CollectorOptions},
    daemon::client,
    identity::CgroupIndex,
    model::Snapshot,
    probes::ProbeError,
    trace::TraceOptions,
};
pub use report::StatReport;

#[derive(Debug, Error)]
pub enum StatError {
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error("the daemon stopped answering during the window: {0}")]
    Daemon(#[from] client::ClientError),
}

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
}

/// Collects for `duration` (or until SIGINT/SIGTERM) and returns the report.
pub fn run(opts: StatOptions) -> Result<StatReport, StatError> {
    crate::signals::install();
    if let Some(socket) = &opts.socket
        && let Ok(first) = client::fetch(socket, Duration::from_secs(5))
    {
        log::info!(
            "reading from the agent on {}; window {:.1}s",
            socket.display(),
            opts.duration.as_secs_f64()
        );
        let started = Instant::now();
        crate::signals::sleep(opts.duration);
        let last = client::fetch(socket, Duration::from_secs(5))?;
        return Ok(finish(
            &first,
            &last,
            "daemon",
            started.elapsed().as_secs_f64(),
        ));
    }
    let mut collector = Collector::start_with_probes(CollectorOptions {
        trace: Some(opts.trace.clone()),
        region_dirs: opts.region_dirs.clone(),
        host: opts.trace.host.clone(),
        nvml: opts.nvml,
        exited_retention: crate::collector::EXITED_RETENTION,
    })?;
    let started = Instant::now();
    let first = collector.collect();
    log::info!("tracing for {:.1}s", opts.duration.as_secs_f64());
    let deadline = started + opts.duration;
    while Instant::now() < deadline && !crate::signals::stop_requested() {
        crate::signals::sleep(
            opts.poll_interval
                .min(deadline.saturating_duration_since(Instant::now())),
        );
        // A full snapshot (it also polls for new libraries): short-lived processes' limiter
        // figures are read while their region slot still exists.
        collector.collect();
    }
    let last = collector.collect();
    Ok(finish(
        &first,
        &last,
        "in_process",
        started.elapsed().as_secs_f64(),
    ))
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
