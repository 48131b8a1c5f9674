//! What the crate's callers get back: a file's identity and the crate's one error.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A file's identity: `st_dev` and `st_ino` (as `/proc/<pid>/maps` prints them, after
/// `makedev`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}

impl fmt::Display for FileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dev, self.ino)
    }
}

/// Why a tenant's file was not opened or read.
#[derive(Debug, thiserror::Error)]
pub enum TenantFsError {
    #[error(
        "{}: is a symbolic link, or a path through a magic link (refused: the container controls it)",
        path.display()
    )]
    Link { path: PathBuf },
    #[error("{}: is a {kind}, not a regular file (refused)", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{}: is file {found}, not the file {expected} that the process maps (replaced since it was mapped; refused)",
        path.display()
    )]
    Replaced {
        path: PathBuf,
        expected: FileKey,
        found: FileKey,
    },
    #[error("{}: {len} bytes or more, over the {max} bytes read from such a file (refused)", path.display())]
    TooLarge { path: PathBuf, len: u64, max: u64 },
    #[error(
        "{}: is a mount point, or reached through one (refused for writing: a file the agent writes must sit on its directory's own filesystem, not be mounted over)",
        path.display()
    )]
    MountCrossed { path: PathBuf },
    #[error("{}: held under a lease by another process (not waited for)", path.display())]
    Leased { path: PathBuf },
    #[error("{}: not found", path.display())]
    NotFound { path: PathBuf },
    #[error("{}: not in the format the kernel writes (refused)", path.display())]
    Malformed { path: PathBuf },
    #[error("{}: {call}: {source}", path.display())]
    Io {
        call: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl TenantFsError {
    pub(crate) fn io(call: &'static str, path: &Path, source: io::Error) -> TenantFsError {
        match source.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => TenantFsError::NotFound {
                path: path.to_owned(),
            },
            // O_NOFOLLOW on a symlink, or RESOLVE_NO_MAGICLINKS on a magic link.
            Some(libc::ELOOP) => TenantFsError::Link {
                path: path.to_owned(),
            },
            // RESOLVE_NO_XDEV met a mount point.
            Some(libc::EXDEV) => TenantFsError::MountCrossed {
                path: path.to_owned(),
            },
            _ => TenantFsError::Io {
                call,
                path: path.to_owned(),
                source,
            },
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            TenantFsError::Link { path }
            | TenantFsError::NotRegular { path, .. }
            | TenantFsError::Replaced { path, .. }
            | TenantFsError::TooLarge { path, .. }
            | TenantFsError::MountCrossed { path }
            | TenantFsError::Leased { path }
            | TenantFsError::NotFound { path }
            | TenantFsError::Malformed { path }
            | TenantFsError::Io { path, .. } => path,
        }
    }
}
