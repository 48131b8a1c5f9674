//! Reading snapshots from a running `vgpu-agent run` over its socket (`crate::daemon` serves them).

use std::{io::Read, os::unix::net::UnixStream, path::Path, time::Duration};

use thiserror::Error;

use crate::model::Snapshot;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("no agent answers on {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("reading from {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the agent on {path} sent something that is not a snapshot: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
}

/// Fetches the daemon's latest snapshot.
pub fn fetch(socket: &Path, timeout: Duration) -> Result<Snapshot, ClientError> {
    let path = socket.display().to_string();
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: path.clone(),
        source,
    })?;
    s.set_read_timeout(Some(timeout))
        .map_err(|source| ClientError::Read {
            path: path.clone(),
            source,
        })?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)
        .map_err(|source| ClientError::Read {
            path: path.clone(),
            source,
        })?;
    serde_json::from_slice(&body).map_err(|source| ClientError::Decode { path, source })
}
