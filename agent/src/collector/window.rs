//! A window of the model: two snapshots `duration` apart, read from the daemon when one answers
//! (no second set of probes on the host), else collected here with a full snapshot at every poll
//! (so that short-lived processes' limiter figures are read while their region slot exists).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use thiserror::Error;

use super::{Collector, CollectorOptions};
use crate::{
    client::{self, ClientError},
    model::Snapshot,
    probes::ProbeError,
};

#[derive(Debug, Error)]
pub enum WindowError {
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error("the daemon stopped answering during the window: {0}")]
    Daemon(#[from] ClientError),
}

pub struct WindowOptions {
    pub duration: Duration,
    pub poll_interval: Duration,
    /// Read from the daemon on this socket when it answers.
    pub socket: Option<PathBuf>,
    pub collector: CollectorOptions,
    /// What the command calls it in its log line once the window starts ("tracing",
    /// "recording"): tests wait for that line.
    pub verb: &'static str,
}

pub struct Window {
    pub first: Snapshot,
    pub last: Snapshot,
    /// `daemon` or `in_process`.
    pub source: &'static str,
    pub seconds: f64,
}

/// Records a window (ends early on SIGINT/SIGTERM).
pub fn record(opts: WindowOptions) -> Result<Window, WindowError> {
    crate::signals::install();
    if let Some(socket) = &opts.socket
        && let Ok(first) = client::fetch(socket, Duration::from_secs(5))
    {
        log::info!(
            "reading from the agent on {}; {} for {:.1}s",
            socket.display(),
            opts.verb,
            opts.duration.as_secs_f64()
        );
        let started = Instant::now();
        crate::signals::sleep(opts.duration);
        let last = client::fetch(socket, Duration::from_secs(5))?;
        return Ok(Window {
            first,
            last,
            source: "daemon",
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let mut collector = Collector::start_with_probes(opts.collector)?;
    collector.set_interval(opts.poll_interval);
    let started = Instant::now();
    let first = collector.collect();
    log::info!("{} for {:.1}s", opts.verb, opts.duration.as_secs_f64());
    let deadline = started + opts.duration;
    let mut next_poll = Instant::now() + opts.poll_interval;
    while Instant::now() < deadline && !crate::signals::stop_requested() {
        // Sampling windows open and close on their own schedule, between polls.
        collector.sleep_until(next_poll.min(deadline));
        if Instant::now() >= next_poll.min(deadline) {
            collector.collect();
            next_poll = Instant::now() + opts.poll_interval;
        }
    }
    let last = collector.collect();
    Ok(Window {
        first,
        last,
        source: "in_process",
        seconds: started.elapsed().as_secs_f64(),
    })
}
