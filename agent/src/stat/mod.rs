//! `vgpu-agent stat`: trace for a while, then print per process and per cgroup, per API: calls,
//! errors, p50, p99, bytes and live GPU memory.

pub mod render;
pub mod report;

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use crate::{
    identity::CgroupIndex,
    probes::ProbeError,
    trace::{TraceOptions, Tracer},
};
pub use report::StatReport;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: the flag carries no data; the loop only needs to see it eventually.
    STOP.store(true, Ordering::Relaxed);
}

fn stop_on_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

#[derive(Clone, Debug)]
pub struct StatOptions {
    pub duration: Duration,
    /// How often to look for new libraries and switch sampled launch probes.
    pub poll_interval: Duration,
    pub trace: TraceOptions,
}

/// Traces for `duration` (or until SIGINT/SIGTERM) and returns the report.
pub fn run(opts: StatOptions) -> Result<StatReport, ProbeError> {
    stop_on_signals();
    let mut tracer = Tracer::start(opts.trace.clone())?;
    log::info!("tracing for {:.1}s", opts.duration.as_secs_f64());
    let deadline = Instant::now() + opts.duration;
    while Instant::now() < deadline && !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(
            opts.poll_interval
                .min(deadline.saturating_duration_since(Instant::now())),
        );
        tracer.poll()?;
    }
    let reading = tracer.read()?;
    let libraries = tracer
        .probes()
        .libraries()
        .map(|l| report::LibraryRow {
            path: l.file.path.display().to_string(),
            attach_path: l.file.attach_path.display().to_string(),
            dev: l.file.id.dev,
            inode: l.file.id.inode,
            found_by: l.file.found_by.clone(),
            symbols_attached: l.symbols.found.len(),
            symbols_missing: l.symbols.missing.iter().map(|a| a.name()).collect(),
            prologues: l.symbols.found.iter().fold(Default::default(), |mut m, s| {
                let name = serde_json::to_value(s.prologue)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned));
                *m.entry(name.unwrap_or_default()).or_insert(0) += 1;
                m
            }),
            kinds_attached: l.attached_kinds().map(|k| k.name()).collect(),
        })
        .collect();
    let probes = report::ProbeInfo {
        attach_mode: tracer.probes().mode(),
        launch_probes: opts.trace.launches,
        launch_probe_seconds: tracer.launch_probe_time().as_secs_f64(),
        cost: tracer.probe_cost.clone(),
        libraries,
    };
    let mut lookup = report::HostLookup {
        proc: &opts.trace.host.proc,
        cgroups: CgroupIndex::new(),
        remembered: tracer.seen_processes(),
    };
    Ok(report::build(
        &reading,
        &mut lookup,
        probes,
        tracer.elapsed().as_secs_f64(),
        tracer.warnings.clone(),
        std::process::id(),
    ))
}
