//! Where the agent reads the host's state from. Tests point these at fixture trees.

use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct HostPaths {
    /// procfs (`/proc`).
    pub proc: PathBuf,
    /// The loader cache (`/etc/ld.so.cache`).
    pub ld_so_cache: PathBuf,
    /// Driver directories searched after the loader cache.
    pub driver_dirs: Vec<PathBuf>,
    /// Prefix for host paths found in the loader cache (`/` normally).
    pub root: PathBuf,
    /// The Docker Engine API socket.
    pub docker_socket: PathBuf,
    /// The kubelet's pod log directories (`<namespace>_<pod>_<uid>/<container>/`).
    pub pod_logs_dir: PathBuf,
    /// containerd's task bundles (`<namespace>/<id>/config.json`).
    pub containerd_tasks_dir: PathBuf,
    /// CRI-O's container directories (`<id>/userdata/config.json`).
    pub crio_containers_dir: PathBuf,
    /// The `containers/storage` graph root that podman and CRI-O keep containers in.
    pub container_storage: PathBuf,
}

const DOCKER_SOCKET: &str = "/var/run/docker.sock";
const POD_LOGS_DIR: &str = "/var/log/pods";
const CONTAINERD_TASKS_DIR: &str = "/run/containerd/io.containerd.runtime.v2.task";
const CRIO_CONTAINERS_DIR: &str = "/run/containers/storage/overlay-containers";
const CONTAINER_STORAGE: &str = "/var/lib/containers/storage";

/// Directories where drivers install libcuda, searched after ld.so.cache.
pub const DRIVER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
];

impl HostPaths {
    pub fn system() -> HostPaths {
        HostPaths {
            proc: PathBuf::from("/proc"),
            ld_so_cache: PathBuf::from("/etc/ld.so.cache"),
            driver_dirs: DRIVER_DIRS.iter().map(PathBuf::from).collect(),
            root: PathBuf::from("/"),
            docker_socket: PathBuf::from(DOCKER_SOCKET),
            pod_logs_dir: PathBuf::from(POD_LOGS_DIR),
            containerd_tasks_dir: PathBuf::from(CONTAINERD_TASKS_DIR),
            crio_containers_dir: PathBuf::from(CRIO_CONTAINERS_DIR),
            container_storage: PathBuf::from(CONTAINER_STORAGE),
        }
    }

    /// Reads the loader cache, driver directories and container runtime paths under `root`
    /// instead of `/`.
    pub fn with_root(self, root: PathBuf) -> HostPaths {
        let under = |p: &str| root.join(p.trim_start_matches('/'));
        HostPaths {
            ld_so_cache: under("etc/ld.so.cache"),
            docker_socket: under(DOCKER_SOCKET),
            pod_logs_dir: under(POD_LOGS_DIR),
            containerd_tasks_dir: under(CONTAINERD_TASKS_DIR),
            crio_containers_dir: under(CRIO_CONTAINERS_DIR),
            container_storage: under(CONTAINER_STORAGE),
            root,
            ..self
        }
    }

    /// A host path under [`HostPaths::root`].
    pub fn rooted(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_root_prefixes_the_runtime_paths() {
        let paths = HostPaths::system().with_root(PathBuf::from("/host"));
        assert_eq!(paths.docker_socket, Path::new("/host/var/run/docker.sock"));
        assert_eq!(paths.pod_logs_dir, Path::new("/host/var/log/pods"));
        assert_eq!(
            paths.containerd_tasks_dir,
            Path::new("/host/run/containerd/io.containerd.runtime.v2.task")
        );
        assert_eq!(
            paths.crio_containers_dir,
            Path::new("/host/run/containers/storage/overlay-containers")
        );
        assert_eq!(
            paths.container_storage,
            Path::new("/host/var/lib/containers/storage")
        );
        assert_eq!(paths.ld_so_cache, Path::new("/host/etc/ld.so.cache"));
    }
}
