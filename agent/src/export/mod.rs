//! Exporters: views of the model in the standard protocols. `/metrics` (Prometheus/OpenMetrics
//! text, [`metrics`] over [`http`]) and OTLP traces of sampled calls ([`otlp`]).

pub mod defs;
pub mod http;
pub mod metrics;

use std::net::SocketAddr;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExportError {
    #[error("binding the metrics listener {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting an exporter thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// `--metrics-listen`: an address, or `off`.
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| format!("{s:?} is not ADDRESS:PORT or `off`: {e}"))
}
