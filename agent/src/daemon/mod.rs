//! `vgpu-agent run`: collect at an interval and serve the latest snapshot as JSON on a local Unix
//! socket. The protocol (docs/model.md): connect, read one JSON document to end of file.
//!
//! The collector runs on a thread of its own and hands each snapshot to the main thread, which
//! publishes it (the socket, `/metrics`, the OTLP exporter's identities). If the collector has
//! not finished a snapshot for more than two intervals (something it reads blocks), the daemon
//! neither hangs nor serves old figures as new: every interval it serves the last snapshot again
//! with its age and marked stale (`agent.stale`, `vgpu_agent_snapshot_stale`), and SIGTERM still
//! stops it.

use std::{
    io::Write,
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    collector::{Collector, CollectorOptions},
    export::{
        ExportError,
        encode::{self, Body},
        http::{self, HttpCounters},
        metrics::{MetricsOptions, MetricsView, SpanCounters},
    },
    model::{self, Snapshot},
};

pub mod thaw;

pub const DEFAULT_SOCKET: &str = "/run/vgpu-agent/agent.sock";

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("another vgpu-agent already serves {}", .0.display())]
    AlreadyRunning(PathBuf),
    #[error("{what} {}: {source}", path.display())]
    Socket {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    FreezePool(#[from] crate::freeze_pool::FreezePoolError),
}

pub struct MetricsConfig {
    pub listen: std::net::SocketAddr,
    pub options: MetricsOptions,
}

pub struct DaemonOptions {
    pub socket: PathBuf,
    pub interval: Duration,
    /// `/metrics`, if wanted.
    pub metrics: Option<MetricsConfig>,
    /// OTLP spans of sampled calls, if wanted (the probes must have been loaded with
    /// `TraceOptions::spans`).
    pub otlp: Option<crate::export::otlp::OtlpConfig>,
    pub collector: CollectorOptions,
    /// The driver library whose checkpoint API thaws a frozen container at its next CUDA call.
    pub checkpoint_libcuda: PathBuf,
    /// Freezing idle containers, if wanted.
    pub idle_freeze: thaw::IdleFreeze,
    /// The freeze pool (`--freeze-pool`), if wanted.
    pub freeze_pool: Option<crate::freeze_pool::Settings>,
}

/// The latest snapshot, serialised once per refresh and shared with every client.
type Latest = Arc<Mutex<Arc<Vec<u8>>>>;

/// Binds the socket, replacing a stale one; refuses if a live agent answers on it.
pub fn bind(path: &Path) -> Result<UnixListener, DaemonError> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(|source| DaemonError::Socket {
            what: "removing stale socket",
            path: path.to_owned(),
            source,
        })?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| DaemonError::Socket {
            what: "creating",
            path: dir.to_owned(),
            source,
        })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| DaemonError::Socket {
        what: "binding",
        path: path.to_owned(),
        source,
    })?;
    // The model names every GPU process on the host: only its owner (root) may read it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        DaemonError::Socket {
            what: "setting permissions of",
            path: path.to_owned(),
            source,
        }
    })?;
    Ok(listener)
}

fn serve(listener: UnixListener, latest: Latest) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let body = latest.lock().map(|g| Arc::clone(&g)).unwrap_or_default();
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        // A client that goes away mid-write is its own problem.
        let _ = conn.write_all(&body);
    }
}

/// The `/metrics` view: folded and encoded at every refresh; scrapes share the encoded body.
struct Metrics {
    view: MetricsView,
    latest: Arc<encode::Latest>,
    http: Arc<HttpCounters>,
}

impl Metrics {
    fn start(cfg: &MetricsConfig, spans: Arc<SpanCounters>) -> Result<Metrics, DaemonError> {
        let latest = Arc::new(encode::Latest::with_snapshot_age());
        let counters = Arc::new(HttpCounters::default());
        let bound = http::serve_with(
            cfg.listen,
            Arc::clone(&latest),
            http::Limits::DEFAULT,
            Arc::clone(&counters),
        )?;
        log::info!("serving metrics on http://{bound}/metrics");
        Ok(Metrics {
            view: MetricsView::new(cfg.options, spans),
            latest,
            http: counters,
        })
    }

    fn refresh(&mut self, snap: &Snapshot) {
        let body = Body::encode(&self.view.update(snap));
        self.latest.set(body);
    }
}

/// Where each snapshot goes: the socket's JSON, `/metrics`, the OTLP exporter's identities.
struct Publisher {
    latest: Latest,
    metrics: Option<Metrics>,
    identities: Option<Arc<crate::export::otlp::Identities>>,
    /// The containers' GPU time as OTLP metrics (`--otlp-endpoint`).
    gpu_time: Option<crate::export::otlp_metrics::GpuTimeMetrics>,
    /// The freeze pool's figures (`--freeze-pool`).
    freeze_pool: Option<crate::freeze_pool::StatusSource>,
    interval: Duration,
}

impl Publisher {
    /// Serves `snap` (new, or the last one again) with its age at this instant; stale once older
    /// than two intervals.
    fn publish(&mut self, snap: &mut Snapshot, new: bool) {
        let age = snap.age_at(model::now_unix_ms());
        snap.agent.age_seconds = age;
        snap.agent.stale = age > 2.0 * self.interval.as_secs_f64();
        if let Some(pool) = &self.freeze_pool {
            snap.agent.freeze_pool = Some(pool.get());
        }
        if let Some(m) = &mut self.metrics {
            snap.agent.http_dropped = m.http.by_reason();
            m.refresh(snap);
        }
        if new && let Some(ids) = &self.identities {
            ids.refresh(snap);
        }
        if new && let Some(g) = &self.gpu_time {
            g.update(snap);
        }
        match serde_json::to_vec(&*snap) {
            Ok(body) => *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(body),
            Err(e) => log::warn!("serialising a snapshot: {e}"),
        }
    }
}

/// Collects every `interval` on a thread of its own; the snapshots come out of the receiver.
fn spawn_collector(
    mut collector: Collector,
    interval: Duration,
) -> std::io::Result<(Receiver<Snapshot>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || {
            let mut next = Instant::now() + interval;
            while !crate::signals::stop_requested() {
                // Sampled probes switch on their own schedule in between.
                collector.sleep_until(next);
                if crate::signals::stop_requested() {
                    return;
                }
                // A snapshot that took longer than the interval moves the schedule rather than
                // starting the next one at once.
                next = (next + interval).max(Instant::now());
                if tx.send(collector.collect()).is_err() {
                    return;
                }
            }
        })?;
    Ok((rx, thread))
}

/// How long the daemon waits at exit for the collector to finish its snapshot and detach its
/// probes (which releases every uprobe link at once: left to the process's exit, the kernel
/// releases them one by one, tens of seconds for a few hundred links).
const COLLECTOR_EXIT_WAIT: Duration = Duration::from_millis(1500);

/// Raises the soft limit of open files to the hard limit (at most 65,536): the metrics server
/// may hold [`http::Limits::DEFAULT`]'s 512 connections beside the regions and probes.
fn raise_open_files_limit() {
    if let Err(e) = crate::sys::limits::raise_open_files(65_536) {
        log::debug!("raising the open files limit: {e}");
    }
}

/// Runs until SIGINT or SIGTERM.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    crate::signals::install();
    raise_open_files_limit();
    // Started first: a pool that cannot be had stops the daemon before anything else starts.
    let freeze_pool = opts
        .freeze_pool
        .as_ref()
        .map(crate::freeze_pool::FreezePool::start)
        .transpose()?;
    let listener = bind(&opts.socket)?;
    let mut collector = Collector::start(opts.collector);
    collector.set_interval(opts.interval);
    let latest: Latest = Arc::new(Mutex::new(Arc::new(Vec::new())));
    let spans = Arc::new(SpanCounters::default());
    // A metrics address in use (another agent on the host) costs /metrics, not the daemon.
    let metrics =
        opts.metrics
            .as_ref()
            .and_then(|cfg| match Metrics::start(cfg, Arc::clone(&spans)) {
                Ok(m) => Some(m),
                Err(e) => {
                    log::warn!("no /metrics: {e}");
                    None
                }
            });
    let mut snap = collector.collect();
    let identities = Arc::new(crate::export::otlp::Identities::default());
    let _spans = match (&opts.otlp, collector.tracer_mut()) {
        (Some(cfg), Some(tracer)) => match tracer.take_span_ring() {
            Some(ring) => Some(crate::export::otlp::start(
                cfg.clone(),
                ring,
                Arc::clone(&identities),
                Arc::clone(&spans),
                snap.hostname.clone(),
            )?),
            None => {
                log::warn!("no span ring buffer in the probes: no spans");
                None
            }
        },
        (Some(_), None) => {
            log::warn!("no probes: no spans for OTLP");
            None
        }
        (None, _) => None,
    };
    // An endpoint that cannot be set up costs the metrics, not the daemon (as for /metrics).
    let gpu_time = opts.otlp.as_ref().and_then(|cfg| {
        let every = cfg.metrics_interval?;
        crate::export::otlp_metrics::GpuTimeMetrics::start(cfg, &snap.hostname, every)
            .map_err(|e| log::warn!("no OTLP metrics: {e}"))
            .ok()
    });
    let mut publisher = Publisher {
        latest: Arc::clone(&latest),
        metrics,
        identities: opts.otlp.is_some().then_some(identities),
        gpu_time,
        freeze_pool: freeze_pool.as_ref().map(|p| p.status_source()),
        interval: opts.interval,
    };
    publisher.publish(&mut snap, true);
    let start_error = |source| DaemonError::Socket {
        what: "starting the server for",
        path: opts.socket.clone(),
        source,
    };
    {
        let latest = Arc::clone(&latest);
        std::thread::Builder::new()
            .name("socket".into())
            .spawn(move || serve(listener, latest))
            .map_err(start_error)?;
    }
    let (snapshots, collector_thread) =
        spawn_collector(collector, opts.interval).map_err(start_error)?;
    let (frozen, reserved, idle_snapshots);
    {
        let mut watch =
            thaw::ThawWatch::new(PathBuf::from("/proc"), opts.checkpoint_libcuda.clone());
        frozen = watch.frozen_containers();
        reserved = watch.host_reserved();
        let settings = opts.idle_freeze;
        let (tx, rx) = mpsc::channel();
        idle_snapshots = tx;
        watch = watch.with_idle_freeze(settings, rx);
        match settings.after {
            Some(after) => log::info!(
                "freezing containers idle for {after:?}, or for less where they ask (host budget {})",
                crate::units::bytes(settings.host_budget)
            ),
            None => log::info!(
                "freezing only the containers that ask for it (their VGPU_FREEZE_AFTER; host budget {})",
                crate::units::bytes(settings.host_budget)
            ),
        }
        if let Some(idle) = settings.on_demand {
            log::info!(
                "freezing containers idle for {idle:?} while another's allocation waits for device memory"
            );
        }
        std::thread::Builder::new()
            .name("thaw".into())
            .spawn(move || watch.run())
            .map_err(start_error)?;
    }
    log::info!(
        "serving snapshots every {:?} on {}",
        opts.interval,
        opts.socket.display()
    );
    // Wakes often enough to stop promptly on a signal.
    let poll = opts.interval.min(Duration::from_millis(100));
    let mut republish = Instant::now() + opts.interval * 3 / 2;
    let mut collector_gone = false;
    while !crate::signals::stop_requested() {
        match snapshots.recv_timeout(poll) {
            Ok(new) => {
                snap = new;
                // The thaw thread gone (it never returns before a stop) loses nothing here.
                let _ = idle_snapshots.send(thaw::observed(&snap));
                thaw::mark_frozen(&mut snap, &frozen.lock().unwrap_or_else(|e| e.into_inner()));
                // Relaxed: a figure written by the thaw thread, read on its own.
                let held = reserved.load(std::sync::atomic::Ordering::Relaxed);
                thaw::mark_idle_freeze(&mut snap, &opts.idle_freeze, held);
                publisher.publish(&mut snap, true);
                // Half an interval of slack: a collector on time never causes a republish.
                republish = Instant::now() + opts.interval * 3 / 2;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if !collector_gone {
                    log::warn!("the collector stopped: serving its last snapshot, marked stale");
                    collector_gone = true;
                }
                crate::signals::sleep(poll);
            }
        }
        // No new snapshot for an interval: the last one again, with its age (stale after two).
        if Instant::now() >= republish {
            publisher.publish(&mut snap, false);
            if snap.agent.stale {
                log::debug!(
                    "no snapshot for {:.1}s: serving the last one marked stale",
                    snap.agent.age_seconds
                );
            }
            republish += opts.interval;
        }
    }
    let _ = std::fs::remove_file(&opts.socket);
    // Its socket removed and its threads stopped; loans out stay with their processes.
    drop(freeze_pool);
    let deadline = Instant::now() + COLLECTOR_EXIT_WAIT;
    while !collector_thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if collector_thread.is_finished() {
        let _ = collector_thread.join();
    } else {
        log::warn!(
            "the collector did not finish within {COLLECTOR_EXIT_WAIT:?}: exiting without it"
        );
    }
    log::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot served again after two intervals without a new one is marked stale, in the
    /// socket's JSON and in `/metrics`; a new one is not.
    #[test]
    fn a_late_collector_makes_what_is_served_stale() {
        let latest: Latest = Arc::new(Mutex::new(Arc::new(Vec::new())));
        let body = Arc::new(encode::Latest::with_snapshot_age());
        let mut publisher = Publisher {
            latest: Arc::clone(&latest),
            metrics: Some(Metrics {
                view: MetricsView::new(MetricsOptions::default(), Arc::default()),
                latest: Arc::clone(&body),
                http: Arc::default(),
            }),
            identities: None,
            gpu_time: None,
            freeze_pool: None,
            interval: Duration::from_secs(1),
        };
        let served = |latest: &Latest| -> serde_json::Value {
            serde_json::from_slice(&latest.lock().unwrap()).unwrap()
        };
        let text = |body: &encode::Latest| body.get().text(encode::Format::Text);
        let mut snap = crate::tui::fixture::snapshot();
        snap.taken_at_unix_ms = model::now_unix_ms() - 500;
        publisher.publish(&mut snap, true);
        assert_eq!(served(&latest)["agent"]["stale"], false);
        assert!(text(&body).contains("vgpu_agent_snapshot_stale{} 0"));
        // No new snapshot for 3 s: served again, stale, with its age.
        snap.taken_at_unix_ms = model::now_unix_ms() - 3_000;
        publisher.publish(&mut snap, false);
        let json = served(&latest);
        assert_eq!(json["agent"]["stale"], true);
        assert!(json["agent"]["age_seconds"].as_f64().unwrap() >= 3.0);
        let t = text(&body);
        assert!(t.contains("vgpu_agent_snapshot_stale{} 1"), "{t}");
        assert!(t.contains("vgpu_agent_snapshot_age_seconds{} 3."), "{t}");
    }
}
