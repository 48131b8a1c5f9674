//! The smallest HTTP server that serves `/metrics`: std's `TcpListener`, one thread, one
//! connection at a time, bounded reads and writes. Scrapes come every few seconds from one or
//! two Prometheus servers; nothing here needs more. A scrape encodes nothing: it writes the body
//! the last refresh encoded ([`Latest`]).
//!
//! Content negotiation: OpenMetrics text for clients that accept it (Prometheus does), else the
//! Prometheus text format 0.0.4 (curl, `promtool check metrics`, older scrapers); gzip for
//! clients that accept it (Prometheus does).

use std::{
    io::{BufWriter, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::Arc,
    time::Duration,
};

use super::{
    ExportError,
    encode::{Format, Latest},
};

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const MAX_REQUEST: usize = 8 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` and serves the latest body on a thread of its own; returns the bound address
/// (port 0 picks a free one).
pub fn serve(addr: SocketAddr, latest: Arc<Latest>) -> Result<SocketAddr, ExportError> {
    let listener = TcpListener::bind(addr).map_err(|source| ExportError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ExportError::Bind { addr, source })?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = handle(conn, &latest) {
                    log::debug!("metrics connection: {e}");
                }
            }
        })
        .map_err(ExportError::Thread)?;
    Ok(bound)
}

/// Reads the request head (up to the blank line), bounded in size and time.
fn read_head(conn: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return Err(std::io::Error::other("request head too large"));
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn head(status: &str, ctype: &str, gzip: bool, len: usize) -> String {
    let encoding = if gzip {
        "Content-Encoding: gzip\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{encoding}Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

fn respond(conn: &mut TcpStream, status: &str, body: &[u8]) -> std::io::Result<()> {
    conn.write_all(head(status, "text/plain", false, body.len()).as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

/// What the request asks for: (format, gzip).
fn negotiate(head: &str) -> (Format, bool) {
    let header = |name: &'static str| {
        head.lines().skip(1).filter_map(move |l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    };
    let format = if header("accept").any(|v| v.contains("application/openmetrics-text")) {
        Format::OpenMetrics
    } else {
        Format::Text
    };
    // `gzip`, possibly with a weight; `gzip;q=0` refuses it.
    let gzip = header("accept-encoding")
        .flat_map(|v| v.split(','))
        .any(|c| {
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

fn handle(mut conn: TcpStream, latest: &Latest) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    // The body goes out in large writes (BufWriter); the last one must not wait for an ACK.
    conn.set_nodelay(true)?;
    let request = read_head(&mut conn)?;
    let mut parts = request.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let (format, gzip) = negotiate(&request);
            let ctype = match format {
                Format::OpenMetrics => CONTENT_TYPE,
                Format::Text => TEXT_CONTENT_TYPE,
            };
            let body = latest.get();
            let mut w = BufWriter::with_capacity(256 << 10, conn);
            if gzip {
                let gz = body.gzipped(format);
                w.write_all(head("200 OK", ctype, true, gz.len()).as_bytes())?;
                w.write_all(gz)?;
            } else {
                w.write_all(head("200 OK", ctype, false, body.len(format)).as_bytes())?;
                body.write_to(format, &mut w)?;
            }
            w.flush()
        }
        ("GET", _) => respond(&mut conn, "404 Not Found", b"see /metrics\n"),
        _ => respond(&mut conn, "405 Method Not Allowed", b"GET only\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_reads_accept_and_accept_encoding() {
        let prometheus = "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.3\r\nAccept-Encoding: gzip\r\n";
        assert_eq!(negotiate(prometheus), (Format::OpenMetrics, true));
        let curl = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n";
        assert_eq!(negotiate(curl), (Format::Text, false));
        let refused = "GET /metrics HTTP/1.1\r\naccept-encoding: deflate, gzip;q=0\r\n";
        assert_eq!(negotiate(refused), (Format::Text, false));
        let weighted = "GET /metrics HTTP/1.1\r\nACCEPT-ENCODING: br;q=1.0, GZIP;q=0.5\r\n";
        assert_eq!(negotiate(weighted), (Format::Text, true));
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
        let get = |extra: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}\r\n").unwrap();
            let mut resp = Vec::new();
            s.read_to_end(&mut resp).unwrap();
            let at = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8(resp[..at].to_vec()).unwrap();
            (head, resp[at + 4..].to_vec())
        };
        let (h, b) = get("Accept: application/openmetrics-text; version=1.0.0\r\n");
        assert!(h.contains(CONTENT_TYPE), "{h}");
        assert!(h.contains(&format!("Content-Length: {}", om.len())), "{h}");
        assert_eq!(String::from_utf8(b).unwrap(), om);
        let (h, b) = get("Accept-Encoding: gzip\r\n");
        assert!(
            h.contains(TEXT_CONTENT_TYPE) && h.contains("Content-Encoding: gzip"),
            "{h}"
        );
        let mut unzipped = String::new();
        flate2::read::GzDecoder::new(&b[..])
            .read_to_string(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, text);
        let (h, _) = get("");
        assert!(h.starts_with("HTTP/1.1 200 OK"), "{h}");
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /other HTTP/1.1\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    }
}
