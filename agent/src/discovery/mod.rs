//! Finding the driver libraries to probe: on the host (ld.so.cache and the usual driver
//! directories) and inside every process (its `/proc/<pid>/maps`, resolved through
//! `/proc/<pid>/root` so that containers in other mount namespaces are covered). Libraries are
//! deduplicated by (device, inode): a uprobe belongs to an inode, so one attachment covers every
//! process that maps the same file, and attaching twice would count every call twice.

pub mod ldcache;
mod library;
pub mod maps_scan;

pub use library::{FileId, LibraryKind};

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use tenant_fs::{Access, FileKey, TenantFile, TenantFsError};

use crate::{host::HostPaths, model::FoundBy};

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
    /// The tenant of the process it was found in (`None`: the host's, or configured).
    pub tenant: Option<Arc<str>>,
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
        tenant: None,
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

/// What a scan of the processes found.
#[derive(Debug, Default)]
pub struct ProcessScan {
    /// Libraries not known before, one per file identity, with the tenant of the process they
    /// were found in.
    pub new: Vec<LibraryFile>,
    /// Processes that map one of the driver-named files (known or not).
    pub users: Vec<(u32, FileId)>,
    /// Processes whose maps could not be read (they exited, or permission).
    pub unreadable: usize,
    /// Mappings that could not be opened, and why (each reported once per process and file).
    pub refused: Vec<Refusal>,
    /// Processes that exited since the last scan.
    pub exited: Vec<u32>,
}

/// A mapping that could not be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub pid: u32,
    pub tenant: Arc<str>,
    pub id: FileId,
    pub message: String,
}

/// What became of a library file found in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Attached,
    /// Not attached (the reason, as counted in the model).
    Skipped(&'static str),
}

#[derive(Debug)]
struct Known {
    verdict: Verdict,
    kind: LibraryKind,
    tenant: Option<Arc<str>>,
    /// Polls in a row at which no live process mapped it, and since when.
    unmapped_polls: u32,
    unmapped_since: Option<std::time::Instant>,
    /// Found on the host or configured: kept whatever maps it.
    pinned: bool,
}

/// A process's driver-named mappings, as last read.
#[derive(Debug)]
struct Mapped {
    tenant: Arc<str>,
    candidates: Vec<maps_scan::Candidate>,
    over_cap: u64,
    /// Candidates that could not be opened (reported once).
    refused: HashSet<FileId>,
}

/// Remembers which library files were found and what became of them, and what every process
/// maps, so that repeated scans report only new files; everything about a process goes when it
/// exits, everything about a file a few polls after no process maps it.
#[derive(Debug)]
pub struct Discovery {
    known: HashMap<FileId, Known>,
    processes: HashMap<u32, Mapped>,
    /// The scan run on this thread (tests, a first scan) or on a worker.
    local: Option<maps_scan::MapsScan>,
    worker: Option<maps_scan::Worker>,
    pub status: crate::model::MapsScanStatus,
}

impl Default for Discovery {
    fn default() -> Discovery {
        Discovery::new()
    }
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

/// New files considered per tenant per scan at most (each is opened and its symbols read); the
/// rest wait for the next scan.
pub const NEW_PER_TENANT_PER_SCAN: usize = 4;

impl Discovery {
    pub fn new() -> Discovery {
        Discovery {
            known: HashMap::new(),
            processes: HashMap::new(),
            local: None,
            worker: None,
            status: Default::default(),
        }
    }

    /// Marks a library as known: attached by other means (the host's, a configured one), kept
    /// whatever maps it.
    pub fn mark_seen(&mut self, id: FileId) -> bool {
        self.known
            .insert(
                id,
                Known {
                    verdict: Verdict::Attached,
                    kind: LibraryKind::Cuda,
                    tenant: None,
                    unmapped_polls: 0,
                    unmapped_since: None,
                    pinned: true,
                },
            )
            .is_none()
    }

    /// Records what became of a library found in a process.
    pub fn decide(&mut self, lib: &LibraryFile, verdict: Verdict) {
        self.known.insert(
            lib.id,
            Known {
                verdict,
                kind: lib.kind,
                tenant: lib.tenant.clone(),
                unmapped_polls: 0,
                unmapped_since: None,
                pinned: !matches!(lib.found_by, FoundBy::Process { .. }),
            },
        );
    }

    /// Forgets a library: the next scan reports it again if a process maps it.
    pub fn forget(&mut self, id: FileId) {
        self.known.remove(&id);
    }

    /// Forgets the libraries skipped for a bound, so that they are considered again (room was
    /// made).
    pub fn reconsider_skipped(&mut self) {
        self.known.retain(|_, k| {
            !matches!(
                k.verdict,
                Verdict::Skipped(crate::discovery::TENANT_CAP | crate::discovery::TOTAL_CAP)
            )
        });
    }

    /// Attached libraries found in processes of `tenant`, of `kind`; and in all.
    pub fn attached_count(&self, tenant: Option<&str>, kind: LibraryKind) -> (usize, usize) {
        let found = self
            .known
            .values()
            .filter(|k| k.verdict == Verdict::Attached && !k.pinned);
        let mut of_tenant = 0;
        let mut all = 0;
        for k in found {
            all += 1;
            if k.kind == kind && k.tenant.as_deref() == tenant {
                of_tenant += 1;
            }
        }
        (of_tenant, all)
    }

    /// Files skipped now, by tenant and reason (mappings past the per-process bound included).
    pub fn skipped(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for k in self.known.values() {
            if let (Verdict::Skipped(why), Some(t)) = (k.verdict, &k.tenant) {
                *out.entry(t.to_string())
                    .or_default()
                    .entry(why.into())
                    .or_default() += 1;
            }
        }
        for m in self.processes.values().filter(|m| m.over_cap > 0) {
            *out.entry(m.tenant.to_string())
                .or_default()
                .entry(MAPPINGS.into())
                .or_default() += m.over_cap;
        }
        out
    }

    /// Files found in processes that no live process has mapped for `grace` polls in a row and
    /// at least `grace_time` up to `now`: forgotten here, returned so that the ones attached are
    /// detached.
    pub fn unmapped(
        &mut self,
        grace: u32,
        grace_time: std::time::Duration,
        now: std::time::Instant,
    ) -> Vec<(FileId, Verdict)> {
        let mapped: HashSet<FileId> = self
            .processes
            .values()
            .flat_map(|m| m.candidates.iter().map(|c| c.id))
            .collect();
        let mut gone = Vec::new();
        for (id, k) in &mut self.known {
            if k.pinned || mapped.contains(id) {
                k.unmapped_polls = 0;
                k.unmapped_since = None;
                continue;
            }
            k.unmapped_polls += 1;
            let since = *k.unmapped_since.get_or_insert(now);
            if k.unmapped_polls >= grace && now.saturating_duration_since(since) >= grace_time {
                gone.push((*id, k.verdict));
            }
        }
        for (id, _) in &gone {
            self.known.remove(id);
        }
        gone
    }

    /// Whether a process is known to be alive (listed at the last scan).
    pub fn is_live(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Reads every process's maps on this thread, without a budget (a first scan; tests).
    pub fn scan_processes(&mut self, host: &HostPaths) -> ProcessScan {
        let scan = self
            .local
            .get_or_insert_with(|| maps_scan::MapsScan::new(&host.proc));
        let cycle = scan.cycle(maps_scan::Budget::UNBOUNDED);
        let known = scan.processes();
        self.apply(host, Some((cycle, known)))
    }

    /// Takes the maps read since the last call from the worker (starting it, and a cycle, if
    /// none runs), waiting for a running cycle at most `wait`; returns what is new.
    pub fn poll(&mut self, host: &HostPaths, wait: std::time::Duration) -> ProcessScan {
        if self.worker.is_none() {
            match maps_scan::Worker::start(&host.proc, maps_scan::Budget::DEFAULT) {
                Ok(w) => self.worker = Some(w),
                Err(e) => {
                    log::warn!("starting the maps scan thread: {e}; scanning on this one");
                    return self.scan_processes(host);
                }
            }
        }
        let cycle = self.worker.as_mut().and_then(|w| w.poll(wait));
        if cycle.is_none() {
            self.status.late_polls += 1;
        }
        self.apply(host, cycle)
    }

    fn apply(&mut self, host: &HostPaths, cycle: Option<(maps_scan::Cycle, usize)>) -> ProcessScan {
        let mut scan = ProcessScan::default();
        if let Some((cycle, known)) = cycle {
            let listed: HashSet<u32> = cycle.listed.iter().copied().collect();
            self.status.read = cycle.read.len();
            self.processes.retain(|pid, _| {
                let live = listed.contains(pid);
                if !live {
                    scan.exited.push(*pid);
                }
                live
            });
            for p in cycle.read {
                let refused = self
                    .processes
                    .remove(&p.pid)
                    .map(|m| m.refused)
                    .unwrap_or_default();
                let ids: HashSet<FileId> = p.candidates.iter().map(|c| c.id).collect();
                self.processes.insert(
                    p.pid,
                    Mapped {
                        tenant: p.tenant,
                        candidates: p.candidates,
                        over_cap: p.over_cap,
                        refused: refused.into_iter().filter(|id| ids.contains(id)).collect(),
                    },
                );
            }
            scan.unreadable = cycle.unreadable;
            self.status.processes = known;
            self.status.bytes = cycle.bytes;
            self.status.deferred = cycle.deferred.values().sum();
            self.status.deferred_by_tenant = cycle
                .deferred
                .iter()
                .map(|(t, n)| (t.to_string(), *n))
                .collect();
            self.status.blocked = cycle
                .blocked
                .iter()
                .map(|b| crate::model::MapsBlocked {
                    pid: b.pid,
                    tenant: b.tenant.to_string(),
                    seconds: b.since.elapsed().as_secs_f64(),
                })
                .collect();
            self.status.cycle_seconds = cycle.took.as_secs_f64();
        }
        let mut considered: HashMap<Arc<str>, usize> = HashMap::new();
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        let mut new_ids: HashSet<FileId> = HashSet::new();
        for pid in pids {
            let m = self.processes.get_mut(&pid).expect("listed above");
            for c in &m.candidates {
                scan.users.push((pid, c.id));
                if self.known.contains_key(&c.id)
                    || m.refused.contains(&c.id)
                    || new_ids.contains(&c.id)
                {
                    continue;
                }
                let n = considered.entry(Arc::clone(&m.tenant)).or_default();
                if *n >= NEW_PER_TENANT_PER_SCAN {
                    continue;
                }
                *n += 1;
                // The path means something only inside the process's mount namespace, and the
                // process controls it: probe and read the file through the kernel's reference to
                // the mapping instead, and only if it is the file the maps line names (for
                // overlayfs, both name the file as the process sees it).
                let found = LibraryFile {
                    kind: c.kind,
                    id: c.id,
                    attach_path: tenant_fs::map_files_path(&host.proc, pid, c.start, c.end),
                    path: c.path.clone(),
                    found_by: FoundBy::Process { pid },
                    tenant: Some(Arc::clone(&m.tenant)),
                };
                if let Err(e) = open_library(&found) {
                    m.refused.insert(c.id);
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
                    scan.refused.push(Refusal {
                        pid,
                        tenant: Arc::clone(&m.tenant),
                        id: c.id,
                        message: format!("pid {pid}: not probing {}: {e}", c.path.display()),
                    });
                    continue;
                }
                new_ids.insert(c.id);
                scan.new.push(found);
            }
        }
        scan
    }
}

/// Reasons a library found in a process is not attached (as counted in the model).
pub const NOT_A_DRIVER: &str = "not_a_driver";
pub const TENANT_CAP: &str = "tenant_cap";
pub const TOTAL_CAP: &str = "total_cap";
pub const ATTACH_FAILED: &str = "attach_failed";
pub const MAPPINGS: &str = "mappings";

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
        d.decide(&scan.new[0], Verdict::Attached);
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
            scan.refused[0].message.contains("not the file"),
            "{}",
            scan.refused[0].message
        );
        assert!(d.scan_processes(&host).refused.is_empty(), "reported once");
    }

    /// A fake /proc where process `pid` maps each of `libs` (files made under `dir`).
    fn fake_process(dir: &Path, proc: &Path, pid: u32, libs: &[&str]) -> Vec<FileId> {
        let mut lines = String::new();
        let mut ids = Vec::new();
        fs::create_dir_all(proc.join(pid.to_string()).join("map_files")).unwrap();
        for (i, name) in libs.iter().enumerate() {
            let lib = dir.join(format!("{pid}-{i}")).join(name);
            fs::create_dir_all(lib.parent().unwrap()).unwrap();
            fs::write(&lib, name).unwrap();
            let meta = fs::metadata(&lib).unwrap();
            let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
            let range = format!("7f{i:04x}000-7f{i:04x}800");
            lines += &format!(
                "{range} r-xp 00000000 {major:x}:{minor:x} {} {}\n",
                meta.ino(),
                lib.display()
            );
            std::os::unix::fs::symlink(
                &lib,
                proc.join(pid.to_string()).join("map_files").join(range),
            )
            .unwrap();
            ids.push(FileId {
                dev: meta.dev(),
                inode: meta.ino(),
            });
        }
        fs::write(proc.join(pid.to_string()).join("maps"), &lines).unwrap();
        ids
    }

    /// Files found in processes are remembered with their verdict and counted per tenant; they
    /// are forgotten a few polls after no live process maps them (not the host's); a process's
    /// refusals go with it.
    #[test]
    fn found_files_are_counted_per_tenant_and_forgotten_after_their_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().join("proc");
        let ids = fake_process(tmp.path(), &proc, 10, &["libcuda.so.1", "libcuda.so.2"]);
        let host = HostPaths {
            proc: proc.clone(),
            ..HostPaths::system()
        };
        let mut d = Discovery::new();
        let host_id = FileId { dev: 1, inode: 1 };
        d.mark_seen(host_id);
        let scan = d.scan_processes(&host);
        assert_eq!(scan.new.len(), 2);
        let tenant = scan.new[0].tenant.clone();
        assert!(tenant.is_some());
        d.decide(&scan.new[0], Verdict::Attached);
        d.decide(&scan.new[1], Verdict::Skipped(TENANT_CAP));
        assert_eq!(
            d.attached_count(tenant.as_deref(), LibraryKind::Cuda),
            (1, 1)
        );
        assert_eq!(d.attached_count(Some("other"), LibraryKind::Cuda), (0, 1));
        let t = tenant.as_deref().unwrap().to_string();
        assert_eq!(d.skipped()[&t][TENANT_CAP], 1);
        assert!(d.scan_processes(&host).new.is_empty());
        // Room made: the skipped one is considered again.
        d.reconsider_skipped();
        assert_eq!(d.scan_processes(&host).new.len(), 1);
        d.decide(&scan.new[1], Verdict::Skipped(NOT_A_DRIVER));
        // The process exits: after the grace, both files are forgotten, the host's is kept.
        fs::remove_dir_all(proc.join("10")).unwrap();
        let scan = d.scan_processes(&host);
        assert_eq!(scan.exited, vec![10]);
        assert!(!d.is_live(10));
        assert!(
            d.unmapped(3, std::time::Duration::ZERO, std::time::Instant::now())
                .is_empty()
        );
        assert!(
            d.unmapped(3, std::time::Duration::ZERO, std::time::Instant::now())
                .is_empty()
        );
        let mut gone = d.unmapped(3, std::time::Duration::ZERO, std::time::Instant::now());
        gone.sort_by_key(|(id, _)| *id);
        // Sorted as `gone` is: the files' inode numbers need not follow their creation.
        let mut want = vec![
            (ids[0], Verdict::Attached),
            (ids[1], Verdict::Skipped(NOT_A_DRIVER)),
        ];
        want.sort_by_key(|(id, _)| *id);
        assert_eq!(gone, want);
        assert!(d.skipped().is_empty());
        assert!(
            d.unmapped(1, std::time::Duration::ZERO, std::time::Instant::now())
                .is_empty(),
            "the host's library stays"
        );
        assert!(d.known.contains_key(&host_id));
    }

    /// A tenant's process mapping many driver-named files: a few are considered per scan, the
    /// rest beyond the per-process bound counted as skipped mappings.
    #[test]
    fn new_files_are_considered_a_few_per_tenant_per_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().join("proc");
        let names: Vec<String> = (0..20).map(|i| format!("libcuda.so.{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        fake_process(tmp.path(), &proc, 10, &names);
        let host = HostPaths {
            proc,
            ..HostPaths::system()
        };
        let mut d = Discovery::new();
        let mut considered = 0;
        for _ in 0..3 {
            let scan = d.scan_processes(&host);
            assert!(scan.new.len() <= NEW_PER_TENANT_PER_SCAN);
            for lib in &scan.new {
                d.decide(lib, Verdict::Skipped(NOT_A_DRIVER));
            }
            considered += scan.new.len();
        }
        assert_eq!(considered, maps_scan::MAX_CANDIDATES_PER_KIND);
        let skipped = d.skipped();
        let reasons = skipped.values().next().unwrap();
        assert_eq!(reasons[MAPPINGS], 12);
        assert_eq!(reasons[NOT_A_DRIVER], 8);
    }
}
