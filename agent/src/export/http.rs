//! The smallest HTTP server that serves `/metrics`: std's `TcpListener`, one thread, one
//! connection at a time, bounded reads and writes. Scrapes come every few seconds from one or
//! two Prometheus servers; nothing here needs more.
//!
//! Content negotiation: OpenMetrics text (what prometheus-client encodes) for clients that accept
//! it (Prometheus does), else the Prometheus text format 0.0.4 (curl, `promtool check metrics`,
//! older scrapers), derived from the same encoding by [`to_prometheus_text`].

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::Arc,
    time::Duration,
};

use prometheus_client::registry::Registry;

use super::ExportError;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const MAX_REQUEST: usize = 8 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr` and serves the registry on a thread of its own; returns the bound address
/// (port 0 picks a free one).
pub fn serve(addr: SocketAddr, registry: Arc<Registry>) -> Result<SocketAddr, ExportError> {
    let listener = TcpListener::bind(addr).map_err(|source| ExportError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ExportError::Bind { addr, source })?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = handle(conn, &registry) {
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

fn respond(conn: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

fn handle(mut conn: TcpStream, registry: &Registry) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let head = read_head(&mut conn)?;
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let openmetrics = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("accept:") && l.contains("application/openmetrics-text")
    });
    match (method, path) {
        ("GET", "/metrics") => match super::encode::encode(registry) {
            Ok(body) if openmetrics => respond(&mut conn, "200 OK", CONTENT_TYPE, body.as_bytes()),
            Ok(body) => respond(
                &mut conn,
                "200 OK",
                TEXT_CONTENT_TYPE,
                to_prometheus_text(&body).as_bytes(),
            ),
            Err(_) => respond(
                &mut conn,
                "500 Internal Server Error",
                "text/plain",
                b"encoding failed\n",
            ),
        },
        ("GET", _) => respond(&mut conn, "404 Not Found", "text/plain", b"see /metrics\n"),
        _ => respond(
            &mut conn,
            "405 Method Not Allowed",
            "text/plain",
            b"GET only\n",
        ),
    }
}

/// OpenMetrics text to the Prometheus text format 0.0.4: counters' `# HELP`/`# TYPE` name the
/// `_total` series, and `# UNIT` and `# EOF` (not part of 0.0.4) go.
pub fn to_prometheus_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
        {
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if counters.contains(name) {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            out.push_str(&format!("# HELP {name} {help}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_counters_become_text_format_counters() {
        let om = "# HELP a_calls Calls.\n# TYPE a_calls counter\na_calls_total{x=\"1\"} 3\n\
                  # HELP b_bytes Size.\n# TYPE b_bytes gauge\n# UNIT b_bytes bytes\nb_bytes 2\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP a_calls_total Calls.\n# TYPE a_calls_total counter\na_calls_total{x=\"1\"} 3\n\
             # HELP b_bytes Size.\n# TYPE b_bytes gauge\nb_bytes 2\n"
        );
    }
}
