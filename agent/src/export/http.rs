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
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
        time::Instant,
    };

    use super::*;

    #[test]
    fn negotiation_reads_accept_and_accept_encoding() {
        let n = |accept: &[&'static str], encoding: &[&'static str]| {
            negotiate(accept.iter().copied(), encoding.iter().copied())
        };
        let prometheus = n(
            &["application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.3"],
            &["gzip"],
        );
        assert_eq!(prometheus, (Format::OpenMetrics, true));
        assert_eq!(n(&["*/*"], &[]), (Format::Text, false));
        assert_eq!(n(&[], &["deflate, gzip;q=0"]), (Format::Text, false));
        assert_eq!(n(&[], &["br;q=1.0, GZIP;q=0.5"]), (Format::Text, true));
        assert_eq!(n(&["text/plain"], &["br", "gzip"]), (Format::Text, true));
    }

    /// The status line and headers, and the body, of a response read to its end.
    fn split(resp: &[u8]) -> (String, Vec<u8>) {
        let at = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        (
            String::from_utf8(resp[..at].to_vec())
                .unwrap()
                .to_lowercase(),
            resp[at + 4..].to_vec(),
        )
    }

    fn get(addr: SocketAddr, request: &str) -> (String, Vec<u8>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).unwrap();
        split(&resp)
    }

    /// A server with no body yet under `limits`, on a free port, and the counters it keeps.
    fn serve_counted(limits: Limits) -> (SocketAddr, Arc<HttpCounters>) {
        let counters = Arc::new(HttpCounters::default());
        let addr = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Latest::default()),
            limits,
            Arc::clone(&counters),
        )
        .unwrap();
        (addr, counters)
    }

    #[test]
    fn scrapes_get_the_latest_body_in_the_asked_format() {
        use crate::export::{encode::Body, metrics::tests as m};
        let latest = Arc::new(Latest::default());
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&latest)).unwrap();
        let snap = m::synthetic(2, 3);
        let mut view = crate::export::metrics::MetricsView::new(
            Default::default(),
            Arc::new(Default::default()),
        );
        let body = Body::encode(&view.update(&snap));
        let (om, text) = (body.text(Format::OpenMetrics), body.text(Format::Text));
        latest.set(body);
        let req = |extra: &str| format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let (h, b) = get(
            addr,
            &req("Accept: application/openmetrics-text; version=1.0.0\r\n"),
        );
        assert!(h.contains(CONTENT_TYPE), "{h}");
        assert!(h.contains(&format!("content-length: {}", om.len())), "{h}");
        assert!(h.contains("connection: close"), "{h}");
        assert_eq!(String::from_utf8(b).unwrap(), om);
        let (h, b) = get(addr, &req("Accept-Encoding: gzip\r\n"));
        assert!(
            h.contains(TEXT_CONTENT_TYPE) && h.contains("content-encoding: gzip"),
            "{h}"
        );
        let mut unzipped = String::new();
        flate2::read::GzDecoder::new(&b[..])
            .read_to_string(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, text);
        // HTTP/1.0, as the integration tests' clients speak it.
        let (h, b) = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(h.starts_with("http/1.0 200 ok"), "{h}");
        assert_eq!(String::from_utf8(b).unwrap(), text);
        let (h, _) = get(addr, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(h.starts_with("http/1.1 404"), "{h}");
        let (h, _) = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(h.starts_with("http/1.1 405"), "{h}");
        // A new refresh: the next scrape gets it, not the rendering cached for the last one.
        let body = Body::encode(&view.update(&m::synthetic(3, 3)));
        let fresh = body.text(Format::Text);
        assert_ne!(fresh, text);
        latest.set(body);
        let (_, b) = get(addr, &req(""));
        assert_eq!(String::from_utf8(b).unwrap(), fresh);
    }

    /// Reads until the server closes the connection (or `within` passes): whether it did.
    fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Waits (up to 10 s) for a counter to reach `want`: the server counts a drop just after it
    /// closes the connection.
    fn wait_count(counter: &AtomicU64, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while counter.load(Relaxed) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(counter.load(Relaxed), want);
    }

    fn short_limits() -> Limits {
        Limits {
            header_timeout: Duration::from_millis(300),
            deadline: Duration::from_secs(60),
            max_connections: 4,
            max_head: 8 << 10,
        }
    }

    #[test]
    fn a_client_that_does_not_finish_its_head_is_closed_at_the_header_deadline() {
        let (addr, counters) = serve_counted(short_limits());
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut slow, Duration::from_secs(20)));
        assert!(started.elapsed() >= Duration::from_millis(250));
        wait_count(&counters.header_timeout, 1);
    }

    #[test]
    fn an_exchange_past_its_deadline_is_closed_and_counted() {
        let limits = Limits {
            header_timeout: Duration::from_secs(60),
            deadline: Duration::from_millis(200),
            ..short_limits()
        };
        let (addr, counters) = serve_counted(limits);
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /").unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(20)));
        wait_count(&counters.deadline, 1);
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room_for_a_scrape() {
        let limits = Limits {
            header_timeout: Duration::from_secs(60),
            ..short_limits()
        };
        let (addr, counters) = serve_counted(limits);
        let mut idle: Vec<TcpStream> = Vec::new();
        for _ in 0..limits.max_connections {
            idle.push(TcpStream::connect(addr).unwrap());
            // Accepted in this order (the oldest is evicted first).
            std::thread::sleep(Duration::from_millis(50));
        }
        let (h, _) = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(h.starts_with("http/1.1 200"), "{h}");
        wait_count(&counters.evicted, 1);
        assert!(
            closed_within(&mut idle[0], Duration::from_secs(20)),
            "the oldest idle connection was closed"
        );
        assert!(
            !closed_within(&mut idle[1], Duration::from_millis(200)),
            "the others stay open"
        );
        assert_eq!(counters.refused.load(Relaxed), 0);
    }
}
