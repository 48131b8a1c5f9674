//! The smallest HTTP server that serves `/metrics`: std's `TcpListener`, one thread, one
//! connection at a time, bounded reads and writes. Scrapes come every few seconds from one or
//! two Prometheus servers; nothing here needs more.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::Arc,
    time::Duration,
};

use prometheus_client::registry::Registry;

use super::ExportError;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
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
    match (method, path) {
        ("GET", "/metrics") => match super::metrics::encode(registry) {
            Ok(body) => respond(&mut conn, "200 OK", CONTENT_TYPE, body.as_bytes()),
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
