//! Finding the driver libraries to probe: on the host (ld.so.cache and the usual driver
//! directories) and inside every process (its `/proc/<pid>/maps`, resolved through
//! `/proc/<pid>/root` so that containers in other mount namespaces are covered). Libraries are
//! deduplicated by (device, inode): a uprobe belongs to an inode, so one attachment covers every
//! process that maps the same file, and attaching twice would count every call twice.

pub mod ldcache;
pub mod procmaps;

use std::{
    collections::HashSet,
    fmt, fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::host::HostPaths;

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

    fn soname(self) -> &'static str {
        match self {
            LibraryKind::Cuda => "libcuda.so.1",
            LibraryKind::Nccl => "libnccl.so.2",
        }
    }

    fn needle(self) -> &'static str {
        match self {
            LibraryKind::Cuda => "/libcuda.so",
            LibraryKind::Nccl => "/libnccl.so",
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

/// How a library was found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum FoundBy {
    /// Named on the command line.
    Configured,
    /// The host's loader cache or a driver directory.
    Host,
    /// Mapped by a running process.
    Process { pid: u32 },
}

/// A library file to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryFile {
    pub kind: LibraryKind,
    pub id: FileId,
    /// A path that names the file from the agent's mount namespace.
    pub attach_path: PathBuf,
    /// The path as its users see it.
    pub path: PathBuf,
    pub found_by: FoundBy,
}

/// Directories where drivers install libcuda, searched after ld.so.cache.
pub const DRIVER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
];

/// Opens a library candidate: its identity, or `None` if it is not a readable regular file.
fn identify(
    kind: LibraryKind,
    attach_path: &Path,
    path: &Path,
    found_by: FoundBy,
) -> Option<LibraryFile> {
    let meta = fs::metadata(attach_path).ok()?;
    if !meta.is_file() {
        return None;
    }
    Some(LibraryFile {
        kind,
        id: FileId {
            dev: meta.dev(),
            inode: meta.ino(),
        },
        attach_path: attach_path.to_path_buf(),
        path: path.to_path_buf(),
        found_by,
    })
}

/// The host's copy of a library, as the loader would find it.
pub fn host_library(host: &HostPaths, kind: LibraryKind) -> Option<LibraryFile> {
    if let Ok(buf) = fs::read(&host.ld_so_cache)
        && let Ok(entries) = ldcache::parse(&buf)
        && let Some(e) = entries.iter().find(|e| e.soname == kind.soname())
    {
        let p = host.rooted(&e.path);
        if let Some(lib) = identify(kind, &p, &e.path, FoundBy::Host) {
            return Some(lib);
        }
    }
    host.driver_dirs.iter().find_map(|dir| {
        let path = Path::new(dir).join(kind.soname());
        identify(kind, &host.rooted(&path), &path, FoundBy::Host)
    })
}

/// A library named by the user (`--libcuda PATH`).
pub fn configured_library(kind: LibraryKind, path: &Path) -> Option<LibraryFile> {
    identify(kind, path, path, FoundBy::Configured)
}

/// What a scan of all processes found.
#[derive(Debug, Default)]
pub struct ProcessScan {
    /// Libraries not seen before, one per file identity.
    pub new: Vec<LibraryFile>,
    /// Processes that map one of the libraries (seen before or not).
    pub users: Vec<(u32, FileId)>,
    /// Processes whose maps could not be read (they exited, or permission).
    pub unreadable: usize,
}

/// Remembers which library files were already found, so repeated scans report only new ones.
#[derive(Debug, Default)]
pub struct Discovery {
    seen: HashSet<FileId>,
}

impl Discovery {
    pub fn new() -> Discovery {
        Discovery::default()
    }

    /// Marks a library as known (attached by other means).
    pub fn mark_seen(&mut self, id: FileId) -> bool {
        self.seen.insert(id)
    }

    /// Forgets a library: the next scan reports it again if a process maps it.
    pub fn forget(&mut self, id: FileId) {
        self.seen.remove(&id);
    }

    /// Reads every process's maps and returns the libraries not seen before.
    pub fn scan_processes(&mut self, host: &HostPaths) -> ProcessScan {
        let mut scan = ProcessScan::default();
        let Ok(dir) = fs::read_dir(&host.proc) else {
            return scan;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(maps) = fs::read_to_string(entry.path().join("maps")) else {
                scan.unreadable += 1;
                continue;
            };
            self.scan_one(host, pid, &maps, &mut scan);
        }
        scan
    }

    fn scan_one(&mut self, host: &HostPaths, pid: u32, maps: &str, scan: &mut ProcessScan) {
        for kind in LibraryKind::ALL {
            if !maps.contains(kind.needle()) {
                continue;
            }
            let mut this_process = HashSet::new();
            for m in maps
                .lines()
                .filter(|l| l.contains(kind.needle()))
                .filter_map(procmaps::parse_line)
            {
                let name = m.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !kind.matches_file_name(name) {
                    continue;
                }
                let id = FileId {
                    dev: m.dev,
                    inode: m.inode,
                };
                if !this_process.insert(id) {
                    continue;
                }
                scan.users.push((pid, id));
                if self.seen.contains(&id) {
                    continue;
                }
                // The path means something only inside the process's mount namespace: reach it
                // through the process's root, or through map_files when it was deleted.
                let attach_path = if m.deleted {
                    host.proc
                        .join(pid.to_string())
                        .join("map_files")
                        .join(format!("{:x}-{:x}", m.start, m.end))
                } else {
                    host.proc
                        .join(pid.to_string())
                        .join("root")
                        .join(m.path.strip_prefix("/").unwrap_or(&m.path))
                };
                let found = LibraryFile {
                    kind,
                    id,
                    attach_path,
                    path: m.path.clone(),
                    found_by: FoundBy::Process { pid },
                };
                // The maps line's (dev, inode) is the identity (for overlayfs it names the real
                // file, which is what the kernel probes); the path must still lead to it.
                if let Ok(meta) = fs::metadata(&found.attach_path)
                    && (meta.dev(), meta.ino()) != (id.dev, id.inode)
                    && !m.deleted
                {
                    log::debug!(
                        "pid {pid}: {} is {}:{} on disk but {} in maps (overlay or replaced file)",
                        found.attach_path.display(),
                        meta.dev(),
                        meta.ino(),
                        id
                    );
                }
                self.seen.insert(id);
                scan.new.push(found);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn matches_driver_file_names_only() {
        let k = LibraryKind::Cuda;
        assert!(k.matches_file_name("libcuda.so"));
        assert!(k.matches_file_name("libcuda.so.1"));
        assert!(k.matches_file_name("libcuda.so.580.159.04"));
        assert!(!k.matches_file_name("libcudart.so.12"));
        assert!(!k.matches_file_name("libcudadebugger.so.1"));
        assert!(!k.matches_file_name("libnccl.so.2"));
        let n = LibraryKind::Nccl;
        assert!(n.matches_file_name("libnccl.so"));
        assert!(n.matches_file_name("libnccl.so.2"));
        assert!(n.matches_file_name("libnccl.so.2.28.3"));
        assert!(!n.matches_file_name("libnccl-net.so"));
        assert!(!n.matches_file_name("libnccl-net-ofi.so"));
        assert!(!n.matches_file_name("libcuda.so.1"));
    }

    #[test]
    fn scan_finds_nccl_beside_libcuda_with_its_kind() {
        let tmp = tempfile::tempdir().unwrap();
        let mut lines = String::new();
        let mut ids = Vec::new();
        for name in ["libcuda.so.1", "libnccl.so.2", "libnccl-net.so"] {
            let lib = tmp.path().join(name);
            fs::write(&lib, name).unwrap();
            let meta = fs::metadata(&lib).unwrap();
            let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
            lines += &format!(
                "7f00-7f10 r-xp 00000000 {major:x}:{minor:x} {} {}\n",
                meta.ino(),
                lib.display()
            );
            ids.push(meta.ino());
        }
        let proc = tmp.path().join("proc");
        fs::create_dir_all(proc.join("10")).unwrap();
        fs::write(proc.join("10").join("maps"), &lines).unwrap();
        std::os::unix::fs::symlink("/", proc.join("10").join("root")).unwrap();
        let host = HostPaths {
            proc,
            ..HostPaths::system()
        };
        let scan = Discovery::new().scan_processes(&host);
        let found: Vec<(LibraryKind, u64)> =
            scan.new.iter().map(|l| (l.kind, l.id.inode)).collect();
        assert_eq!(
            found,
            vec![(LibraryKind::Cuda, ids[0]), (LibraryKind::Nccl, ids[1])],
            "the net plugin is not NCCL itself"
        );
    }

    #[test]
    fn scan_finds_a_library_once_and_reports_every_user() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libcuda.so.1");
        fs::write(&lib, b"not really ELF").unwrap();
        let meta = fs::metadata(&lib).unwrap();
        let (dev, ino) = (meta.dev(), meta.ino());
        // Render the dev the way maps does.
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let line = format!(
            "7f00-7f10 r-xp 00000000 {major:x}:{minor:x} {ino} {}\n",
            lib.display()
        );

        // A fake /proc with two processes mapping the same file; their root is "/".
        let proc = tmp.path().join("proc");
        for pid in ["10", "11"] {
            fs::create_dir_all(proc.join(pid)).unwrap();
            fs::write(proc.join(pid).join("maps"), &line).unwrap();
            std::os::unix::fs::symlink("/", proc.join(pid).join("root")).unwrap();
        }
        let host = HostPaths {
            proc,
            ..HostPaths::system()
        };
        let mut d = Discovery::new();
        let scan = d.scan_processes(&host);
        assert_eq!(scan.new.len(), 1, "{scan:?}");
        assert_eq!(scan.new[0].id, FileId { dev, inode: ino });
        assert!(
            scan.new[0]
                .attach_path
                .ends_with(lib.strip_prefix("/").unwrap())
        );
        assert_eq!(scan.users.len(), 2);
        // A second scan reports users again but nothing new.
        let again = d.scan_processes(&host);
        assert!(again.new.is_empty());
        assert_eq!(again.users.len(), 2);
    }
}
