//! `vgpu-agent run`: collect at an interval and serve the latest snapshot as JSON on a local Unix
//! socket. The protocol (docs/model.md): connect, read one JSON document to end of file.

pub mod client;

use std::{
    io::Write,
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    collector::{Collector, CollectorOptions},
    export::{
        ExportError,
        encode::{self, Body},
        metrics::{MetricsOptions, MetricsView, SpanCounters},
    },
    model::Snapshot,
};

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
}

impl Metrics {
    fn start(cfg: &MetricsConfig, spans: Arc<SpanCounters>) -> Result<Metrics, DaemonError> {
        let latest = Arc::new(encode::Latest::with_snapshot_age());
        let bound = crate::export::http::serve(cfg.listen, Arc::clone(&latest))?;
        log::info!("serving metrics on http://{bound}/metrics");
        Ok(Metrics {
            view: MetricsView::new(cfg.options, spans),
            latest,
        })
    }

    fn refresh(&mut self, snap: &Snapshot) {
        let body = Body::encode(&self.view.update(snap));
        self.latest.set(body);
    }
}

/// Runs until SIGINT or SIGTERM.
pub fn run(opts: DaemonOptions) -> Result<(), DaemonError> {
    crate::signals::install();
    let listener = bind(&opts.socket)?;
    let mut collector = Collector::start(opts.collector);
    let latest: Latest = Arc::new(Mutex::new(Arc::new(Vec::new())));
    let spans = Arc::new(SpanCounters::default());
    // A metrics address in use (another agent on the host) costs /metrics, not the daemon.
    let mut metrics =
        opts.metrics
            .as_ref()
            .and_then(|cfg| match Metrics::start(cfg, Arc::clone(&spans)) {
                Ok(m) => Some(m),
                Err(e) => {
                    log::warn!("no /metrics: {e}");
                    None
                }
            });
    let snap = collector.collect();
    if let Some(m) = &mut metrics {
        m.refresh(&snap);
    }
    let identities = Arc::new(crate::export::otlp::Identities::default());
    identities.refresh(&snap);
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
    let first = serde_json::to_vec(&snap).unwrap_or_default();
    *latest.lock().expect("not poisoned") = Arc::new(first);
    {
        let latest = Arc::clone(&latest);
        std::thread::Builder::new()
            .name("socket".into())
            .spawn(move || serve(listener, latest))
            .map_err(|source| DaemonError::Socket {
                what: "starting the server for",
                path: opts.socket.clone(),
                source,
            })?;
    }
    log::info!(
        "serving snapshots every {:?} on {}",
        opts.interval,
        opts.socket.display()
    );
    let mut next = Instant::now() + opts.interval;
    while !crate::signals::stop_requested() {
        crate::signals::sleep(next.saturating_duration_since(Instant::now()));
        if crate::signals::stop_requested() {
            break;
        }
        next += opts.interval;
        let snap = collector.collect();
        if let Some(m) = &mut metrics {
            m.refresh(&snap);
        }
        if opts.otlp.is_some() {
            identities.refresh(&snap);
        }
        match serde_json::to_vec(&snap) {
            Ok(body) => *latest.lock().expect("not poisoned") = Arc::new(body),
            Err(e) => log::warn!("serialising a snapshot: {e}"),
        }
    }
    let _ = std::fs::remove_file(&opts.socket);
    log::info!("stopped");
    Ok(())
}
