//! What a `cdi` command can fail with.

use std::path::PathBuf;

use super::names::{LIMITER_FILE, PROFILE_SYNTAX};

/// What a `cdi` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("--kind {kind:?}: {why}")]
    Kind { kind: String, why: String },
    #[error("--device {device:?}: {why}")]
    Device { device: String, why: String },
    #[error("no devices: give at least one --device {PROFILE_SYNTAX}")]
    NoDevices,
    #[error("--device {0:?} is given twice")]
    DuplicateDevice(String),
    #[error(
        "--region-size {given}: a region needs {min}; a smaller tmpfs would kill processes with SIGBUS"
    )]
    RegionSize { given: String, min: String },
    #[error("--region-size {0:?}: expected a size such as 64m")]
    RegionSizeSyntax(String),
    #[error(
        "{} is missing: install the limiter on this node first (`vgpu-agent cdi install --lib-dir {}`)",
        path.display(),
        lib_dir.display()
    )]
    NotInstalled { path: PathBuf, lib_dir: PathBuf },
    #[error("{} is not the vgpu-agent limiter: {why}", path.display())]
    NotLimiter { path: PathBuf, why: String },
    #[error(
        "no limiter found beside this binary: pass --limiter PATH (built by `cargo build --release -p limiter` as target/release/{LIMITER_FILE})"
    )]
    NoLimiter,
    #[error(
        "{}: vgpu-agent writes CDI specs as JSON, which podman, containerd and CRI-O read; name the file .json",
        path.display()
    )]
    NotJson { path: PathBuf },
    #[error("could not read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
