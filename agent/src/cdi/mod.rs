//! `vgpu-agent cdi`: the limiter through the Container Device Interface, for podman, containerd
//! and CRI-O without HAMi's device plugin.
//!
//! `cdi install` puts the limiter and a one-line preload list in a host directory
//! (`/usr/local/lib/vgpu-agent`); `cdi generate` writes a spec whose devices are limit profiles
//! (`--device small:mem=4g,sm=25`). A container run with `--device vgpu-agent.dev/limit=small`
//! gets the limiter mounted read-only and preloaded, HAMi's variables for the profile's limits
//! (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`), and a tmpfs of its own for its region
//! (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), which the agent finds through the processes that map it.
//! The GPU itself still comes from NVIDIA's CDI spec (`--device nvidia.com/gpu=0`).

pub mod install;
pub mod profile;
pub mod spec;

use std::path::{Path, PathBuf};

use clap::Subcommand;

use self::{
    profile::{Kind, PROFILE_SYNTAX, Profile, format_bytes},
    spec::{LIMITER_FILE, PRELOAD_FILE, Preload, SpecOptions},
};

/// The library directory on the node, by default.
pub const DEFAULT_LIB_DIR: &str = "/usr/local/lib/vgpu-agent";
pub const DEFAULT_KIND: &str = "vgpu-agent.dev/limit";

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

#[derive(Subcommand)]
pub enum CdiCommand {
    /// Install the limiter and its preload list on this node (the files a spec's mounts name).
    Install {
        /// The host directory to install into (the same --lib-dir as `cdi generate`).
        #[arg(long, default_value = DEFAULT_LIB_DIR)]
        lib_dir: PathBuf,
        /// The limiter to install (default: beside this binary, or /usr/lib/vgpu-agent in the
        /// image).
        #[arg(long)]
        limiter: Option<PathBuf>,
    },
    /// Write a CDI spec whose devices inject the limiter with the given limits.
    Generate {
        /// A device: NAME:mem=SIZE[,sm=PERCENT], e.g. small:mem=4g,sm=25 (repeatable). A
        /// container asks for it with --device KIND=NAME.
        #[arg(long = "device", value_name = "NAME:LIMITS", required = true)]
        devices: Vec<String>,
        /// Where to write the spec (JSON, e.g. /etc/cdi/vgpu-agent.json); `-` for stdout.
        #[arg(long, default_value = "-")]
        output: PathBuf,
        /// The CDI kind, vendor/class.
        #[arg(long, default_value = DEFAULT_KIND)]
        kind: String,
        /// The host directory holding the limiter and the preload list (`cdi install`).
        #[arg(long, default_value = DEFAULT_LIB_DIR)]
        lib_dir: PathBuf,
        /// How processes load the limiter.
        #[arg(long, value_enum, default_value = "ld.so.preload")]
        preload: Preload,
        /// Size of each container's region tmpfs (memory is used only as the region is written).
        #[arg(long, default_value = "64m")]
        region_size: String,
        /// Where the host's filesystem is, to check the library directory from a container
        /// (e.g. /host); the spec names host paths as they are on the host.
        #[arg(long, default_value = "/")]
        host_root: PathBuf,
    },
}

/// Runs a `cdi` command; returns what to tell the user (on stderr: stdout may be the spec).
pub fn run(command: CdiCommand) -> Result<Vec<String>, CdiError> {
    match command {
        CdiCommand::Install { lib_dir, limiter } => {
            let limiter = limiter
                .or_else(install::default_limiter)
                .ok_or(CdiError::NoLimiter)?;
            let done = install::install(&limiter, &lib_dir)?;
            Ok(vec![
                format!(
                    "installed {} (from {})",
                    done.limiter.display(),
                    limiter.display()
                ),
                format!("wrote {}", done.preload.display()),
            ])
        }
        CdiCommand::Generate {
            devices,
            output,
            kind,
            lib_dir,
            preload,
            region_size,
            host_root,
        } => {
            let opts = options(&kind, &devices, lib_dir, preload, &region_size)?;
            let to_stdout = output.as_os_str() == "-";
            if !to_stdout && output.extension().is_none_or(|e| e != "json") {
                return Err(CdiError::NotJson { path: output });
            }
            check_installed(&opts, &host_root)?;
            let text = render(&opts);
            if to_stdout {
                print!("{text}");
                return Ok(Vec::new());
            }
            install::write_atomically(&output, text.as_bytes(), 0o644)?;
            let names: Vec<String> = opts
                .devices
                .iter()
                .map(|d| format!("{}={}", opts.kind, d.name))
                .collect();
            Ok(vec![
                format!("wrote {}", output.display()),
                format!("devices: {}", names.join(" ")),
            ])
        }
    }
}

/// Validated spec options from the command line's strings.
pub fn options(
    kind: &str,
    devices: &[String],
    lib_dir: PathBuf,
    preload: Preload,
    region_size: &str,
) -> Result<SpecOptions, CdiError> {
    let kind: Kind = kind.parse()?;
    if devices.is_empty() {
        return Err(CdiError::NoDevices);
    }
    let mut profiles: Vec<Profile> = Vec::new();
    for d in devices {
        let p: Profile = d.parse()?;
        if profiles.iter().any(|q| q.name == p.name) {
            return Err(CdiError::DuplicateDevice(p.name));
        }
        profiles.push(p);
    }
    let size = crate::limit::parse_memory(region_size)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| CdiError::RegionSizeSyntax(region_size.to_owned()))?;
    let min = spec::min_region_size();
    if size < min {
        return Err(CdiError::RegionSize {
            given: region_size.to_owned(),
            min: format_bytes(min),
        });
    }
    Ok(SpecOptions {
        kind,
        devices: profiles,
        lib_dir,
        preload,
        region_size: size,
    })
}

/// The files the spec mounts must be on the node (under `host_root` when run in a container).
fn check_installed(opts: &SpecOptions, host_root: &Path) -> Result<(), CdiError> {
    let mut needed = vec![opts.lib_dir.join(LIMITER_FILE)];
    if opts.preload == Preload::LdSoPreload {
        needed.push(opts.lib_dir.join(PRELOAD_FILE));
    }
    for path in needed {
        let on_host = host_root.join(path.strip_prefix("/").unwrap_or(&path));
        if !on_host.is_file() {
            return Err(CdiError::NotInstalled {
                path,
                lib_dir: opts.lib_dir.clone(),
            });
        }
        if path.ends_with(LIMITER_FILE) {
            install::check_limiter(&on_host)?;
        }
    }
    Ok(())
}

/// The spec as pretty JSON with a final newline.
pub fn render(opts: &SpecOptions) -> String {
    let mut text = serde_json::to_string_pretty(&spec::build(opts)).expect("a spec serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests;
