//! What a driver library is and which file it is: the names the discovery and the maps scan
//! share.

use std::fmt;

/// Which library a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LibraryKind {
    /// The CUDA driver API (`libcuda.so.1`).
    Cuda,
    /// NCCL (`libnccl.so.2`). PyTorch and other frameworks ship their own copy (e.g. in
    /// `site-packages/nvidia/nccl/lib`), so it is found mostly through processes' maps.
    Nccl,
}

impl LibraryKind {
    pub const ALL: [LibraryKind; 2] = [LibraryKind::Cuda, LibraryKind::Nccl];

    /// Does a file name (the last path component) name this library?
    pub fn matches_file_name(self, name: &str) -> bool {
        match self {
            // libcuda.so, libcuda.so.1, libcuda.so.535.309.01; not libcudart or libcudadebugger.
            LibraryKind::Cuda => name.starts_with("libcuda.so"),
            // libnccl.so, libnccl.so.2, libnccl.so.2.28.3; not the libnccl-net*.so plugins.
            LibraryKind::Nccl => name.starts_with("libnccl.so"),
        }
    }

    pub fn soname(self) -> &'static str {
        match self {
            LibraryKind::Cuda => "libcuda.so.1",
            LibraryKind::Nccl => "libnccl.so.2",
        }
    }
}

/// A file's identity: what a uprobe is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct FileId {
    pub dev: u64,
    pub inode: u64,
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dev, self.inode)
    }
}
