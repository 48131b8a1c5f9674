//! Finding limiter regions: files under the configured directories, and region files that GPU
//! processes have mapped (reached through `/proc/<pid>/map_files`, so regions inside containers
//! are found without configuration). Every file is opened through `region::tenant_fs` (never by
//! following a tenant's path) and sniffed here; [`super::region_scan`] runs this on its workers
//! and reads what it finds. Both this project's format and HAMi-core's v1 format are read,
//! lock-free and read-only; a corrupt or hostile file is reported, never trusted.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use region::{
    hami::{HAMI_MAGIC, HamiSnapshot},
    layout::{REGION_MAGIC, RegionHeader},
    reader::RegionSnapshot,
    tenant_fs::{self, Access, EntryKind, Root, TenantFile},
};

use crate::discovery::procmaps::{self, MappedFile};

/// Directories searched by default: this project's, and HAMi's per-container directories on the
/// host (`<hostHookPath>/vgpu/containers/<podUID>_<container>/`).
pub const DEFAULT_REGION_DIRS: &[&str] =
    &["/var/lib/vgpu-agent/regions", "/usr/local/vgpu/containers"];

/// How deep below a region directory files are looked for.
const MAX_DEPTH: usize = 3;

/// Entries read from one directory under a region directory (more are not looked at).
const MAX_DIR_ENTRIES: usize = 4096;

/// Files looked at below one region directory at most (containers can write there).
const MAX_DIR_FILES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Vgpu,
    Hami,
}

/// One region as read this time.
#[derive(Debug)]
pub enum RegionRead {
    Vgpu(Box<RegionSnapshot>),
    Hami(Box<HamiSnapshot>),
    /// The file looked like a region but could not be read: the reason, for people.
    Failed(Format, String),
    /// Not read this time: a read of it started earlier has not returned for `seconds` (the
    /// file blocks: a FUSE file, a stuck filesystem).
    Blocked {
        format: Format,
        seconds: f64,
    },
}

/// Where this project's magic sits in a region file (after the initialisation state word).
pub const MAGIC_OFFSET: usize = std::mem::offset_of!(RegionHeader, magic);

/// What kind of region a file is, from its first bytes; `None` for anything else.
pub fn sniff(file: &TenantFile) -> Option<Format> {
    let mut head = [0u8; MAGIC_OFFSET + 8];
    if file.read_at(0, &mut head).ok()? < head.len() {
        return None;
    }
    let magic = u64::from_le_bytes(head[MAGIC_OFFSET..].try_into().expect("8 bytes"));
    if magic == REGION_MAGIC {
        Some(Format::Vgpu)
    } else if i32::from_le_bytes(head[..4].try_into().expect("4 bytes")) == HAMI_MAGIC {
        Some(Format::Hami)
    } else {
        None
    }
}

/// The first bytes of a region file of this project's format, for tests.
#[cfg(test)]
pub fn magic_prefix() -> Vec<u8> {
    let mut v = vec![0u8; MAGIC_OFFSET];
    v.extend(REGION_MAGIC.to_le_bytes());
    v
}

/// Regular files below `inside` in `root`, up to `depth` directories down and [`MAX_DIR_FILES`]
/// in all, never following a link (every directory is opened inside `root` again).
fn files_under(root: &Root, inside: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok((entries, _)) = root.entries(inside, MAX_DIR_ENTRIES) else {
        return;
    };
    for (name, kind) in entries {
        if out.len() == MAX_DIR_FILES {
            return;
        }
        let p = inside.join(name);
        match kind {
            EntryKind::File => out.push(p),
            EntryKind::Dir if depth > 0 => files_under(root, &p, depth - 1, out),
            _ => {}
        }
    }
}

/// A shared file mapping of a process: a region candidate.
#[derive(Clone, Debug)]
pub struct MappedRegion {
    /// The `/proc` it was read from.
    pub proc: PathBuf,
    pub pid: u32,
    pub map: MappedFile,
}

/// A region file found this time, opened through `region::tenant_fs` and sniffed.
#[derive(Debug)]
pub struct Candidate {
    /// How it is shown: the directory's path, or `/proc/<pid>/root/<path in the container>`.
    pub path: PathBuf,
    pub format: Format,
    pub file: TenantFile,
    /// Uid of a process found mapping it.
    pub user_uid: Option<u32>,
}

/// One region as read this time.
#[derive(Debug)]
pub struct RegionReading {
    pub path: PathBuf,
    pub read: RegionRead,
    /// Why a uid other than its users' could have written it (`None`: only its owner could).
    pub writable_by_others: Option<String>,
    /// Host pids of the GPU processes whose maps name this file (its device and inode), in
    /// order: the only processes its slots may count for.
    pub mapped_by: Vec<u32>,
}

/// Why a region file could have been written by a uid other than its users': its mode lets group
/// or others write, or its owner is not the uid of a process that uses it.
pub fn writable_by_others(mode: u32, owner: u32, user: Option<u32>) -> Option<String> {
    let perm = mode & 0o7777;
    if mode & 0o002 != 0 {
        Some(format!("mode {perm:04o}: any local user can write it"))
    } else if mode & 0o020 != 0 {
        Some(format!("mode {perm:04o}: its group can write it"))
    } else {
        match user {
            Some(u) if u != owner => Some(format!(
                "owned by uid {owner}, used by a process of uid {u}"
            )),
            _ => None,
        }
    }
}

/// The region files below the configured directory `dir`: each opened inside it as a tenant's
/// file (links, FIFOs and devices are never opened, linked directories never entered) and
/// sniffed. Blocks only as long as the directory's files do: run on a worker.
pub fn dir_candidates(dir: &Path) -> Vec<Candidate> {
    let Ok(root) = Root::dir(dir) else {
        return vec![];
    };
    let mut files = Vec::new();
    files_under(&root, Path::new(""), MAX_DEPTH, &mut files);
    if files.len() == MAX_DIR_FILES {
        log::warn!(
            "{}: looking at the first {MAX_DIR_FILES} files only",
            dir.display()
        );
    }
    files
        .into_iter()
        .filter_map(|rel| {
            let file = root.open(&rel, Access::Read).ok()?;
            let format = sniff(&file)?;
            Some(Candidate {
                path: dir.join(&rel),
                format,
                file,
                user_uid: None,
            })
        })
        .collect()
}

/// The region files process `pid` maps: each opened through its `map_files` entry (or inside its
/// root) and used only if its (device, inode) is the one its maps name, then sniffed. Blocks as
/// long as the process's maps or files do: run on a worker.
pub fn process_candidates(proc: &Path, pid: u32) -> Vec<Candidate> {
    let mapped = mapped_files(proc, pid);
    if mapped.is_empty() {
        return vec![];
    }
    let user_uid = fs::metadata(proc.join(pid.to_string()))
        .ok()
        .map(|m| m.uid());
    mapped
        .into_iter()
        .filter_map(|MappedRegion { proc, pid, map }| {
            let file =
                tenant_fs::open_mapped(&proc, pid, map.range(), &map.path, map.key(), Access::Read)
                    .ok()?;
            let format = sniff(&file)?;
            let path = proc
                .join(pid.to_string())
                .join("root")
                .join(map.path.strip_prefix("/").unwrap_or(&map.path));
            Some(Candidate {
                path,
                format,
                file,
                user_uid,
            })
        })
        .collect()
}

/// Shared file mappings of process `pid` other than devices and memfds (region candidates).
pub fn mapped_files(proc: &Path, pid: u32) -> Vec<MappedRegion> {
    let Ok((maps, _)) = procmaps::read(proc, pid) else {
        return vec![];
    };
    let mut out: Vec<MappedRegion> = maps
        .into_iter()
        .filter(|m| m.shared && !m.deleted)
        .filter(|m| !m.path.starts_with("/dev/") && !m.path.starts_with("/memfd:"))
        .map(|map| MappedRegion {
            proc: proc.to_owned(),
            pid,
            map,
        })
        .collect();
    out.sort_by_key(|m| (m.map.key(), m.map.start));
    out.dedup_by_key(|m| m.map.key());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_both_formats_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        fs::write(&v, magic_prefix()).unwrap();
        let h = dir.path().join("h");
        let mut bytes = HAMI_MAGIC.to_le_bytes().to_vec();
        bytes.extend([0u8; 12]);
        fs::write(&h, bytes).unwrap();
        let other = dir.path().join("o");
        fs::write(&other, b"#!/bin/sh\n").unwrap();
        let short = dir.path().join("s");
        fs::write(&short, b"VG").unwrap();
        let root = Root::dir(dir.path()).unwrap();
        let sniffed = |name: &str| sniff(&root.open(Path::new(name), Access::Read).unwrap());
        assert_eq!(sniffed("v"), Some(Format::Vgpu));
        assert_eq!(sniffed("h"), Some(Format::Hami));
        assert_eq!(sniffed("o"), None);
        assert_eq!(sniffed("s"), None);
    }

    #[test]
    fn a_corrupt_region_is_reported_not_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("pod_ctr");
        fs::create_dir_all(&sub).unwrap();
        // The right magic, then garbage: a region that cannot be read.
        let mut bytes = magic_prefix();
        bytes.extend([0xffu8; 200]);
        fs::write(sub.join("r.cache"), &bytes).unwrap();
        fs::write(sub.join("not-a-region"), b"hello").unwrap();
        let c = dir_candidates(dir.path());
        assert_eq!(c.len(), 1, "{c:?}");
        let mut scan = super::super::region_scan::RegionScan::new(
            vec![dir.path().to_owned()],
            Path::new("/proc"),
        );
        let far = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let reads = scan.scan(&[], far).regions;
        assert_eq!(reads.len(), 1, "{reads:?}");
        assert!(
            matches!(&reads[0].read, RegionRead::Failed(Format::Vgpu, msg) if !msg.is_empty()),
            "{:?}",
            reads[0].read
        );
    }

    /// A region directory is a host directory that containers write into: a link, FIFO or
    /// device there is never opened, and a linked directory is not entered.
    #[test]
    fn links_and_special_files_in_a_region_directory_are_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let mut bytes = magic_prefix();
        bytes.extend([0u8; 200]);
        fs::write(host.path().join("host.region"), &bytes).unwrap();
        let sub = dir.path().join("pod_ctr");
        fs::create_dir_all(&sub).unwrap();
        std::os::unix::fs::symlink(host.path().join("host.region"), sub.join("r.cache")).unwrap();
        std::os::unix::fs::symlink(host.path(), sub.join("linked-dir")).unwrap();
        let fifo =
            std::ffi::CString::new(sub.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        let t0 = std::time::Instant::now();
        let c = dir_candidates(dir.path());
        assert!(c.is_empty(), "{c:?}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn regions_other_uids_could_write_are_flagged() {
        assert_eq!(writable_by_others(0o100600, 1000, Some(1000)), None);
        assert_eq!(writable_by_others(0o100644, 0, None), None);
        let any = writable_by_others(0o100666, 1000, Some(1000)).unwrap();
        assert!(
            any.contains("0666") && any.contains("any local user"),
            "{any}"
        );
        let group = writable_by_others(0o100660, 1000, Some(1000)).unwrap();
        assert!(group.contains("group"), "{group}");
        let other = writable_by_others(0o100600, 0, Some(1000)).unwrap();
        assert!(
            other.contains("uid 0") && other.contains("uid 1000"),
            "{other}"
        );
    }
}
