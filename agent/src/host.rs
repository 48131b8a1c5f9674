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
}

impl HostPaths {
    pub fn system() -> HostPaths {
        HostPaths {
            proc: PathBuf::from("/proc"),
            ld_so_cache: PathBuf::from("/etc/ld.so.cache"),
            driver_dirs: crate::discovery::DRIVER_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            root: PathBuf::from("/"),
        }
    }

    /// Reads the loader cache and driver directories under `root` instead of `/`.
    pub fn with_root(self, root: PathBuf) -> HostPaths {
        HostPaths {
            ld_so_cache: root.join("etc/ld.so.cache"),
            root,
            ..self
        }
    }

    /// A host path under [`HostPaths::root`].
    pub fn rooted(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
}
