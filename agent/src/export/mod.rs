//! Exporters: views of the model in the standard protocols. `/metrics` (Prometheus/OpenMetrics
//! text, [`metrics`] over [`http`]) and OTLP traces of sampled calls ([`otlp`]).

pub mod defs;
pub mod encode;
mod exposition;
mod families;
mod gpu_use;
pub mod http;
pub mod metrics;
pub mod otlp;
pub mod otlp_metrics;
pub mod sampling;

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
    #[error("setting up the OTLP exporter: {0}")]
    Otlp(String),
}

/// `--metrics-listen`: an address, or `off` (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

pub fn parse_listen(s: &str) -> Result<Listen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Listen(None));
    }
    s.parse()
        .map(|a| Listen(Some(a)))
        .map_err(|e| format!("{s:?} is not ADDRESS:PORT or `off`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_is_an_address_or_off() {
        assert_eq!(
            parse_listen("127.0.0.1:9400").unwrap().0,
            Some("127.0.0.1:9400".parse().unwrap())
        );
        assert_eq!(parse_listen("off").unwrap().0, None);
        assert!(parse_listen("9400").unwrap_err().contains("ADDRESS:PORT"));
    }
}
