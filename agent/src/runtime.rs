//! The agent's one tokio runtime, started on first use: two worker threads (the agent's own work
//! is a snapshot per interval; the runtime serves its network clients). The `/metrics` server
//! runs on it; the OTLP gRPC exporter keeps the one-thread runtime tonic's client is built in.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime's handle (starting it on the first call).
pub fn handle() -> std::io::Result<Handle> {
    if let Some(r) = RUNTIME.get() {
        return Ok(r.handle().clone());
    }
    let runtime = Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("vgpu-agent-rt")
        .enable_all()
        .build()?;
    // Another thread may have started one meanwhile: then that one is used and this one dropped.
    Ok(RUNTIME.get_or_init(|| runtime).handle().clone())
}
