//! Where snapshots come from: the daemon's socket when one answers, else a collector in this
//! process. Both sit behind [`SnapshotSource`]; a thread reads the source at the refresh interval
//! so the screen stays responsive while a snapshot is being taken.

use std::{
    path::PathBuf,
    sync::mpsc::{self, Receiver},
    time::{Duration, Instant},
};

use crate::{
    client,
    collector::{Collector, CollectorOptions},
    model::Snapshot,
};

pub trait SnapshotSource {
    /// Takes (or fetches) the next snapshot; an error is shown in the header and reading goes on.
    fn next(&mut self) -> Result<Snapshot, String>;
    /// Waits until `until` for the next snapshot (a collector switches its sampled probes in
    /// between).
    fn wait(&mut self, until: Instant) {
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }
}

/// A running `vgpu-agent run`.
pub struct DaemonSource {
    pub socket: PathBuf,
}

impl SnapshotSource for DaemonSource {
    fn next(&mut self) -> Result<Snapshot, String> {
        client::fetch(&self.socket, Duration::from_secs(2)).map_err(|e| e.to_string())
    }
}

/// Collecting in this process (probes, regions, NVML).
pub struct CollectorSource(pub Collector);

impl SnapshotSource for CollectorSource {
    fn next(&mut self) -> Result<Snapshot, String> {
        Ok(self.0.collect())
    }

    fn wait(&mut self, until: Instant) {
        self.0.sleep_until(until);
    }
}

/// How to make the source, on the reading thread.
pub enum Plan {
    Daemon(PathBuf),
    InProcess(Box<CollectorOptions>),
}

impl Plan {
    /// As the header names it.
    pub fn name(&self) -> String {
        match self {
            Plan::Daemon(p) => format!("daemon {}", p.display()),
            Plan::InProcess(_) => "in-process".into(),
        }
    }

    fn open(self, interval: Duration) -> Box<dyn SnapshotSource> {
        match self {
            Plan::Daemon(socket) => Box::new(DaemonSource { socket }),
            Plan::InProcess(opts) => {
                let mut collector = Collector::start(*opts);
                collector.set_interval(interval);
                Box::new(CollectorSource(collector))
            }
        }
    }
}

/// Starts reading: one result per interval until the receiver is dropped.
pub fn spawn(
    plan: Plan,
    interval: Duration,
) -> std::io::Result<Receiver<Result<Snapshot, String>>> {
    let (tx, rx) = mpsc::sync_channel(2);
    std::thread::Builder::new()
        .name("snapshots".into())
        .spawn(move || {
            let mut source = plan.open(interval);
            loop {
                let started = Instant::now();
                if tx.send(source.next()).is_err() {
                    return;
                }
                source.wait(started + interval);
            }
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_daemon_is_an_error_to_show_not_a_crash() {
        let mut d = DaemonSource {
            socket: PathBuf::from("/nonexistent/vgpu-agent.sock"),
        };
        let e = d.next().unwrap_err();
        assert!(e.contains("no agent answers"), "{e}");
        let rx = spawn(
            Plan::Daemon(PathBuf::from("/nonexistent/vgpu-agent.sock")),
            Duration::from_millis(10),
        )
        .unwrap();
        assert!(rx.recv().unwrap().is_err());
        assert!(
            rx.recv().unwrap().is_err(),
            "reading goes on after an error"
        );
    }
}
