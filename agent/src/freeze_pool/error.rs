//! What starting the freeze pool can fail with: each error says what to change.

use std::path::PathBuf;

use region::freeze_pool::CHUNK_BYTES;
use thiserror::Error;

use crate::units;

/// What `run --freeze-pool` can fail with at start.
#[derive(Debug, Error)]
pub enum FreezePoolError {
    #[error(
        "--freeze-pool {}: less than one chunk ({}); give at least 1g, or 0 for no pool",
        units::bytes(*.0), units::bytes(CHUNK_BYTES)
    )]
    TooSmall(u64),
    #[error(
        "--freeze-pool {} is more than --freeze-host-budget {}: the pool lends host memory to \
         frozen containers, which the budget bounds; lower --freeze-pool or raise \
         --freeze-host-budget",
        units::bytes(*.size), units::bytes(*.budget)
    )]
    OverBudget { size: u64, budget: u64 },
    #[error(
        "--freeze-pool needs a tmpfs of its own in transparent huge pages, mounted nowhere: \
         {step} failed: {source} (it needs CAP_SYS_ADMIN and Linux 5.2 or newer with \
         transparent huge pages; run without --freeze-pool where the agent cannot have them)"
    )]
    Tmpfs {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--freeze-pool {}: the agent's memory cgroup allows {} ({}), and the pool's pages are \
         charged to it: raise the agent's memory limit to the pool's size plus 256 MiB, or \
         lower --freeze-pool",
        units::bytes(*.size), units::bytes(*.limit), .file.display()
    )]
    CgroupTooSmall {
        limit: u64,
        file: PathBuf,
        size: u64,
    },
    #[error("another vgpu-agent already serves the freeze pool on {}", .0.display())]
    AlreadyRunning(PathBuf),
    #[error("freeze pool socket: {what} {}: {source}", path.display())]
    Socket {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the freeze pool's threads: {0}")]
    Thread(#[source] std::io::Error),
}
