//! `/metrics` over HTTP/1.1 on hyper, on the agent's tokio runtime ([`crate::runtime`]): every
//! connection is a task of its own, so a slow or idle client never delays another. Each
//! connection has a whole-request deadline and a header deadline, and the number of open
//! connections is capped ([`Limits`]); at the cap a new connection evicts the oldest one that
//! has not sent its request yet (an idle or slow client), else it is refused. Whatever is
//! dropped is counted ([`HttpCounters`]). A scrape encodes nothing: it sends the text the last
//! refresh encoded ([`Latest`]), shared by every scrape without a copy, then its own tail (the
//! snapshot's age at that moment, `# EOF`; see [`crate::export::encode`]).
//!
//! Content negotiation: OpenMetrics text for clients that accept it (Prometheus does), else the
//! Prometheus text format 0.0.4 (curl, `promtool check metrics`, older scrapers); gzip for
//! clients that accept it (Prometheus does).

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Buf, Bytes, buf::Chain};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Notify;

use super::{
    ExportError,
    encode::{Format, Latest},
};

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What one client may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The request head (request line and headers) must arrive within this.
    pub header_timeout: Duration,
    /// The whole exchange (head read, response written) must end within this.
    pub deadline: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Bytes of the request head at most.
    pub max_head: usize,
}

impl Limits {
    /// 5 s for the head (a scraper sends it in one packet), 10 s for the whole exchange
    /// (Prometheus' default scrape timeout), 512 connections (a node has one or two scrapers; an
    /// attacker's idle connections are evicted before a scraper is refused), 8 KiB of head.
    pub const DEFAULT: Limits = Limits {
        header_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(10),
        max_connections: 512,
        max_head: 8 << 10,
    };
}

/// Connections the server dropped, by reason (cumulative).
#[derive(Debug, Default)]
pub struct HttpCounters {
    /// The head did not arrive within [`Limits::header_timeout`].
    pub header_timeout: AtomicU64,
    /// The exchange outlasted [`Limits::deadline`].
    pub deadline: AtomicU64,
    /// Closed before its request to make room at [`Limits::max_connections`].
    pub evicted: AtomicU64,
    /// Refused at [`Limits::max_connections`] (every open connection was being answered).
    pub refused: AtomicU64,
}

impl HttpCounters {
    /// `(reason, count)` pairs, as the metrics label them.
    pub fn by_reason(&self) -> BTreeMap<String, u64> {
        [
            ("header_timeout", &self.header_timeout),
            ("deadline", &self.deadline),
            ("evicted", &self.evicted),
            ("refused", &self.refused),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.load(Relaxed)))
        .collect()
    }
}

/// Binds `addr` and serves the latest body with [`Limits::DEFAULT`]; returns the bound address
/// (port 0 picks a free one).
#[cfg(test)]
pub fn serve(addr: SocketAddr, latest: Arc<Latest>) -> Result<SocketAddr, ExportError> {
    serve_with(addr, latest, Limits::DEFAULT, Arc::default())
}

/// As [`serve`], with these limits, counting drops in `counters`.
pub fn serve_with(
    addr: SocketAddr,
    latest: Arc<Latest>,
    limits: Limits,
    counters: Arc<HttpCounters>,
) -> Result<SocketAddr, ExportError> {
    let bind = |source| ExportError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
    let bound = listener.local_addr().map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let runtime = crate::runtime::handle().map_err(ExportError::Thread)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(bind)?
    };
    let server = Arc::new(Server {
        latest,
        limits,
        counters,
        open: Mutex::new(Open::default()),
    });
    runtime.spawn(server.accept(listener));
    Ok(bound)
}

/// A connection as the cap sees it.
struct Conn {
    /// Its request head has arrived (it is being answered: never evicted).
    answering: AtomicBool,
    evict: Notify,
}

#[derive(Default)]
struct Open {
    next: u64,
    /// By age: the first entry is the oldest.
    conns: BTreeMap<u64, Arc<Conn>>,
}

struct Server {
    latest: Arc<Latest>,
    limits: Limits,
    counters: Arc<HttpCounters>,
    open: Mutex<Open>,
}

impl Server {
    async fn accept(self: Arc<Server>, listener: tokio::net::TcpListener) {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or memory: let connections end before accepting more.
                    log::debug!("accepting a metrics connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some((id, conn)) = self.admit() else {
                self.counters.refused.fetch_add(1, Relaxed);
                continue;
            };
            tokio::spawn(Arc::clone(&self).connection(stream, id, conn));
        }
    }

    /// Registers a new connection; at the cap, evicts the oldest one still waiting for its
    /// request, or refuses this one (`None`) if every open connection is being answered.
    fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.conns.len() >= self.limits.max_connections {
            let idle = open
                .conns
                .iter()
                .find(|(_, c)| !c.answering.load(Relaxed))
                .map(|(&id, _)| id)?;
            if let Some(c) = open.conns.remove(&idle) {
                // notify_one stores a permit if the task is not waiting yet.
                c.evict.notify_one();
                self.counters.evicted.fetch_add(1, Relaxed);
            }
        }
        let id = open.next;
        open.next += 1;
        let conn = Arc::new(Conn {
            answering: AtomicBool::new(false),
            evict: Notify::new(),
        });
        open.conns.insert(id, Arc::clone(&conn));
        Some((id, conn))
    }

    async fn connection(
        self: Arc<Server>,
        stream: tokio::net::TcpStream,
        id: u64,
        conn: Arc<Conn>,
    ) {
        // The body goes out in large writes; the last one must not wait for an ACK.
        let _ = stream.set_nodelay(true);
        let service = {
            let server = Arc::clone(&self);
            let conn = Arc::clone(&conn);
            service_fn(move |req| {
                conn.answering.store(true, Relaxed);
                let response = server.respond(&req);
                async move { Ok::<_, Infallible>(response) }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_header_size(self.limits.max_head)
            .keep_alive(false);
        let serving = builder.serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            done = tokio::time::timeout(self.limits.deadline, serving) => match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_timeout() => {
                    self.counters.header_timeout.fetch_add(1, Relaxed);
                }
                Ok(Err(e)) => log::debug!("metrics connection: {e}"),
                Err(_) => {
                    self.counters.deadline.fetch_add(1, Relaxed);
                }
            },
            () = conn.evict.notified() => {}
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.conns.remove(&id);
    }

    fn respond(&self, req: &Request<Incoming>) -> Response<Full<Chain<Bytes, Bytes>>> {
        let text = |status: StatusCode, body: &'static str| {
            let body = Bytes::from_static(body.as_bytes()).chain(Bytes::new());
            let mut r = Response::new(Full::new(body));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            r
        };
        if req.method() != hyper::Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        if req.uri().path() != "/metrics" {
            return text(StatusCode::NOT_FOUND, "see /metrics\n");
        }
        let values = |name| {
            req.headers()
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
        };
        let (format, gzip) = negotiate(values(header::ACCEPT), values(header::ACCEPT_ENCODING));
        let [shared, tail] = self.latest.get().pieces(format, gzip);
        let mut r = Response::new(Full::new(shared.chain(tail)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(match format {
                Format::OpenMetrics => CONTENT_TYPE,
                Format::Text => TEXT_CONTENT_TYPE,
            }),
        );
        if gzip {
            h.insert(
                header::CONTENT_ENCODING,
                header::HeaderValue::from_static("gzip"),
            );
        }
        r
    }
}

/// What the request asks for, from its `Accept` and `Accept-Encoding` values: (format, gzip).
fn negotiate<'a>(
    mut accept: impl Iterator<Item = &'a str>,
    accept_encoding: impl Iterator<Item = &'a str>,
) -> (Format, bool) {
    let format = if accept.any(|v| v.contains("application/openmetrics-text")) {
        Format::OpenMetrics
    } else {
        Format::Text
    };
    // `gzip`, possibly with a weight; `gzip;q=0` refuses it.
    let gzip = accept_encoding.flat_map(|v| v.split(',')).any(|c| {
        let mut parts = c.split(';').map(str::trim);
        parts.next().is_some_and(|n| n.eq_ignore_ascii_case("gzip"))
            && !parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q == 0.0)
            })
    });
    (format, gzip)
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
