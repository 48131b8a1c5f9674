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

use region::tenant_fs::{self, Access, FileKey, TenantFile, TenantFsError};

use crate::{host::HostPaths, model::FoundBy};

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
    host_candidates(host, kind.soname())
        .into_iter()
        .find_map(|(rooted, path)| identify(kind, &rooted, &path, FoundBy::Host))
}

/// Where the host's loader would find `soname`, as paths reachable from here (under
/// [`HostPaths::root`]): the loader cache's entry first, then the driver directories. Only
/// regular files are returned.
pub fn host_soname(host: &HostPaths, soname: &str) -> Option<PathBuf> {
    host_candidates(host, soname)
        .into_iter()
        .map(|(rooted, _)| rooted)
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file()))
}

/// Candidates for `soname` on the host, in the loader's order: (path from here, path on the host).
fn host_candidates(host: &HostPaths, soname: &str) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    if let Ok(buf) = tenant_fs::open_checked(&host.ld_so_cache, None, Access::Read)
        .and_then(|f| f.read_bounded(MAX_LD_SO_CACHE_BYTES))
        && let Ok(entries) = ldcache::parse(&buf)
    {
        out.extend(
            entries
                .iter()
                .filter(|e| e.soname == soname)
                .map(|e| (host.rooted(&e.path), e.path.clone())),
        );
    }
    out.extend(host.driver_dirs.iter().map(|dir| {
        let path = Path::new(dir).join(soname);
        (host.rooted(&path), path)
    }));
    out
}

/// The host's loader cache is read whole, up to this size (a few hundred KiB in practice).
const MAX_LD_SO_CACHE_BYTES: u64 = 64 << 20;

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
    /// Libraries a process maps that were not used, and why (each reported once).
    pub refused: Vec<String>,
}

/// Remembers which library files were already found, so repeated scans report only new ones.
#[derive(Debug, Default)]
pub struct Discovery {
    seen: HashSet<FileId>,
    /// Mappings refused already (reported once).
    refused: HashSet<(u32, FileId)>,
}

/// Opens a library for reading its symbols: a process's mapping through its `map_files` entry,
/// a host library by its path; either way only if it is still the file `lib.id` names.
pub fn open_library(lib: &LibraryFile) -> Result<TenantFile, TenantFsError> {
    let key = FileKey {
        dev: lib.id.dev,
        ino: lib.id.inode,
    };
    tenant_fs::open_checked(&lib.attach_path, Some(key), Access::Read)
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
            let Ok((maps, read)) = procmaps::read(&host.proc, pid) else {
                scan.unreadable += 1;
                continue;
            };
            if read.truncated {
                log::debug!(
                    "pid {pid}: maps longer than {} bytes; the rest was not read",
                    procmaps::MAX_MAPS_BYTES
                );
            }
            self.scan_one(host, pid, &maps, &mut scan);
        }
        scan
    }

    fn scan_one(
        &mut self,
        host: &HostPaths,
        pid: u32,
        maps: &[procmaps::MappedFile],
        scan: &mut ProcessScan,
    ) {
        for kind in LibraryKind::ALL {
            let mut this_process = HashSet::new();
            for m in maps {
                let name = m.path.file_name().unwrap_or_default().to_string_lossy();
                if !kind.matches_file_name(&name) {
                    continue;
                }
                let id = FileId {
                    dev: m.dev,
                    inode: m.inode,
                };
                if !this_process.insert(id) {
                    continue;
                }
                if self.seen.contains(&id) {
                    scan.users.push((pid, id));
                    continue;
                }
                // The path means something only inside the process's mount namespace, and the
                // process controls it: probe and read the file through the kernel's reference to
                // the mapping instead, and only if it is the file the maps line names (for
                // overlayfs, both name the file as the process sees it).
                let found = LibraryFile {
                    kind,
                    id,
                    attach_path: tenant_fs::map_files_path(&host.proc, pid, m.start, m.end),
                    path: m.path.clone(),
                    found_by: FoundBy::Process { pid },
                };
                if let Err(e) = open_library(&found) {
                    if self.refused.insert((pid, id)) {
                        let e = match &e {
                            TenantFsError::Io { source, .. }
                                if source.raw_os_error() == Some(crate::sys::errno::EPERM) =>
                            {
                                format!(
                                    "{e} (opening a process's map_files entry needs \
                                     CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN)"
                                )
                            }
                            e => e.to_string(),
                        };
                        let why = format!("pid {pid}: not probing {}: {e}", m.path.display());
                        log::warn!("{why}");
                        scan.refused.push(why);
                    }
                    continue;
                }
                scan.users.push((pid, id));
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
        let proc = tmp.path().join("proc");
        fs::create_dir_all(proc.join("10").join("map_files")).unwrap();
        for (i, name) in ["libcuda.so.1", "libnccl.so.2", "libnccl-net.so"]
            .into_iter()
            .enumerate()
        {
            let lib = tmp.path().join(name);
            fs::write(&lib, name).unwrap();
            let meta = fs::metadata(&lib).unwrap();
            let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
            let range = format!("7f{i}0-7f{i}8");
            lines += &format!(
                "{range} r-xp 00000000 {major:x}:{minor:x} {} {}\n",
                meta.ino(),
                lib.display()
            );
            std::os::unix::fs::symlink(&lib, proc.join("10").join("map_files").join(range))
                .unwrap();
            ids.push(meta.ino());
        }
        fs::write(proc.join("10").join("maps"), &lines).unwrap();
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

        // A fake /proc with two processes mapping the same file (map_files entries are links
        // to it, as the kernel's magic links lead to it).
        let proc = tmp.path().join("proc");
        for pid in ["10", "11"] {
            fs::create_dir_all(proc.join(pid).join("map_files")).unwrap();
            fs::write(proc.join(pid).join("maps"), &line).unwrap();
            std::os::unix::fs::symlink(&lib, proc.join(pid).join("map_files").join("7f00-7f10"))
                .unwrap();
        }
        let host = HostPaths {
            proc,
            ..HostPaths::system()
        };
        let mut d = Discovery::new();
        let scan = d.scan_processes(&host);
        assert_eq!(scan.new.len(), 1, "{scan:?}");
        assert_eq!(scan.new[0].id, FileId { dev, inode: ino });
        assert!(scan.new[0].attach_path.ends_with("map_files/7f00-7f10"));
        assert_eq!(scan.new[0].path, lib);
        assert_eq!(scan.users.len(), 2);
        // A second scan reports users again but nothing new.
        let again = d.scan_processes(&host);
        assert!(again.new.is_empty());
        assert_eq!(again.users.len(), 2);
    }

    /// The maps line names one file; the process's mapping is another now (the tenant swapped
    /// what the path leads to): refused, reported once, never probed.
    #[test]
    fn a_mapping_that_is_not_the_file_maps_names_is_refused_once() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libcuda.so.1");
        fs::write(&lib, b"lib").unwrap();
        let other = tmp.path().join("other");
        fs::write(&other, b"other").unwrap();
        let meta = fs::metadata(&lib).unwrap();
        let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let line = format!(
            "7f00-7f10 r-xp 00000000 {major:x}:{minor:x} {} {}\n",
            meta.ino(),
            lib.display()
        );
        let proc = tmp.path().join("proc");
        fs::create_dir_all(proc.join("10").join("map_files")).unwrap();
        fs::write(proc.join("10").join("maps"), &line).unwrap();
        std::os::unix::fs::symlink(&other, proc.join("10").join("map_files").join("7f00-7f10"))
            .unwrap();
        let host = HostPaths {
            proc,
            ..HostPaths::system()
        };
        let mut d = Discovery::new();
        let scan = d.scan_processes(&host);
        assert!(scan.new.is_empty(), "{scan:?}");
        assert_eq!(scan.refused.len(), 1, "{scan:?}");
        assert!(
            scan.refused[0].contains("not the file"),
            "{}",
            scan.refused[0]
        );
        assert!(d.scan_processes(&host).refused.is_empty(), "reported once");
    }
}
