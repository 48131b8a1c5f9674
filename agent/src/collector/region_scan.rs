//! Reading every region within the snapshot's deadline. Everything that touches a tenant's files
//! (reading a GPU process's maps and `stat`ing what it maps through `/proc/<pid>/root`, then
//! sniffing, opening and reading each region) runs as a job on a small pool of worker threads
//! ([`Pool`]), one job at a time per process and per region file. The collector waits for the
//! jobs until the deadline and goes on without the ones still running: a file that blocks (a
//! FUSE file in the tenant's mount namespace, a process holding its memory map's lock) holds one
//! worker, never the snapshot, and is shown as `blocked` until its read returns. Each region is
//! read within a [`ReadBudget`]; what it leaves unread is named in the snapshot.
//!
//! Regions found over budget or blocked last time are read after the others, so a hostile
//! tenant's regions never take the deadline of another's.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::Relaxed},
        mpsc::{self, Receiver, Sender},
    },
    time::Instant,
};

use region::{
    hami::HamiReader,
    reader::{ReadBudget, RegionReader},
};

use super::regions::{self, Format, RegionRead};

/// Worker threads at most. A blocked read holds one until it returns; past this many, jobs wait
/// in the queue (each process and file has one job at most).
const MAX_WORKERS: usize = 16;
/// Files taken from the configured region directories at most (they are writable by tenants).
const MAX_DIR_FILES: usize = 4096;

type FileKey = (u64, u64);

enum Reader {
    Vgpu(RegionReader),
    Hami(HamiReader),
}

/// What a job reports.
enum Done {
    /// The shared files process `pid` maps, with their identities.
    Maps(u32, Vec<(PathBuf, FileKey)>),
    /// A region file's read, and its reader to keep.
    File(FileKey, Option<Reader>, Option<RegionRead>),
}

/// A region file: its reader while no job holds it, and since when a job holds it.
#[derive(Default)]
struct FileState {
    reader: Option<Reader>,
    busy_since: Option<Instant>,
    format: Option<Format>,
    /// Its last read ran out of budget or did not return in time.
    troubled: bool,
}

type Job = Box<dyn FnOnce() + Send>;

/// A small pool of worker threads that grows (to [`MAX_WORKERS`]) when every idle worker has a
/// job waiting for it already.
struct Pool {
    tx: Sender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    /// Workers waiting for a job.
    idle: Arc<AtomicUsize>,
    /// Jobs sent and not taken yet.
    queued: Arc<AtomicUsize>,
    threads: usize,
}

impl Pool {
    fn new() -> Pool {
        let (tx, rx) = mpsc::channel();
        Pool {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            queued: Arc::new(AtomicUsize::new(0)),
            threads: 0,
        }
    }

    fn run(&mut self, job: impl FnOnce() + Send + 'static) {
        // Relaxed: the counts only decide whether to start a worker; a race starts one too many.
        if self.idle.load(Relaxed) <= self.queued.load(Relaxed) && self.threads < MAX_WORKERS {
            let (rx, idle, queued) = (
                Arc::clone(&self.rx),
                Arc::clone(&self.idle),
                Arc::clone(&self.queued),
            );
            let spawned = std::thread::Builder::new()
                .name("region-reader".into())
                .spawn(move || {
                    loop {
                        idle.fetch_add(1, Relaxed);
                        let job = rx
                            .lock()
                            .map_err(|_| ())
                            .and_then(|r| r.recv().map_err(|_| ()));
                        idle.fetch_sub(1, Relaxed);
                        match job {
                            Ok(job) => {
                                queued.fetch_sub(1, Relaxed);
                                job()
                            }
                            Err(()) => return,
                        }
                    }
                });
            match spawned {
                Ok(_) => self.threads += 1,
                Err(e) => log::warn!("starting a region reader thread: {e}"),
            }
        }
        self.queued.fetch_add(1, Relaxed);
        // The workers hold the receiver for as long as the pool lives.
        let _ = self.tx.send(Box::new(job));
    }
}

/// How a job reads one file ([`read_file`]; tests make it block).
type ReadFn = Arc<
    dyn Fn(&Path, Option<Reader>, &ReadBudget) -> (Option<Reader>, Option<RegionRead>)
        + Send
        + Sync,
>;

pub struct RegionScan {
    read: ReadFn,
    dirs: Vec<PathBuf>,
    proc: PathBuf,
    budget: ReadBudget,
    pool: Pool,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
    files: HashMap<FileKey, FileState>,
    /// Reads that came back and were not shown yet (a read that outlasts a scan is shown by the
    /// next one).
    reads: HashMap<FileKey, RegionRead>,
    /// Per GPU process: the shared files its maps named at its last completed read, and whether
    /// a job is reading them now.
    mapped: HashMap<u32, (Vec<(PathBuf, FileKey)>, bool)>,
}

impl RegionScan {
    pub fn new(dirs: Vec<PathBuf>, proc: &Path) -> RegionScan {
        let (done_tx, done_rx) = mpsc::channel();
        RegionScan {
            read: Arc::new(read_file),
            dirs,
            proc: proc.to_owned(),
            budget: ReadBudget::DEFAULT,
            pool: Pool::new(),
            done_tx,
            done_rx,
            files: HashMap::new(),
            reads: HashMap::new(),
            mapped: HashMap::new(),
        }
    }

    /// Each region's read budget.
    pub fn set_budget(&mut self, budget: ReadBudget) {
        self.budget = budget;
    }

    /// Reads the regions of the configured directories and those that `pids` map, until
    /// `deadline`: each region once (by identity), in the order found.
    pub fn scan(&mut self, pids: &[u32], deadline: Instant) -> Vec<(PathBuf, RegionRead)> {
        let started = Instant::now();
        // Reports of jobs that outlasted an earlier scan: their files are free again.
        while let Ok(done) = self.done_rx.try_recv() {
            self.take(done);
        }
        // Maps first: they name the files. Half the time is theirs at most.
        let maps_deadline = started + deadline.saturating_duration_since(started) / 2;
        // A process gone with its maps still being read keeps its entry until the read returns
        // (one job per process at a time).
        self.mapped
            .retain(|pid, (_, busy)| *busy || pids.contains(pid));
        for &pid in pids {
            let entry = self
                .mapped
                .entry(pid)
                .or_insert_with(|| (Vec::new(), false));
            if entry.1 {
                continue;
            }
            entry.1 = true;
            let (proc, tx) = (self.proc.clone(), self.done_tx.clone());
            self.pool.run(move || {
                let files = regions::mapped_files(&proc, pid)
                    .into_iter()
                    .filter_map(|p| {
                        let m = std::fs::metadata(&p).ok().filter(|m| m.is_file())?;
                        Some((p, (m.dev(), m.ino())))
                    })
                    .collect();
                let _ = tx.send(Done::Maps(pid, files));
            });
        }
        self.wait(maps_deadline, |s| {
            pids.iter()
                .all(|pid| s.mapped.get(pid).is_none_or(|(_, busy)| !busy))
        });

        // The candidates, each file once, the troubled ones last.
        let mut candidates = dir_files(&self.dirs);
        for &pid in pids {
            if let Some((files, _)) = self.mapped.get(&pid) {
                candidates.extend(files.iter().cloned());
            }
        }
        let mut seen = HashSet::new();
        candidates.retain(|(_, key)| seen.insert(*key));
        candidates.sort_by_key(|(_, key)| self.files.get(key).is_some_and(|f| f.troubled));
        self.files
            .retain(|key, f| seen.contains(key) || f.busy_since.is_some());

        let mut asked = Vec::new();
        for (path, key) in &candidates {
            let state = self.files.entry(*key).or_default();
            if state.busy_since.is_some() {
                continue;
            }
            state.busy_since = Some(Instant::now());
            let reader = state.reader.take();
            let (path, key, budget, tx) = (path.clone(), *key, self.budget, self.done_tx.clone());
            let read_file = Arc::clone(&self.read);
            self.pool.run(move || {
                let (reader, read) = read_file(&path, reader, &budget);
                let _ = tx.send(Done::File(key, reader, read));
            });
            asked.push(key);
        }
        self.wait_files(deadline, &asked);

        let mut out = Vec::with_capacity(candidates.len());
        for (path, key) in candidates {
            let state = self.files.entry(key).or_default();
            let read = match (self.reads.remove(&key), state.busy_since) {
                (Some(read), _) => {
                    state.troubled = matches!(&read, RegionRead::Vgpu(s) if s.unread.is_some());
                    read
                }
                (None, Some(since)) => {
                    state.troubled = true;
                    RegionRead::Blocked {
                        format: state.format,
                        seconds: since.elapsed().as_secs_f64(),
                    }
                }
                // Not a region (its sniff found nothing): not shown.
                (None, None) => continue,
            };
            out.push((path, read));
        }
        self.reads.clear();
        out
    }

    /// Takes the jobs' reports until `finished` holds or `deadline` passes.
    fn wait(&mut self, deadline: Instant, finished: impl Fn(&RegionScan) -> bool) {
        while !finished(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done_rx.recv_timeout(left) {
                Ok(done) => {
                    self.take(done);
                }
                Err(_) => return,
            }
        }
    }

    /// As [`RegionScan::wait`], until the file jobs in `asked` have reported.
    fn wait_files(&mut self, deadline: Instant, asked: &[FileKey]) {
        let mut left: HashSet<FileKey> = asked.iter().copied().collect();
        while !left.is_empty() {
            let time = deadline.saturating_duration_since(Instant::now());
            let Ok(done) = self.done_rx.recv_timeout(time) else {
                return;
            };
            if let Some(key) = self.take(done) {
                left.remove(&key);
            }
        }
    }

    /// Files a job's report (a file's read goes to [`RegionScan::reads`]); returns a file
    /// job's key.
    fn take(&mut self, done: Done) -> Option<FileKey> {
        match done {
            Done::Maps(pid, files) => {
                if let Some(entry) = self.mapped.get_mut(&pid) {
                    *entry = (files, false);
                }
                None
            }
            Done::File(key, reader, read) => {
                let state = self.files.entry(key).or_default();
                state.busy_since = None;
                state.format = match &read {
                    Some(RegionRead::Vgpu(_)) => Some(Format::Vgpu),
                    Some(RegionRead::Hami(_)) => Some(Format::Hami),
                    Some(RegionRead::Failed(f, _)) => Some(*f),
                    Some(RegionRead::Blocked { format, .. }) => *format,
                    None => None,
                };
                state.reader = reader;
                if let Some(read) = read {
                    self.reads.insert(key, read);
                }
                Some(key)
            }
        }
    }
}

/// Regular files under the configured directories (not following links), with their identities.
fn dir_files(dirs: &[PathBuf]) -> Vec<(PathBuf, FileKey)> {
    let mut files = Vec::new();
    for d in dirs {
        regions::files_under(d, regions::MAX_DEPTH, &mut files);
    }
    if files.len() > MAX_DIR_FILES {
        log::warn!(
            "{} files in the region directories: reading the first {MAX_DIR_FILES}",
            files.len()
        );
        files.truncate(MAX_DIR_FILES);
    }
    files
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::symlink_metadata(&p).ok().filter(|m| m.is_file())?;
            Some((p, (m.dev(), m.ino())))
        })
        .collect()
}

/// A job: sniffs the file (when it has no reader yet), opens it, reads it within `budget`.
/// `None` as the read: not a region.
fn read_file(
    path: &Path,
    reader: Option<Reader>,
    budget: &ReadBudget,
) -> (Option<Reader>, Option<RegionRead>) {
    let reader = match reader {
        Some(r) => r,
        None => {
            let Some(format) = regions::sniff(path) else {
                return (None, None);
            };
            let opened = match format {
                Format::Vgpu => RegionReader::open(path)
                    .map(Reader::Vgpu)
                    .map_err(|e| e.to_string()),
                Format::Hami => HamiReader::open(path)
                    .map(Reader::Hami)
                    .map_err(|e| e.to_string()),
            };
            match opened {
                Ok(r) => r,
                Err(e) => return (None, Some(RegionRead::Failed(format, e))),
            }
        }
    };
    let read = match &reader {
        Reader::Vgpu(r) => r
            .snapshot_within(budget)
            .map(|s| RegionRead::Vgpu(Box::new(s)))
            .unwrap_or_else(|e| RegionRead::Failed(Format::Vgpu, e.to_string())),
        Reader::Hami(r) => r
            .snapshot()
            .map(|s| RegionRead::Hami(Box::new(s)))
            .unwrap_or_else(|e| RegionRead::Failed(Format::Hami, e.to_string())),
    };
    (Some(reader), Some(read))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A region file whose read blocks (a FUSE file, say) holds a worker, not the scan: the scan
    /// ends at its deadline with the other region read and the blocked one named, does not start
    /// a second read of it while the first runs, reads it last, and reads it again once the
    /// first read returns.
    #[test]
    fn a_read_that_blocks_holds_a_worker_not_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("pod_ctr");
        std::fs::create_dir_all(&sub).unwrap();
        let config = region::RegionConfig::unlimited(1);
        let (_a, _) = region::Region::open_or_create(&sub.join("blocked.cache"), &config).unwrap();
        let (_b, _) = region::Region::open_or_create(&sub.join("fine.cache"), &config).unwrap();
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let mut scan = RegionScan::new(vec![dir.path().to_owned()], Path::new("/proc"));
        scan.read = Arc::new(move |path, reader, budget| {
            if path.ends_with("blocked.cache") {
                counted.fetch_add(1, Relaxed);
                let _ = gate.lock().unwrap().recv();
            }
            read_file(path, reader, budget)
        });
        let names = |reads: &[(PathBuf, RegionRead)]| -> Vec<(String, &'static str)> {
            reads
                .iter()
                .map(|(p, r)| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    let what = match r {
                        RegionRead::Vgpu(_) => "read",
                        RegionRead::Blocked { .. } => "blocked",
                        _ => "other",
                    };
                    (name, what)
                })
                .collect()
        };
        let soon = || Instant::now() + Duration::from_secs(2);
        let first = scan.scan(&[], soon());
        let mut got = names(&first);
        got.sort();
        assert_eq!(
            got,
            [
                ("blocked.cache".into(), "blocked"),
                ("fine.cache".into(), "read")
            ]
        );
        let second = scan.scan(&[], soon());
        assert_eq!(
            names(&second),
            [
                ("fine.cache".into(), "read"),
                ("blocked.cache".into(), "blocked")
            ],
            "the blocked region comes last"
        );
        assert_eq!(reads.load(Relaxed), 1, "one read of it at a time");
        // Its read returns: a later scan reads it again (the gate is open for that read too).
        release.send(()).unwrap();
        release.send(()).unwrap();
        let both_read = (0..100).any(|_| {
            let mut got = names(&scan.scan(&[], Instant::now() + Duration::from_secs(30)));
            got.sort();
            let read = [
                ("blocked.cache".into(), "read"),
                ("fine.cache".into(), "read"),
            ];
            got == read || {
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        });
        assert!(both_read, "the region was never read again");
    }
}
