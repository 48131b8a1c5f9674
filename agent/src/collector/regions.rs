//! Finding limiter regions: files under the configured directories, and region files that GPU
//! processes have mapped (reached through `/proc/<pid>/map_files`, so regions inside containers
//! are found without configuration). Every file is opened through `tenant_fs` (never by
//! following a tenant's path) and sniffed here; [`super::region_scan`] runs this on its workers
//! and reads what it finds. Both this project's format and HAMi-core's v1 format are read,
//! lock-free and read-only; a corrupt or hostile file is reported, never trusted.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use region::{
    FreezeMark,
    hami::{HAMI_MAGIC, HamiSnapshot},
    layout::{REGION_MAGIC, RegionHeader},
    read_control,
    reader::RegionSnapshot,
};
use tenant_fs::{Access, EntryKind, FileKey, Root, TenantFile, TenantFsError};

use tenant_fs::maps::MappedFile;

/// Directories searched by default: this project's, and HAMi's per-container directories on the
/// host (`<hostHookPath>/vgpu/containers/<podUID>_<container>/`).
pub const DEFAULT_REGION_DIRS: &[&str] =
    &["/var/lib/vgpu-agent/regions", "/usr/local/vgpu/containers"];

/// How deep below a region directory files are looked for.
const MAX_DEPTH: usize = 3;

/// Entries read from one directory under a region directory (more are not looked at).
const MAX_DIR_ENTRIES: usize = 4096;

/// Files looked at below one subdirectory of a region directory. In HAMi's layout each
/// subdirectory (`<podUID>_<container>`) is one container's, which it can write: past this its
/// other files are skipped and counted, and its siblings are still listed.
pub const MAX_SUBDIR_FILES: usize = 256;

/// Directories entered below one subdirectory of a region directory (the subdirectory itself
/// included).
pub const MAX_SUBDIR_DIRS: usize = 16;

/// Files looked at below one region directory in all: when the subdirectories hold more, the
/// largest are cut first (each keeps an equal share at least), so a few files of each
/// container are always looked at.
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

/// Writes `mark` into a control block beside `region`, as the limiter creates it (zero-filled)
/// and `vgpu-agent freeze` marks it (`freeze::Container`), for tests.
#[cfg(test)]
pub fn write_mark(region: &Path, mark: FreezeMark) {
    let ctl = region::control_path(region);
    let _created = region::ControlReader::open_or_create(&ctl).unwrap();
    let file = tenant_fs::open_no_links(&ctl, Access::ReadWrite).unwrap();
    region::ControlWriter::new(&file)
        .unwrap()
        .update(|s| s.freeze = mark)
        .unwrap();
}

/// A part of a region directory (one of its subdirectories, or the files directly in it) whose
/// files were not all looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListingCut {
    /// The subdirectory (or the region directory itself, for the files directly in it).
    pub path: PathBuf,
    /// Regular files found there and not looked at.
    pub files_skipped: u64,
    /// Directories below it not entered (over [`MAX_SUBDIR_DIRS`], or deeper than
    /// [`MAX_DEPTH`]).
    pub dirs_skipped: u64,
    /// A directory there had more than [`MAX_DIR_ENTRIES`] entries: the rest were not read
    /// (so not counted either).
    pub entries_unread: bool,
}

/// How a cut is shown in the model.
pub fn cut_model(c: &ListingCut) -> crate::model::RegionListingCut {
    crate::model::RegionListingCut {
        path: c.path.display().to_string(),
        files_skipped: c.files_skipped,
        dirs_skipped: c.dirs_skipped,
        entries_unread: c.entries_unread,
    }
}

/// The regular files of one part of a region directory, and what was left of it.
struct Part {
    files: Vec<PathBuf>,
    cut: ListingCut,
}

/// Regular files below `inside` in `root` (a subdirectory), up to `depth` directories down,
/// [`MAX_SUBDIR_FILES`] files and [`MAX_SUBDIR_DIRS`] directories, never following a link
/// (every directory is opened inside `root` again); what is left is counted in `part.cut`.
fn files_under(root: &Root, inside: &Path, depth: usize, part: &mut Part, dirs_read: &mut usize) {
    *dirs_read += 1;
    let Ok((entries, more)) = root.entries(inside, MAX_DIR_ENTRIES) else {
        return;
    };
    part.cut.entries_unread |= more;
    let mut below = Vec::new();
    for (name, kind) in entries {
        match kind {
            EntryKind::File if part.files.len() < MAX_SUBDIR_FILES => {
                part.files.push(inside.join(name))
            }
            EntryKind::File => part.cut.files_skipped += 1,
            EntryKind::Dir if depth > 0 => below.push(inside.join(name)),
            EntryKind::Dir => part.cut.dirs_skipped += 1,
            _ => {}
        }
    }
    for dir in below {
        if *dirs_read < MAX_SUBDIR_DIRS {
            files_under(root, &dir, depth - 1, part, dirs_read);
        } else {
            part.cut.dirs_skipped += 1;
        }
    }
}

/// The regular files below a region directory, each part bounded on its own: the files
/// directly in it, and each subdirectory's tree ([`files_under`]). Then, over
/// [`MAX_DIR_FILES`] in all, the largest parts are cut to an equal share. Returns the files and
/// the parts that were cut.
fn list_region_dir(root: &Root, shown: &Path) -> (Vec<PathBuf>, Vec<ListingCut>) {
    let new_part = |path: PathBuf| Part {
        files: vec![],
        cut: ListingCut {
            path,
            files_skipped: 0,
            dirs_skipped: 0,
            entries_unread: false,
        },
    };
    let Ok((entries, more)) = root.entries(Path::new(""), MAX_DIR_ENTRIES) else {
        return (vec![], vec![]);
    };
    let mut top = new_part(shown.to_owned());
    top.cut.entries_unread = more;
    let mut parts = Vec::new();
    for (name, kind) in entries {
        let p = PathBuf::from(&name);
        match kind {
            EntryKind::File if top.files.len() < MAX_DIR_FILES => top.files.push(p),
            EntryKind::File => top.cut.files_skipped += 1,
            EntryKind::Dir => {
                let mut part = new_part(shown.join(&name));
                files_under(root, &p, MAX_DEPTH - 1, &mut part, &mut 0);
                parts.push(part);
            }
            _ => {}
        }
    }
    parts.push(top);
    // Over the total: the largest cap that fits, so the smallest parts stay whole.
    let total: usize = parts.iter().map(|p| p.files.len()).sum();
    if total > MAX_DIR_FILES {
        let mut sizes: Vec<usize> = parts.iter().map(|p| p.files.len()).collect();
        sizes.sort_unstable();
        let mut left = MAX_DIR_FILES;
        let mut cap = 0;
        for (i, size) in sizes.iter().enumerate() {
            let share = left / (sizes.len() - i);
            if *size > share {
                cap = share;
                break;
            }
            left -= size;
            cap = *size;
        }
        for part in &mut parts {
            if part.files.len() > cap {
                part.cut.files_skipped += (part.files.len() - cap) as u64;
                part.files.truncate(cap);
            }
        }
    }
    let mut files = Vec::new();
    let mut cuts = Vec::new();
    for part in parts {
        files.extend(part.files);
        let c = part.cut;
        if c.files_skipped > 0 || c.dirs_skipped > 0 || c.entries_unread {
            cuts.push(c);
        }
    }
    (files, cuts)
}

/// A shared file mapping of a process: a region candidate.
#[derive(Clone, Debug)]
pub struct MappedRegion {
    /// The `/proc` it was read from.
    pub proc: PathBuf,
    pub pid: u32,
    pub map: MappedFile,
}

/// A region file found this time, opened through `tenant_fs` and sniffed.
#[derive(Debug)]
pub struct Candidate {
    /// How it is shown: the directory's path, or `/proc/<pid>/root/<path in the container>`.
    pub path: PathBuf,
    pub format: Format,
    pub file: TenantFile,
    /// Uid of a process found mapping it.
    pub user_uid: Option<u32>,
    /// Its control block, opened beside it.
    pub control: ControlFile,
}

/// The control block beside a region (`<region>.ctl`, `region::control`), as its listing found
/// it. The agent only reads it here: `vgpu-agent freeze` and `limit set` write it.
#[derive(Debug)]
pub enum ControlFile {
    /// None there: the limiter creates it when it starts, and a region of HAMi's format has
    /// none.
    Absent,
    Opened(TenantFile),
    /// There, but not a file the agent reads as one (a link, a FIFO, a device, a file mounted
    /// over it from another filesystem): why, for people.
    Refused(String),
}

/// What a region's control block said this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlRead {
    /// No control block, or not read this time (its region's read has not returned).
    Absent,
    /// Its freeze mark (`Running` for a block never written).
    Mark(FreezeMark),
    /// It could not be read or did not validate (the tenant can write it): why. Not frozen.
    Failed(String),
}

impl ControlRead {
    /// The container is being frozen or is frozen (`vgpu-agent freeze --container`, through
    /// the driver or in-process).
    pub fn frozen(&self) -> bool {
        matches!(
            self,
            ControlRead::Mark(FreezeMark::Freezing | FreezeMark::Frozen | FreezeMark::InProcess)
        )
    }

    /// The container is frozen by its processes themselves (the in-process path).
    pub fn in_process(&self) -> bool {
        *self == ControlRead::Mark(FreezeMark::InProcess)
    }
}

/// Opens the control block of the region at `region` (a path inside `root`, its identity
/// `key`) read-only inside `root`, as `limit` opens it: never following a link, never opening
/// anything but a regular file, and only on the region's own filesystem (a block mounted over
/// it is another file).
fn open_control(root: &Root, region: &Path, key: FileKey) -> ControlFile {
    match root.open(&region::control_path(region), Access::Read) {
        Ok(f) if f.key().dev != key.dev => ControlFile::Refused(format!(
            "{} is on another filesystem than its region (mounted over)",
            f.path().display()
        )),
        Ok(f) => ControlFile::Opened(f),
        Err(TenantFsError::NotFound { .. }) => ControlFile::Absent,
        Err(e) => ControlFile::Refused(e.to_string()),
    }
}

/// Reads a control block's freeze mark: two `pread`s of its 384 bytes (a bounded number more
/// while a writer is in the middle of a write), never a mapping, never a write.
pub fn read_mark(control: &TenantFile) -> ControlRead {
    match read_control(control) {
        Ok(snap) => ControlRead::Mark(snap.map_or(FreezeMark::Running, |s| s.settings.freeze)),
        Err(e) => ControlRead::Failed(e.to_string()),
    }
}

/// One region as read this time.
#[derive(Debug)]
pub struct RegionReading {
    pub path: PathBuf,
    pub read: RegionRead,
    /// Its control block's freeze mark, read with it.
    pub control: ControlRead,
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
/// sniffed; with the parts of it that were not all looked at ([`list_region_dir`]). Blocks only
/// as long as the directory's files do: run on a worker.
pub fn dir_candidates(dir: &Path) -> (Vec<Candidate>, Vec<ListingCut>) {
    let Ok(root) = Root::dir(dir) else {
        return (vec![], vec![]);
    };
    let (files, cuts) = list_region_dir(&root, dir);
    let candidates = files
        .into_iter()
        .filter_map(|rel| {
            let file = root.open(&rel, Access::Read).ok()?;
            let format = sniff(&file)?;
            let control = match format {
                Format::Vgpu => open_control(&root, &rel, file.key()),
                Format::Hami => ControlFile::Absent,
            };
            Some(Candidate {
                path: dir.join(&rel),
                format,
                file,
                user_uid: None,
                control,
            })
        })
        .collect();
    (candidates, cuts)
}

/// Shared files of one process opened and sniffed at most per listing (a process maps one
/// region, two with HAMi's beside this project's; the rest are other shared files).
pub const MAX_PROCESS_FILES_SNIFFED: usize = 64;

/// Regions of one process kept (opened, and read each snapshot) at most.
pub const MAX_PROCESS_REGIONS: usize = 8;

/// The region files process `pid` maps: each opened through its `map_files` entry (or inside its
/// root) and used only if its (device, inode) is the one its maps name, then sniffed; at most
/// [`MAX_PROCESS_FILES_SNIFFED`] files looked at and [`MAX_PROCESS_REGIONS`] regions kept, the
/// rest counted in the cut. Blocks as long as the process's maps or files do: run on a worker.
pub fn process_candidates(proc: &Path, pid: u32) -> (Vec<Candidate>, Vec<ListingCut>) {
    let mapped = mapped_files(proc, pid);
    if mapped.is_empty() {
        return (vec![], vec![]);
    }
    let user_uid = fs::metadata(proc.join(pid.to_string()))
        .ok()
        .map(|m| m.uid());
    let mut cut = ListingCut {
        path: proc.join(pid.to_string()).join("maps"),
        files_skipped: mapped.len().saturating_sub(MAX_PROCESS_FILES_SNIFFED) as u64,
        dirs_skipped: 0,
        entries_unread: false,
    };
    let mut found = Vec::new();
    // The process's root, where its control blocks are opened (once, at its first region).
    let mut root: Option<Result<Root, String>> = None;
    for MappedRegion { proc, pid, map } in mapped.into_iter().take(MAX_PROCESS_FILES_SNIFFED) {
        let Ok(file) =
            tenant_fs::open_mapped(&proc, pid, map.range(), &map.path, map.key(), Access::Read)
        else {
            continue;
        };
        let Some(format) = sniff(&file) else {
            continue;
        };
        if found.len() == MAX_PROCESS_REGIONS {
            cut.files_skipped += 1;
            continue;
        }
        let path = proc
            .join(pid.to_string())
            .join("root")
            .join(map.path.strip_prefix("/").unwrap_or(&map.path));
        let control = match format {
            Format::Vgpu => {
                match root
                    .get_or_insert_with(|| Root::process(&proc, pid).map_err(|e| e.to_string()))
                {
                    Ok(root) => open_control(root, &map.path, file.key()),
                    Err(why) => ControlFile::Refused(why.clone()),
                }
            }
            Format::Hami => ControlFile::Absent,
        };
        found.push(Candidate {
            path,
            format,
            file,
            user_uid,
            control,
        });
    }
    let cuts = if cut.files_skipped > 0 {
        vec![cut]
    } else {
        vec![]
    };
    (found, cuts)
}

/// Whether a shared mapping of this path may be a region: not a device (`/dev/nvidia*` and the
/// like) nor a memfd; files in `/dev/shm` are (a common place for regions: a tmpfs every
/// container has).
fn may_be_region(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // A memfd's name is `/memfd:NAME`: a prefix of the first component, not a component.
    if path.as_os_str().as_bytes().starts_with(b"/memfd:") {
        return false;
    }
    !path.starts_with("/dev/") || path.starts_with("/dev/shm/")
}

/// Shared file mappings of process `pid` other than devices and memfds (region candidates).
pub fn mapped_files(proc: &Path, pid: u32) -> Vec<MappedRegion> {
    let Ok((maps, _)) = tenant_fs::maps::read(proc, pid) else {
        return vec![];
    };
    let mut out: Vec<MappedRegion> = maps
        .into_iter()
        .filter(|m| m.shared && !m.deleted && may_be_region(&m.path))
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

    /// A region in /dev/shm is one a process maps (a device or a memfd is not).
    #[test]
    fn regions_in_dev_shm_are_candidates_devices_are_not() {
        assert!(may_be_region(Path::new("/dev/shm/vgpu/ctr.cache")));
        assert!(may_be_region(Path::new("/tmp/vgpu/ctr.cache")));
        assert!(!may_be_region(Path::new("/dev/nvidiactl")));
        assert!(!may_be_region(Path::new("/dev/nvidia-uvm")));
        assert!(!may_be_region(Path::new("/memfd:cuda")));
    }

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
        let (c, _) = dir_candidates(dir.path());
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
        let (c, cuts) = dir_candidates(dir.path());
        assert!(c.is_empty(), "{c:?}");
        assert!(cuts.is_empty(), "{cuts:?}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }

    /// A directory of `n` files that are not regions.
    fn junk(dir: &Path, n: usize) {
        fs::create_dir_all(dir).unwrap();
        for i in 0..n {
            fs::write(dir.join(format!("junk-{i}")), b"x").unwrap();
        }
    }

    /// One tenant fills its subdirectory of a shared region directory with 4,096 files: the
    /// region in its sibling's subdirectory is still found, and the cut is counted for the
    /// tenant's subdirectory only; the scan carries the cut to the model.
    #[test]
    fn a_full_subdirectory_does_not_hide_its_siblings() {
        let dir = tempfile::tempdir().unwrap();
        junk(&dir.path().join("pod_attacker"), 4096);
        let honest = dir.path().join("pod_zz_honest");
        fs::create_dir_all(&honest).unwrap();
        let config = region::RegionConfig::unlimited(1);
        let (_r, _) = region::Region::open_or_create(&honest.join("r.cache"), &config).unwrap();
        let started = std::time::Instant::now();
        let (found, cuts) = dir_candidates(dir.path());
        eprintln!(
            "listed 4,097 files in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].path.starts_with(&honest));
        assert_eq!(
            cuts,
            [ListingCut {
                path: dir.path().join("pod_attacker"),
                files_skipped: 4096 - MAX_SUBDIR_FILES as u64,
                dirs_skipped: 0,
                entries_unread: false,
            }]
        );
        let mut scan = super::super::region_scan::RegionScan::new(
            vec![dir.path().to_owned()],
            Path::new("/proc"),
        );
        let far = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let result = scan.scan(&[], far);
        assert_eq!(result.regions.len(), 1);
        assert_eq!(result.cuts, cuts);
        let line = cut_model(&result.cuts[0]).line();
        assert!(
            line.contains("pod_attacker") && line.contains("3840 file(s)"),
            "{line}"
        );
    }

    /// Past the total, the largest subdirectories are cut to an equal share and the small ones
    /// stay whole; a tenant's deep or wide tree is entered only so far.
    #[test]
    fn the_total_is_shared_out_and_trees_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        // 20 full subdirectories: 5,120 files, over the 4,096 looked at in all.
        for i in 0..20 {
            junk(&dir.path().join(format!("pod_{i:02}")), MAX_SUBDIR_FILES);
        }
        let honest = dir.path().join("pod_honest");
        fs::create_dir_all(&honest).unwrap();
        let config = region::RegionConfig::unlimited(1);
        let (_r, _) = region::Region::open_or_create(&honest.join("r.cache"), &config).unwrap();
        // A tree of 40 directories under one subdirectory.
        let wide = dir.path().join("pod_wide");
        for i in 0..40 {
            fs::create_dir_all(wide.join(format!("d{i}"))).unwrap();
        }
        let (found, cuts) = dir_candidates(dir.path());
        assert_eq!(found.len(), 1, "the honest region is looked at");
        // The honest file is kept; the 4,095 left are shared by the 20 full ones: 204 each.
        let full: Vec<&ListingCut> = cuts.iter().filter(|c| c.files_skipped > 0).collect();
        assert_eq!(full.len(), 20, "{cuts:?}");
        let share = (MAX_DIR_FILES - 1) / 20;
        for c in &full {
            assert_eq!(c.files_skipped, (MAX_SUBDIR_FILES - share) as u64, "{c:?}");
        }
        let wide_cut = cuts
            .iter()
            .find(|c| c.path == wide)
            .expect("the wide tree is cut");
        assert_eq!(
            wide_cut.dirs_skipped,
            (40 + 1 - MAX_SUBDIR_DIRS) as u64,
            "{wide_cut:?}"
        );
    }

    /// A process that maps more regions than are kept: the first are kept, the rest counted
    /// (this test's process maps them; other tests running beside it may map more).
    #[test]
    fn the_regions_one_process_maps_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let config = region::RegionConfig::unlimited(1);
        let n = MAX_PROCESS_REGIONS + 4;
        let _mapped: Vec<_> = (0..n)
            .map(|i| {
                region::Region::open_or_create(&dir.path().join(format!("r{i}.cache")), &config)
                    .unwrap()
            })
            .collect();
        let (found, cuts) = process_candidates(Path::new("/proc"), std::process::id());
        assert_eq!(found.len(), MAX_PROCESS_REGIONS, "{found:?}");
        assert_eq!(cuts.len(), 1, "{cuts:?}");
        assert!(cuts[0].path.ends_with("maps"), "{cuts:?}");
        assert!(cuts[0].files_skipped >= 4, "{cuts:?}");
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
