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
    let mut view =
        crate::export::metrics::MetricsView::new(Default::default(), Arc::new(Default::default()));
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
