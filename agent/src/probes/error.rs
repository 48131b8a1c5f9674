//! Why loading or attaching the probes failed.

use std::path::PathBuf;

use aya::{maps::MapError, programs::ProgramError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("{0}")]
    NotPrivileged(String),
    #[error(
        "this vgpu-agent was built without its eBPF probes (bpf-linker or the pinned nightly was missing at build time): run `cargo xtask setup` and rebuild"
    )]
    BuiltWithoutProbes,
    #[error("loading the eBPF programs into the kernel failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("eBPF program {name}: {source}")]
    Program {
        name: String,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("the eBPF object has no program {0}")]
    MissingProgram(String),
    #[error("attaching {program} to {} failed: {source}", path.display())]
    Attach {
        program: String,
        path: PathBuf,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("reading {}: {source}", path.display())]
    ReadLibrary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Library(#[from] tenant_fs::TenantFsError),
    #[error("{} is not an ELF library: {reason}", path.display())]
    NotElf { path: PathBuf, reason: String },
    #[error("{} does not look like the driver it is named after: {reason}", path.display())]
    NotADriver { path: PathBuf, reason: String },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
}
