//! The CDI spec this project writes (<https://github.com/cncf-tags/container-device-interface>,
//! `SPEC.md`), version 0.5.0: the newest that podman 4.3 (Debian 12) reads; it rejects 0.6.0
//! specs as unresolvable. 0.5.0 has everything used here: `env`, and `mounts` with a `type`
//! (0.4.0) for the tmpfs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    names::{LIMITER_FILE, PRELOAD_FILE},
    profile::{Kind, Profile, format_bytes},
};

pub const CDI_VERSION: &str = "0.5.0";

/// Where the limiter is inside the container.
pub const LIMITER_IN_CONTAINER: &str = "/usr/local/lib/vgpu-agent/libvgpu_limiter.so";
/// The container's own region directory (a tmpfs of its own), and the region file in it.
pub const REGION_DIR_IN_CONTAINER: &str = "/var/lib/vgpu-agent/region";
pub const REGION_IN_CONTAINER: &str = "/var/lib/vgpu-agent/region/vgpu.cache";

/// How the limiter gets into the container's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preload {
    /// Mount a one-line `/etc/ld.so.preload` (as HAMi does): every process of a glibc image
    /// loads the limiter, whatever its environment; images without glibc (musl) ignore the file.
    #[value(name = "ld.so.preload")]
    LdSoPreload,
    /// Set `LD_PRELOAD`: leaves the image's own `/etc/ld.so.preload` alone, but a process that
    /// clears its environment runs without the limiter, and a musl image fails to start.
    Env,
}

/// What goes into a spec.
#[derive(Clone, Debug)]
pub struct SpecOptions {
    pub kind: Kind,
    pub devices: Vec<Profile>,
    /// The host directory holding the limiter and the preload list (`vgpu-agent cdi install`).
    pub lib_dir: PathBuf,
    pub preload: Preload,
    /// Size of each container's region tmpfs, bytes.
    pub region_size: u64,
    /// The node's QoS board directory (`--qos-board-dir`), bind-mounted read-write into every
    /// container so that their tiers see each other (docs/qos.md).
    pub qos_board_dir: Option<PathBuf>,
    /// The daemon's freeze pool socket directory (`--freeze-pool-dir`), bind-mounted read-only
    /// into every container (connecting to a socket needs no write access to its mount).
    pub freeze_pool_dir: Option<PathBuf>,
}

/// Where the QoS board directory is in a container, and the board in it.
pub const QOS_DIR_IN_CONTAINER: &str = "/var/lib/vgpu-agent/qos";
pub const QOS_BOARD_IN_CONTAINER: &str = "/var/lib/vgpu-agent/qos/board";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// A read-only bind mount of a host file.
fn bind_ro(host: &Path, container: &str) -> Mount {
    Mount {
        host_path: host.display().to_string(),
        container_path: container.to_owned(),
        mount_type: None,
        options: strings(&["ro", "nosuid", "nodev", "bind"]),
    }
}

/// The spec: every device shares the limiter, its preload and a region tmpfs (the spec-wide
/// edits, applied once whichever devices a container asks for) and sets its own limits.
pub fn build(opts: &SpecOptions) -> Spec {
    let mut env = vec![format!(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE={REGION_IN_CONTAINER}"
    )];
    let mut mounts = vec![bind_ro(
        &opts.lib_dir.join(LIMITER_FILE),
        LIMITER_IN_CONTAINER,
    )];
    match opts.preload {
        Preload::LdSoPreload => {
            mounts.push(bind_ro(
                &opts.lib_dir.join(PRELOAD_FILE),
                "/etc/ld.so.preload",
            ));
        }
        Preload::Env => env.push(format!("LD_PRELOAD={LIMITER_IN_CONTAINER}")),
    }
    // A tmpfs per container: the region is the container's alone (two containers asking for the
    // same device never share a limit), never touches a disk, and goes away with the container.
    mounts.push(Mount {
        host_path: "tmpfs".into(),
        container_path: REGION_DIR_IN_CONTAINER.into(),
        mount_type: Some("tmpfs".into()),
        options: vec![
            "nosuid".into(),
            "nodev".into(),
            "noexec".into(),
            format!("size={}", format_bytes(opts.region_size)),
            "mode=1777".into(),
        ],
    });
    if let Some(dir) = &opts.qos_board_dir {
        env.push(format!("VGPU_QOS_BOARD={QOS_BOARD_IN_CONTAINER}"));
        mounts.push(Mount {
            host_path: dir.display().to_string(),
            container_path: QOS_DIR_IN_CONTAINER.into(),
            mount_type: None,
            options: strings(&["rw", "nosuid", "nodev", "noexec", "bind"]),
        });
    }
    if let Some(dir) = &opts.freeze_pool_dir {
        let socket = Path::new(region::freeze_pool::DEFAULT_SOCKET);
        let in_container = socket.parent().unwrap_or(Path::new("/"));
        env.push(format!(
            "{}={}",
            region::freeze_pool::SOCKET_ENV,
            region::freeze_pool::DEFAULT_SOCKET
        ));
        mounts.push(Mount {
            host_path: dir.display().to_string(),
            container_path: in_container.display().to_string(),
            mount_type: None,
            options: strings(&["ro", "nosuid", "nodev", "noexec", "bind"]),
        });
    }
    let devices = opts
        .devices
        .iter()
        .map(|p| {
            let mut env = Vec::new();
            if let Some(bytes) = p.memory {
                env.push(format!("CUDA_DEVICE_MEMORY_LIMIT={}", format_bytes(bytes)));
            }
            if let Some(sm) = p.sm {
                env.push(format!("CUDA_DEVICE_SM_LIMIT={sm}"));
            }
            if let Some(tier) = &p.tier {
                env.push(format!("VGPU_QOS_TIER={tier}"));
            }
            if let Some(g) = p.guarantee {
                env.push(format!("VGPU_QOS_GUARANTEE={g}"));
            }
            Device {
                name: p.name.clone(),
                container_edits: ContainerEdits {
                    env,
                    mounts: Vec::new(),
                },
            }
        })
        .collect();
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: opts.kind.to_string(),
        devices,
        container_edits: ContainerEdits { env, mounts },
    }
}

/// The smallest region tmpfs: a region of the default slot count and its control block. A
/// smaller one would fail a process with SIGBUS when it touches a page past the size.
pub fn min_region_size() -> u64 {
    let bytes =
        region::layout::region_size(region::DEFAULT_SLOTS) + region::control::CONTROL_SIZE as u64;
    bytes.div_ceil(1 << 20) << 20
}
