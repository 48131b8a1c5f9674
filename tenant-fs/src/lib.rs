//! How the agent opens and reads files that tenants control: a path inside a container, a file
//! a process maps, a file in a directory that containers can write, and the `/proc` files a
//! process shapes (its `stat`, `status`, `maps`, `cgroup`, `cmdline`).
//!
//! # Threat model
//!
//! The caller is trusted and privileged: the agent, as root. (The limiter, inside a tenant's own
//! process, uses only the `stat` reader and [`own_pid_namespace`], through the region, on its
//! own container's processes.) Tenants are hostile. A
//! container fully controls the files in its root and in any directory it can write: any
//! component of a path may be a symbolic link (to a host file, when followed from the host), a
//! FIFO (an `open` that never returns), a device node (an `open` with side effects), a sparse or
//! endless file, a file under a lease, or a mount point it bind-mounted over. A process also
//! shapes what the kernel writes about it in `/proc`: its `comm` is any 15 bytes (spaces,
//! parentheses, bytes that are not UTF-8), its mappings' paths are any bytes (newlines
//! included), and it decides how many mappings, cgroups and arguments it has (megabytes). Its
//! pid may be reused between two reads.
//!
//! # What each function guarantees
//!
//! - [`Root::open`], [`Root::open_dir`], [`Root::entries`]: the path is resolved inside the
//!   anchor directory ([`Root`]: the process's `/proc/<pid>/root`, or a configured directory)
//!   with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: an absolute symlink or `..` stays
//!   inside the anchor, and `/proc/self/...`-style magic links are refused; the last component
//!   is never followed (`O_NOFOLLOW`). A tenant's symlink never leads outside its root. For
//!   writing ([`Access::ReadWrite`]) no mount point below the anchor is crossed
//!   (`RESOLVE_NO_XDEV`), so a file mounted over the one meant is refused.
//! - [`open_mapped`]: a file a process maps is opened through the kernel's own reference to the
//!   mapping (`/proc/<pid>/map_files/<start>-<end>`, no path resolution at all), else inside the
//!   process's root, and used only if its (device, inode) is the one `/proc/<pid>/maps` names.
//! - [`open_no_links`], [`open_operator_path`], [`Root::dir_no_links`]: an operator's path with
//!   no symbolic link anywhere in it (`RESOLVE_NO_SYMLINKS`), or resolved inside the process's
//!   root when it is `/proc/<pid>/root/...`.
//! - [`open_checked`]: a path that leads to the right file by construction (a `map_files` entry,
//!   a host library), checked to be a regular file and, when given, the expected one.
//! - Every open is `O_PATH` first and checked with `fstat`: only a regular file is opened for
//!   real, so a FIFO or device node is never opened (its `open` can neither block nor have side
//!   effects). The check and the real open are about one inode: the real open reopens the
//!   checked descriptor (through `/proc/self/fd/<n>`) `O_NONBLOCK | O_CLOEXEC | O_NOCTTY`, so a
//!   path swapped in between is not followed, and a file under a tenant's lease fails with
//!   [`TenantFsError::Leased`] instead of blocking for the kernel's lease-break time (45 s by
//!   default).
//! - Every read is bounded: [`TenantFile::read_bounded`] refuses a file over its bound before
//!   reading (a sparse 16 GB file costs nothing) and cuts one that grows while read;
//!   [`read_proc`] and [`read_proc_lines`] read at most a stated number of bytes, and at most a
//!   stated length per line; [`read_stat`] reads into a fixed buffer.
//! - The `/proc` parsers ([`parse_stat`], [`innermost_pid`], [`pid_namespace`],
//!   [`maps::parse_line`], and [`cgroup_v2_path`] on text the caller converted lossily) never
//!   assume UTF-8 where a process chose the text (a name, a path), count `stat`'s fields from its
//!   last `)` (a name may hold parentheses and spaces, the fields after it are the kernel's), and
//!   return `None` on anything malformed: no panic, whatever the bytes (property-tested).
//! - Nothing here creates, truncates or extends a file; writing is limited to what a caller asks
//!   for with [`Access::ReadWrite`].
//!
//! What this crate does not do: it does not decide which process or container a file belongs to,
//! and it does not keep a pid from being reused; callers compare a process's start time
//! ([`ProcStat::start_ticks`]) before and after they use what they read.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. errors: `error`. The error type and a file's identity.
//! 2. proc: `proc`. Bounded reads and the parsers of a process's `/proc` files.
//! 3. maps: `maps`. The parser of `/proc/<pid>/maps`.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

mod error;

pub use error::{FileKey, TenantFsError};

/// What the caller will do with the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Read and write (control blocks only). Never creates, truncates or extends.
    ReadWrite,
}

/// An anchor directory: paths opened through it are resolved inside it and cannot leave it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    shown: PathBuf,
}

/// The resolution every tenant path gets: inside the anchor, no magic links.
fn resolve_flags() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

/// The resolution a tenant path opened for writing gets on top of [`resolve_flags`]: no mount
/// point crossed below the anchor, so a file the tenant bind-mounted over the one the agent
/// writes (a host file it can reach, say) is refused rather than written through.
fn write_resolve_flags(access: Access) -> ResolveFlags {
    match access {
        Access::Read => ResolveFlags::empty(),
        Access::ReadWrite => ResolveFlags::NO_XDEV,
    }
}

impl Root {
    /// The root directory of process `pid` (`<proc>/<pid>/root`): its container's root, seen
    /// through its own mount namespace.
    pub fn process(proc: &Path, pid: u32) -> Result<Root, TenantFsError> {
        Root::dir(&proc.join(pid.to_string()).join("root"))
    }

    /// A directory the operator chose (a region directory, or a process's root). The path to it
    /// is followed as given: it is the operator's, not a tenant's.
    pub fn dir(path: &Path) -> Result<Root, TenantFsError> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| TenantFsError::io("open", path, e.into()))?;
        Ok(Root {
            fd,
            shown: path.to_owned(),
        })
    }

    /// A directory by a path the operator gave, refusing any symbolic link on the way
    /// (`RESOLVE_NO_SYMLINKS`, as [`open_no_links`]).
    pub fn dir_no_links(path: &Path) -> Result<Root, TenantFsError> {
        let fd = rustix::fs::openat2(
            rustix::fs::CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| TenantFsError::io("openat2", path, e.into()))?;
        Ok(Root {
            fd,
            shown: path.to_owned(),
        })
    }

    /// The entries of the directory at `inside` (resolved inside this root), at most `max` of
    /// them (the second value says whether there were more): names with what kind of file each
    /// is, as the directory says (links are neither files nor directories, and are not
    /// followed).
    pub fn entries(
        &self,
        inside: &Path,
        max: usize,
    ) -> Result<(Vec<(std::ffi::OsString, EntryKind)>, bool), TenantFsError> {
        use std::os::unix::ffi::OsStrExt;
        let shown = self.shown(inside);
        let inside = if inside.as_os_str().is_empty() {
            Path::new(".")
        } else {
            inside
        };
        let fd = rustix::fs::openat2(
            &self.fd,
            inside,
            OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::empty(),
            resolve_flags(),
        )
        .map_err(|e| TenantFsError::io("openat2", &shown, e.into()))?;
        let dir =
            rustix::fs::Dir::new(fd).map_err(|e| TenantFsError::io("opendir", &shown, e.into()))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| TenantFsError::io("getdents", &shown, e.into()))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() == max {
                return Ok((out, true));
            }
            let kind = match entry.file_type() {
                rustix::fs::FileType::RegularFile => EntryKind::File,
                rustix::fs::FileType::Directory => EntryKind::Dir,
                _ => EntryKind::Other,
            };
            out.push((std::ffi::OsStr::from_bytes(name).to_owned(), kind));
        }
        Ok((out, false))
    }

    /// The anchor's path, for messages.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// How `inside` is shown in messages: the anchor's path joined with it.
    pub fn shown(&self, inside: &Path) -> PathBuf {
        self.shown.join(inside.strip_prefix("/").unwrap_or(inside))
    }

    /// `inside` as an `O_PATH` descriptor, resolved inside this root, the last component not
    /// followed.
    fn resolve(
        &self,
        inside: &Path,
        extra: OFlags,
        resolve_extra: ResolveFlags,
    ) -> Result<OwnedFd, TenantFsError> {
        // An empty path would name the anchor itself.
        let inside = if inside.as_os_str().is_empty() {
            Path::new(".")
        } else {
            inside
        };
        rustix::fs::openat2(
            &self.fd,
            inside,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra,
            Mode::empty(),
            resolve_flags() | resolve_extra,
        )
        .map_err(|e| TenantFsError::io("openat2", &self.shown(inside), e.into()))
    }

    /// Opens the regular file at `inside` (absolute paths are taken as relative to this root).
    /// For writing, no mount point may be crossed below this root (the file itself mounted over
    /// included): open the directory the file sits in as the root
    /// ([`Root::open_dir`]), then the file.
    pub fn open(&self, inside: &Path, access: Access) -> Result<TenantFile, TenantFsError> {
        let fd = self.resolve(inside, OFlags::empty(), write_resolve_flags(access))?;
        finish(fd, access, None, self.shown(inside))
    }

    /// The directory at `inside`, as a root of its own (for opening files beside each other in
    /// the same directory).
    pub fn open_dir(&self, inside: &Path) -> Result<Root, TenantFsError> {
        let fd = self.resolve(inside, OFlags::DIRECTORY, ResolveFlags::empty())?;
        Ok(Root {
            fd,
            shown: self.shown(inside),
        })
    }
}

/// What a directory entry is (from the directory, not from following it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    /// A link, FIFO, device, socket, or a type the filesystem does not report.
    Other,
}

/// A regular file opened through this module, with what `fstat` said about it.
#[derive(Debug)]
pub struct TenantFile {
    file: File,
    meta: std::fs::Metadata,
    shown: PathBuf,
}

impl TenantFile {
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn into_file(self) -> File {
        self.file
    }

    /// The path it was opened by, for messages.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    pub fn key(&self) -> FileKey {
        FileKey {
            dev: self.meta.dev(),
            ino: self.meta.ino(),
        }
    }

    /// Size at open.
    pub fn len(&self) -> u64 {
        self.meta.len()
    }

    pub fn is_empty(&self) -> bool {
        self.meta.len() == 0
    }

    /// `st_mode` at open (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.meta.mode()
    }

    /// Owner at open.
    pub fn uid(&self) -> u32 {
        self.meta.uid()
    }

    /// Group at open.
    pub fn gid(&self) -> u32 {
        self.meta.gid()
    }

    /// Another descriptor of the same open file.
    pub fn try_clone(&self) -> Result<TenantFile, TenantFsError> {
        Ok(TenantFile {
            file: self
                .file
                .try_clone()
                .map_err(|e| TenantFsError::io("dup", &self.shown, e))?,
            meta: self.meta.clone(),
            shown: self.shown.clone(),
        })
    }

    /// Hard links at open.
    pub fn nlink(&self) -> u64 {
        self.meta.nlink()
    }

    /// The current size (`fstat` again: the tenant may have changed it).
    pub fn current_len(&self) -> Result<u64, TenantFsError> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| TenantFsError::io("fstat", &self.shown, e))?
            .len())
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (fewer at the end of the
    /// file). Retries `EINTR`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TenantFsError> {
        let mut done = 0;
        while done < buf.len() {
            match self
                .file
                .read_at(&mut buf[done..], offset.saturating_add(done as u64))
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TenantFsError::io("pread", &self.shown, e)),
            }
        }
        Ok(done)
    }

    /// The whole file, if it holds at most `max` bytes (checked before reading, and again
    /// while reading: a file that grows past `max` meanwhile is refused too).
    pub fn read_bounded(&self, max: u64) -> Result<Vec<u8>, TenantFsError> {
        let len = self.current_len()?;
        let too_large = |len| TenantFsError::TooLarge {
            path: self.shown.clone(),
            len,
            max,
        };
        if len > max {
            return Err(too_large(len));
        }
        // One byte more than allowed tells a file that grew from one that ends at `max`.
        let mut buf = vec![0u8; len as usize + 1];
        let mut got = self.read_at(0, &mut buf)?;
        if got > len as usize {
            // It grew: read on, still bounded.
            buf.resize(max as usize + 1, 0);
            got += self.read_at(got as u64, &mut buf[got..])?;
            if got as u64 > max {
                return Err(too_large(got as u64));
            }
        }
        buf.truncate(got);
        Ok(buf)
    }
}

fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Checks an `O_PATH` descriptor (a regular file, the expected identity) and reopens that
/// inode for `access`, non-blocking.
fn finish(
    fd: OwnedFd,
    access: Access,
    expected: Option<FileKey>,
    shown: PathBuf,
) -> Result<TenantFile, TenantFsError> {
    let pathfd = File::from(fd);
    let meta = pathfd
        .metadata()
        .map_err(|e| TenantFsError::io("fstat", &shown, e))?;
    // `O_PATH | O_NOFOLLOW` opens a symlink itself rather than failing.
    if meta.file_type().is_symlink() {
        return Err(TenantFsError::Link { path: shown });
    }
    if !meta.file_type().is_file() {
        return Err(TenantFsError::NotRegular {
            path: shown,
            kind: file_kind(meta.file_type()),
        });
    }
    let found = FileKey {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    if let Some(expected) = expected
        && expected != found
    {
        return Err(TenantFsError::Replaced {
            path: shown,
            expected,
            found,
        });
    }
    // Reopening the O_PATH descriptor through our own fd table opens exactly the inode checked
    // above, whatever happened to the path since.
    let access_flags = match access {
        Access::Read => OFlags::RDONLY,
        Access::ReadWrite => OFlags::RDWR,
    };
    let reopened = rustix::fs::open(
        format!("/proc/self/fd/{}", pathfd.as_raw_fd()),
        access_flags | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::AGAIN => TenantFsError::Leased {
            path: shown.clone(),
        },
        e => TenantFsError::io("open", &shown, e.into()),
    })?;
    let file = File::from(reopened);
    let meta = file
        .metadata()
        .map_err(|e| TenantFsError::io("fstat", &shown, e))?;
    if (meta.dev(), meta.ino()) != (found.dev, found.ino) {
        return Err(TenantFsError::Replaced {
            path: shown,
            expected: found,
            found: FileKey {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        });
    }
    Ok(TenantFile { file, meta, shown })
}

/// The `/proc/<pid>/map_files` entry of a mapping.
pub fn map_files_path(proc: &Path, pid: u32, start: u64, end: u64) -> PathBuf {
    proc.join(pid.to_string())
        .join("map_files")
        .join(format!("{start:x}-{end:x}"))
}

/// Opens the file that process `pid` maps at `start..end`, which `/proc/<pid>/maps` says is
/// `expected` at `path` (inside the process's root): through the kernel's reference to the
/// mapping (`map_files`, which needs `CAP_CHECKPOINT_RESTORE` or `CAP_SYS_ADMIN`), else by
/// resolving `path` inside the process's root. Either way the file is used only if it is
/// `expected`.
pub fn open_mapped(
    proc: &Path,
    pid: u32,
    (start, end): (u64, u64),
    path: &Path,
    expected: FileKey,
    access: Access,
) -> Result<TenantFile, TenantFsError> {
    let link = map_files_path(proc, pid, start, end);
    match open_checked(&link, Some(expected), access) {
        Err(TenantFsError::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
        {
            let root = Root::process(proc, pid)?;
            let fd = root.resolve(path, OFlags::empty(), write_resolve_flags(access))?;
            finish(fd, access, Some(expected), root.shown(path))
        }
        other => other,
    }
}

/// Opens a path that leads to the right file by construction (a host library the agent found,
/// or a `map_files` entry: the kernel's reference to a mapping), following it as given, and
/// checks the file itself: a regular file, and `expected` when given.
pub fn open_checked(
    path: &Path,
    expected: Option<FileKey>,
    access: Access,
) -> Result<TenantFile, TenantFsError> {
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| TenantFsError::io("open", path, e.into()))?;
    finish(fd, access, expected, path.to_owned())
}

/// Opens a file by a path the operator gave, never following its last component, and only if it
/// is a regular file. Symbolic links in the directories above it are refused too
/// (`RESOLVE_NO_SYMLINKS`): a container may have made one of them a link, and the operator can
/// give the resolved path, `/proc/<pid>/root/...` (resolved inside that process's root by
/// [`open_operator_path`]) or a container instead.
pub fn open_no_links(path: &Path, access: Access) -> Result<TenantFile, TenantFsError> {
    let fd = rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| TenantFsError::io("openat2", path, e.into()))?;
    finish(fd, access, None, path.to_owned())
}

/// Where an operator's path leads: into a process's root (`<proc>/<pid>/root/<inside>`), or a
/// plain path.
pub fn split_process_root<'a>(proc: &Path, path: &'a Path) -> Option<(u32, &'a Path)> {
    let rest = path.strip_prefix(proc).ok()?;
    let mut parts = rest.components();
    let pid = parts.next()?.as_os_str().to_str()?.parse().ok()?;
    if parts.next()?.as_os_str() != "root" {
        return None;
    }
    Some((pid, parts.as_path()))
}

/// Opens an operator's path: `<proc>/<pid>/root/<inside>` is resolved inside that process's root
/// ([`Root::open`]); any other path with [`open_no_links`].
pub fn open_operator_path(
    proc: &Path,
    path: &Path,
    access: Access,
) -> Result<TenantFile, TenantFsError> {
    match split_process_root(proc, path) {
        Some((pid, inside)) => Root::process(proc, pid)?.open(inside, access),
        None => open_no_links(path, access),
    }
}

pub mod maps;
mod proc;
pub use proc::{
    MAX_STAT_BYTES, ProcRead, ProcStat, cgroup_v2_path, innermost_pid, own_pid_namespace,
    parse_stat, pid_namespace, read_proc, read_proc_lines, read_stat,
};

#[cfg(test)]
mod tests {
    //! Each way a tenant can lay out its files, against the opener: refused or kept inside, never
    //! blocking, never reading without bound.

    use std::os::unix::fs::symlink;
    use std::time::{Duration, Instant};

    use super::*;

    fn root_is_euid0() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A tenant root with a file of its own and, outside it, a "host" file.
    struct Fixture {
        tenant: tempfile::TempDir,
        host: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let f = Fixture {
                tenant: tempfile::tempdir().unwrap(),
                host: tempfile::tempdir().unwrap(),
            };
            std::fs::write(f.host_file(), b"host secret").unwrap();
            std::fs::write(f.tenant.path().join("own"), b"tenant data").unwrap();
            f
        }

        fn host_file(&self) -> PathBuf {
            self.host.path().join("secret")
        }

        fn root(&self) -> Root {
            Root::dir(self.tenant.path()).unwrap()
        }
    }

    #[test]
    fn a_regular_file_inside_the_root_opens_and_reads() {
        let f = Fixture::new();
        let file = f.root().open(Path::new("/own"), Access::Read).unwrap();
        assert_eq!(file.read_bounded(100).unwrap(), b"tenant data");
        assert_eq!(file.len(), 11);
        assert!(file.path().ends_with("own"));
    }

    #[test]
    fn a_symlink_as_the_last_component_is_refused() {
        let f = Fixture::new();
        symlink(f.host_file(), f.tenant.path().join("ctl")).unwrap();
        symlink("own", f.tenant.path().join("relative")).unwrap();
        for name in ["/ctl", "relative"] {
            let err = f
                .root()
                .open(Path::new(name), Access::ReadWrite)
                .unwrap_err();
            assert!(matches!(err, TenantFsError::Link { .. }), "{name}: {err}");
        }
    }

    #[test]
    fn absolute_links_and_dotdot_in_directories_stay_inside_the_root() {
        let f = Fixture::new();
        // `dir` points at the host directory by its absolute path; `up` climbs out with `..`.
        symlink(f.host.path(), f.tenant.path().join("dir")).unwrap();
        let depth = f.tenant.path().components().count();
        symlink("../".repeat(depth + 2), f.tenant.path().join("up")).unwrap();
        let inside_host_path = f.host_file();
        let via_up = Path::new("up").join(inside_host_path.strip_prefix("/").unwrap());
        for path in [Path::new("dir/secret"), &via_up] {
            match f.root().open(path, Access::Read) {
                Err(TenantFsError::NotFound { .. }) => {}
                Ok(file) => panic!(
                    "{} reached {:?}",
                    path.display(),
                    String::from_utf8_lossy(&file.read_bounded(100).unwrap())
                ),
                Err(e) => panic!("{}: {e}", path.display()),
            }
        }
        // The same names, made inside the root, are what they resolve to.
        let mirrored = f
            .tenant
            .path()
            .join(inside_host_path.strip_prefix("/").unwrap());
        std::fs::create_dir_all(mirrored.parent().unwrap()).unwrap();
        std::fs::write(&mirrored, b"inside").unwrap();
        let file = f.root().open(&via_up, Access::Read).unwrap();
        assert_eq!(file.read_bounded(100).unwrap(), b"inside");
    }

    #[test]
    fn magic_links_are_refused() {
        let f = Fixture::new();
        symlink("/proc/self/root", f.tenant.path().join("self")).unwrap();
        // `/proc/self/root` inside the root is the root's own `proc` (absent here) ...
        let err = f
            .root()
            .open(Path::new("self/etc/hostname"), Access::Read)
            .unwrap_err();
        assert!(matches!(err, TenantFsError::NotFound { .. }), "{err}");
        // ... and through a procfs (as a tenant could mount one) it is a magic link.
        let root = Root::dir(Path::new("/")).unwrap();
        let err = root
            .open(Path::new("/proc/self/root/etc/hostname"), Access::Read)
            .unwrap_err();
        assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let f = Fixture::new();
        let fifo = f.tenant.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o666),
            0,
        )
        .unwrap();
        let t0 = Instant::now();
        for access in [Access::Read, Access::ReadWrite] {
            let err = f.root().open(Path::new("fifo"), access).unwrap_err();
            assert!(
                matches!(err, TenantFsError::NotRegular { kind: "FIFO", .. }),
                "{err}"
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        let err = open_no_links(&fifo, Access::Read).unwrap_err();
        assert!(matches!(err, TenantFsError::NotRegular { .. }), "{err}");
    }

    #[test]
    fn a_device_node_is_refused_unopened() {
        if !root_is_euid0() {
            eprintln!("skipping: mknod of a character device needs root");
            return;
        }
        let f = Fixture::new();
        let zero = f.tenant.path().join("zero");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &zero,
            rustix::fs::FileType::CharacterDevice,
            Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 5),
        )
        .unwrap();
        let err = f.root().open(Path::new("zero"), Access::Read).unwrap_err();
        assert!(
            matches!(
                err,
                TenantFsError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_large_sparse_file_is_refused_before_reading() {
        let f = Fixture::new();
        let sparse = f.tenant.path().join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(16 << 30)
            .unwrap();
        let file = f.root().open(Path::new("sparse"), Access::Read).unwrap();
        let t0 = Instant::now();
        let err = file.read_bounded(64 << 20).unwrap_err();
        assert!(
            matches!(err, TenantFsError::TooLarge { len, max, .. } if len == 16 << 30 && max == 64 << 20),
            "{err}"
        );
        assert!(t0.elapsed() < Duration::from_secs(1), "read it?");
    }

    #[test]
    fn a_file_growing_while_read_is_cut_at_the_bound() {
        let f = Fixture::new();
        let path = f.tenant.path().join("grows");
        std::fs::write(&path, [1u8; 10]).unwrap();
        let file = f.root().open(Path::new("grows"), Access::Read).unwrap();
        // Grows after the open, before the read: over the bound is refused, under it is read.
        std::fs::write(&path, [2u8; 100]).unwrap();
        assert!(matches!(
            file.read_bounded(50),
            Err(TenantFsError::TooLarge { .. })
        ));
        assert_eq!(file.read_bounded(100).unwrap().len(), 100);
    }

    #[test]
    fn a_write_lease_makes_the_open_fail_fast_instead_of_waiting() {
        let f = Fixture::new();
        let path = f.tenant.path().join("leased");
        std::fs::write(&path, b"x").unwrap();
        let holder = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // The kernel tells the holder (this process) to give the lease up with SIGIO, whose default
        // action ends the process: ignore it, as a tenant holding a lease on purpose would.
        // SAFETY: SIG_IGN for SIGIO; nothing in the tests relies on SIGIO.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        // SAFETY: fcntl on a valid fd; F_SETLEASE takes an int.
        let rc = unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
        if rc != 0 {
            eprintln!(
                "skipping: F_SETLEASE failed here: {}",
                io::Error::last_os_error()
            );
            return;
        }
        let t0 = Instant::now();
        let err = f
            .root()
            .open(Path::new("leased"), Access::Read)
            .unwrap_err();
        assert!(matches!(err, TenantFsError::Leased { .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_mapped_file_opens_through_map_files_only_as_the_file_maps_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mapped");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let key = FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        // SAFETY: a fresh shared read-only mapping of a valid fd, unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let range = (ptr as u64, ptr as u64 + 4096);
        let proc = Path::new("/proc");
        let me = std::process::id();
        let opened = open_mapped(proc, me, range, &path, key, Access::Read).unwrap();
        assert_eq!(opened.key(), key);
        assert_eq!(opened.read_bounded(4096).unwrap(), vec![7u8; 4096]);
        let wrong = FileKey {
            dev: key.dev,
            ino: key.ino + 1,
        };
        let err = open_mapped(proc, me, range, &path, wrong, Access::Read).unwrap_err();
        assert!(matches!(err, TenantFsError::Replaced { .. }), "{err}");
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(ptr, 4096) };
    }

    #[test]
    fn operator_paths_through_a_process_root_resolve_inside_it() {
        let proc = Path::new("/proc");
        assert_eq!(
            split_process_root(proc, Path::new("/proc/123/root/tmp/r.region")),
            Some((123, Path::new("tmp/r.region")))
        );
        assert_eq!(split_process_root(proc, Path::new("/proc/123/cwd/x")), None);
        assert_eq!(split_process_root(proc, Path::new("/tmp/x")), None);
        assert_eq!(
            split_process_root(proc, Path::new("/proc/self/root/x")),
            None
        );
        // Our own root, through the operator path: a regular file opens.
        let f = Fixture::new();
        let own = f.tenant.path().join("own");
        let through = Path::new("/proc")
            .join(std::process::id().to_string())
            .join("root")
            .join(own.strip_prefix("/").unwrap());
        let file = open_operator_path(proc, &through, Access::Read).unwrap();
        assert_eq!(file.read_bounded(100).unwrap(), b"tenant data");
    }

    #[test]
    fn operator_paths_with_a_symlinked_directory_are_refused() {
        let f = Fixture::new();
        symlink(f.host.path(), f.tenant.path().join("d")).unwrap();
        let err = open_no_links(&f.tenant.path().join("d/secret"), Access::Read).unwrap_err();
        assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
    }

    #[test]
    fn proc_lines_are_bounded_in_bytes_and_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("maps");
        let mut text = String::new();
        text += "short one\n";
        text += &"x".repeat(100);
        text += "\nlast without newline";
        std::fs::write(&path, &text).unwrap();
        let mut lines = Vec::new();
        let r = read_proc_lines(&path, 1 << 20, 50, |l| lines.push(l.to_vec())).unwrap();
        assert_eq!(
            lines,
            vec![b"short one".to_vec(), b"last without newline".to_vec()]
        );
        assert_eq!(r.long_lines, 1);
        assert!(!r.truncated);
        let mut n = 0;
        let r = read_proc_lines(&path, 20, 1000, |_| n += 1).unwrap();
        assert!(r.truncated);
        assert_eq!(n, 1, "only the lines inside the bound");
        let (bytes, more) = read_proc(&path, 5).unwrap();
        assert_eq!((bytes.as_slice(), more), (&b"short"[..], true));
    }

    #[test]
    fn directory_entries_are_listed_inside_the_root_bounded_and_not_followed() {
        let f = Fixture::new();
        std::fs::create_dir(f.tenant.path().join("sub")).unwrap();
        symlink(f.host.path(), f.tenant.path().join("hostdir")).unwrap();
        let (mut entries, more) = f.root().entries(Path::new(""), 100).unwrap();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<(String, EntryKind)> = entries
            .into_iter()
            .map(|(n, k)| (n.to_string_lossy().into_owned(), k))
            .collect();
        assert_eq!(
            names,
            vec![
                ("hostdir".into(), EntryKind::Other),
                ("own".into(), EntryKind::File),
                ("sub".into(), EntryKind::Dir)
            ]
        );
        assert!(!more);
        let (few, more) = f.root().entries(Path::new("/"), 2).unwrap();
        assert_eq!((few.len(), more), (2, true));
        // Listing through the link is listing inside the root (where that path does not exist).
        let err = f.root().entries(Path::new("hostdir"), 10).unwrap_err();
        assert!(
            matches!(
                err,
                TenantFsError::Link { .. } | TenantFsError::NotFound { .. }
            ),
            "{err}"
        );
    }

    /// Runs `f` on a thread of its own mount namespace (private: nothing it mounts reaches the host),
    /// so a test can mount without touching the machine's mounts. `None` when that is not allowed.
    fn in_private_mount_namespace<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare with a constant flag; it changes only this thread's mount namespace
                // (and its fs attributes, which no other code on this thread uses).
                if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                    return None;
                }
                // SAFETY: NUL-terminated literals; makes every mount of the new namespace private.
                let private = unsafe {
                    libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    )
                };
                (private == 0).then(f)
            })
            .join()
            .unwrap()
        })
    }

    /// Bind-mounts `from` over `to` (in the caller's mount namespace).
    fn bind_mount(from: &Path, to: &Path) -> bool {
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let (from, to) = (c(from), c(to));
        // SAFETY: NUL-terminated paths that outlive the call.
        unsafe {
            libc::mount(
                from.as_ptr(),
                to.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) == 0
        }
    }

    /// A tenant that bind-mounts a file it can reach (a host file, here) over the control block the
    /// agent writes: opening it for writing is refused (no mount point is crossed for writing), so
    /// nothing is written through the mount; reading it is still possible, and the file beside it
    /// on the directory's own filesystem opens for writing.
    #[test]
    fn a_file_mounted_over_is_refused_for_writing() {
        if !root_is_euid0() {
            assert!(
                std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none_or(|v| v != "1"),
                "a bind mount needs root"
            );
            eprintln!("skipping: a bind mount needs root");
            return;
        }
        let f = Fixture::new();
        let ctl = f.tenant.path().join("region.ctl");
        std::fs::write(&ctl, b"control").unwrap();
        let host = f.host_file();
        let outcome = in_private_mount_namespace(|| {
            assert!(bind_mount(&host, &ctl), "mount --bind");
            let root = f.root();
            let write = root.open(Path::new("region.ctl"), Access::ReadWrite);
            let read = root
                .open(Path::new("region.ctl"), Access::Read)
                .map(|file| file.read_bounded(100).unwrap());
            let beside = root.open(Path::new("own"), Access::ReadWrite).map(|_| ());
            (write.map(|_| ()), read, beside)
        })
        .expect("a private mount namespace (root may unshare)");
        let (write, read, beside) = outcome;
        match write {
            Err(e @ TenantFsError::MountCrossed { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("region.ctl") && msg.contains("mount point"),
                    "{msg}"
                );
            }
            other => panic!("opened for writing through a mount: {other:?}"),
        }
        assert_eq!(read.unwrap(), b"host secret", "the mount was in place");
        beside.unwrap();
        // The host's file was never written, and the mount stayed in its namespace.
        assert_eq!(std::fs::read(&host).unwrap(), b"host secret");
        assert_eq!(std::fs::read(&ctl).unwrap(), b"control");
    }
}
