//! Reading every region within the snapshot's deadline. Everything that touches a tenant's files
//! (reading a GPU process's maps and opening what it maps through `/proc/<pid>/map_files`,
//! listing and opening the files of the configured directories, sniffing them, then reading each
//! region) runs as a job on a small pool of worker threads ([`crate::pool::Pool`]), one job at a
//! time per directory, per process and per region file. Every file is opened through
//! `tenant_fs` ([`regions::dir_candidates`], [`regions::process_candidates`]) and read
//! from that open file.
//!
//! The collector waits for the jobs until the deadline and goes on without the ones still
//! running: a file that blocks (a FUSE file in the tenant's mount namespace, a process holding
//! its memory map's lock) holds one worker, never the snapshot, and is shown as `blocked` until
//! its read returns. Each region is read within a [`ReadBudget`]; what it leaves unread is named
//! in the snapshot.
//!
//! Regions found over budget or blocked last time are read after the others, so a hostile
//! tenant's regions never take the deadline of another's.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc,
        mpsc::{self, Receiver, Sender},
    },
    time::Instant,
};

use region::{
    hami::HamiReader,
    reader::{ReadBudget, RegionReader},
};
use tenant_fs::{FileKey, TenantFile};

use super::regions::{
    self, Candidate, ControlFile, ControlRead, Format, ListingCut, RegionRead, RegionReading,
};
use crate::pool::Pool;

/// Worker threads at most. A blocked read holds one until it returns; past this many, jobs wait
/// in the queue (each directory, process and file has one job at most).
const MAX_WORKERS: usize = 16;

enum Reader {
    Vgpu(RegionReader),
    Hami(HamiReader),
}

/// Where region files are found: a configured directory (by its index), or a GPU process's maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Listing {
    Dir(usize),
    Process(u32),
}

/// What a job reports.
enum Done {
    /// The region files a listing found, opened and sniffed, and the parts of a region
    /// directory it did not look at whole.
    Listed(Listing, Vec<Candidate>, Vec<ListingCut>),
    /// A region file's read with its control block's, and its reader to keep.
    File(FileKey, Option<Reader>, RegionRead, ControlRead),
}

/// A listing: the region files it found at its last completed run, and since when a job runs it.
#[derive(Default)]
struct ListingState {
    found: Vec<Candidate>,
    cuts: Vec<ListingCut>,
    /// A run of it has completed: `found` is what it found.
    listed: bool,
    busy_since: Option<Instant>,
}

/// A region file: its reader while no job holds it, and since when a job holds it.
#[derive(Default)]
struct FileState {
    reader: Option<Reader>,
    busy_since: Option<Instant>,
    /// Its last read ran out of budget or did not return in time.
    troubled: bool,
}

/// What a file job reads from: the reader kept from an earlier read, or the checked file (with
/// its sniffed format) to build one from.
enum ReadFrom {
    Reader(Reader),
    File(TenantFile, Format),
}

/// How a job reads one region ([`read_region`]; tests make it block).
type ReadFn =
    Arc<dyn Fn(&Path, ReadFrom, &ReadBudget) -> (Option<Reader>, RegionRead) + Send + Sync>;

/// How a job lists the regions a process maps ([`regions::process_candidates`]; tests make it
/// block).
type ListFn = Arc<dyn Fn(&Path, u32) -> (Vec<Candidate>, Vec<ListingCut>) + Send + Sync>;

/// What one scan found.
pub struct ScanResult {
    /// Each region once (by identity), in the order found.
    pub regions: Vec<RegionReading>,
    /// Listings that have not returned since an earlier scan: their regions are the ones they
    /// found last.
    pub warnings: Vec<String>,
    /// Parts of the region directories, and processes' maps, not looked at whole (at their
    /// last listing).
    pub cuts: Vec<ListingCut>,
    /// The processes whose maps have been listed (their regions are in
    /// [`RegionReading::mapped_by`] when they map any).
    pub listed: HashSet<u32>,
}

pub struct RegionScan {
    read: ReadFn,
    list_process: ListFn,
    dirs: Vec<PathBuf>,
    proc: PathBuf,
    budget: ReadBudget,
    pool: Pool,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
    listings: HashMap<Listing, ListingState>,
    files: HashMap<FileKey, FileState>,
    /// Reads that came back and were not shown yet (a read that outlasts a scan is shown by the
    /// next one), each with its control block's.
    reads: HashMap<FileKey, (RegionRead, ControlRead)>,
}

impl RegionScan {
    pub fn new(dirs: Vec<PathBuf>, proc: &Path) -> RegionScan {
        let (done_tx, done_rx) = mpsc::channel();
        RegionScan {
            read: Arc::new(read_region),
            list_process: Arc::new(regions::process_candidates),
            dirs,
            proc: proc.to_owned(),
            budget: ReadBudget::DEFAULT,
            pool: Pool::new("region-reader", MAX_WORKERS),
            done_tx,
            done_rx,
            listings: HashMap::new(),
            files: HashMap::new(),
            reads: HashMap::new(),
        }
    }

    /// Each region's read budget.
    pub fn set_budget(&mut self, budget: ReadBudget) {
        self.budget = budget;
    }

    /// Reads the regions of the configured directories and those that `pids` map, until
    /// `deadline`: each region once (by identity), in the order found.
    pub fn scan(&mut self, pids: &[u32], deadline: Instant) -> ScanResult {
        let started = Instant::now();
        // Reports of jobs that outlasted an earlier scan: their listings and files are free.
        while let Ok(done) = self.done_rx.try_recv() {
            self.take(done);
        }
        // Listings first: they name the files. Half the time is theirs at most.
        let listings_deadline = started + deadline.saturating_duration_since(started) / 2;
        let wanted: Vec<Listing> = (0..self.dirs.len())
            .map(Listing::Dir)
            .chain(pids.iter().map(|&pid| Listing::Process(pid)))
            .collect();
        // A process gone with its listing still running keeps its entry until the job returns
        // (one job per listing at a time).
        self.listings
            .retain(|l, s| s.busy_since.is_some() || wanted.contains(l));
        self.start_listings(&wanted);
        self.wait(listings_deadline, |s| {
            wanted
                .iter()
                .all(|l| s.listings.get(l).is_none_or(|st| st.busy_since.is_none()))
        });

        let warnings = self.late_listings(&wanted, started);

        // The candidates, each file once (a process's uid joined to a directory's find), the
        // troubled ones last.
        let (mut candidates, index) = candidates(&self.listings, &wanted);
        let mut mapped_by = mapped_by(&self.listings, &wanted);
        let files = &mut self.files;
        candidates.sort_by_key(|(c, _)| files.get(&c.file.key()).is_some_and(|f| f.troubled));
        files.retain(|key, f| index.contains_key(key) || f.busy_since.is_some());

        let mut asked = Vec::new();
        for (c, _) in &candidates {
            let key = c.file.key();
            let state = files.entry(key).or_default();
            if state.busy_since.is_some() {
                continue;
            }
            let from = match state.reader.take() {
                Some(r) => ReadFrom::Reader(r),
                None => match c.file.try_clone() {
                    Ok(f) => ReadFrom::File(f, c.format),
                    Err(e) => {
                        let failed = RegionRead::Failed(c.format, e.to_string());
                        self.reads.insert(key, (failed, ControlRead::Absent));
                        continue;
                    }
                },
            };
            // The control block is read on the worker too: a tenant's file may block.
            let control = match &c.control {
                ControlFile::Absent => Ok(None),
                ControlFile::Opened(f) => f.try_clone().map(Some).map_err(|e| e.to_string()),
                ControlFile::Refused(why) => Err(why.clone()),
            };
            state.busy_since = Some(Instant::now());
            let (path, budget, tx) = (c.path.clone(), self.budget, self.done_tx.clone());
            let read_region = Arc::clone(&self.read);
            self.pool.run(move || {
                let control = match control {
                    Ok(None) => ControlRead::Absent,
                    Ok(Some(f)) => regions::read_mark(&f),
                    Err(why) => ControlRead::Failed(why),
                };
                let (reader, read) = read_region(&path, from, &budget);
                let _ = tx.send(Done::File(key, reader, read, control));
            });
            asked.push(key);
        }
        let found: Vec<(PathBuf, Format, FileKey, Option<String>)> = candidates
            .iter()
            .map(|(c, uid)| {
                let writable = regions::writable_by_others(c.file.mode(), c.file.uid(), *uid);
                (c.path.clone(), c.format, c.file.key(), writable)
            })
            .collect();
        self.wait_files(deadline, &asked);

        let regions = self.readings(found, &mut mapped_by);
        self.reads.clear();
        let cuts = wanted
            .iter()
            .filter_map(|l| self.listings.get(l))
            .flat_map(|s| s.cuts.iter().cloned())
            .collect();
        let listed = self.listed(&wanted);
        ScanResult {
            regions,
            warnings,
            cuts,
            listed,
        }
    }

    /// Starts a job for each listing in `wanted` that none runs.
    fn start_listings(&mut self, wanted: &[Listing]) {
        for &listing in wanted {
            let state = self.listings.entry(listing).or_default();
            if state.busy_since.is_some() {
                continue;
            }
            state.busy_since = Some(Instant::now());
            let tx = self.done_tx.clone();
            match listing {
                Listing::Dir(i) => {
                    let dir = self.dirs[i].clone();
                    self.pool.run(move || {
                        let (found, cuts) = regions::dir_candidates(&dir);
                        let _ = tx.send(Done::Listed(listing, found, cuts));
                    });
                }
                Listing::Process(pid) => {
                    let (proc, list) = (self.proc.clone(), Arc::clone(&self.list_process));
                    self.pool.run(move || {
                        let (found, cuts) = list(&proc, pid);
                        let _ = tx.send(Done::Listed(listing, found, cuts));
                    });
                }
            }
        }
    }

    /// A warning for each listing of `wanted` whose job has run since before this scan
    /// `started`.
    fn late_listings(&self, wanted: &[Listing], started: Instant) -> Vec<String> {
        let mut warnings = Vec::new();
        for l in wanted {
            let Some(since) = self.listings.get(l).and_then(|s| s.busy_since) else {
                continue;
            };
            if since < started {
                let what = match l {
                    Listing::Dir(i) => format!("region directory {}", self.dirs[*i].display()),
                    Listing::Process(pid) => format!("the files process {pid} maps"),
                };
                warnings.push(format!(
                    "finding regions in {what} has not returned for {:.1}s (a file there blocks): \
                     showing the regions it found last",
                    since.elapsed().as_secs_f64()
                ));
            }
        }
        warnings
    }

    /// What each file `found` (path, format, identity, who else may write it) read: its read
    /// that came back, `blocked` while its job runs; a file with neither is left out.
    fn readings(
        &mut self,
        found: Vec<(PathBuf, Format, FileKey, Option<String>)>,
        mapped_by: &mut HashMap<FileKey, Vec<u32>>,
    ) -> Vec<RegionReading> {
        let mut out = Vec::with_capacity(found.len());
        for (path, format, key, writable_by_others) in found {
            let state = self.files.entry(key).or_default();
            let (read, control) = match (self.reads.remove(&key), state.busy_since) {
                (Some((read, control)), _) => {
                    state.troubled = matches!(&read, RegionRead::Vgpu(s) if s.unread.is_some());
                    (read, control)
                }
                (None, Some(since)) => {
                    state.troubled = true;
                    let blocked = RegionRead::Blocked {
                        format,
                        seconds: since.elapsed().as_secs_f64(),
                    };
                    (blocked, ControlRead::Absent)
                }
                (None, None) => continue,
            };
            let mut mapped_by = mapped_by.remove(&key).unwrap_or_default();
            mapped_by.sort_unstable();
            out.push(RegionReading {
                path,
                read,
                control,
                writable_by_others,
                mapped_by,
            });
        }
        out
    }

    /// The processes of `wanted` whose maps a listing has read.
    fn listed(&self, wanted: &[Listing]) -> HashSet<u32> {
        wanted
            .iter()
            .filter_map(|l| match l {
                Listing::Process(pid) if self.listings.get(l).is_some_and(|s| s.listed) => {
                    Some(*pid)
                }
                _ => None,
            })
            .collect()
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
            Done::Listed(listing, found, cuts) => {
                if let Some(state) = self.listings.get_mut(&listing) {
                    *state = ListingState {
                        found,
                        cuts,
                        listed: true,
                        busy_since: None,
                    };
                }
                None
            }
            Done::File(key, reader, read, control) => {
                let state = self.files.entry(key).or_default();
                state.busy_since = None;
                state.reader = reader;
                self.reads.insert(key, (read, control));
                Some(key)
            }
        }
    }
}

/// A region file found, with the uid of a process that maps it (when one does).
type UsedCandidate<'l> = (&'l Candidate, Option<u32>);

/// The region files the listings of `wanted` found, each once (a process's uid joined to a
/// directory's find), and where each is in that list.
fn candidates<'l>(
    listings: &'l HashMap<Listing, ListingState>,
    wanted: &[Listing],
) -> (Vec<UsedCandidate<'l>>, HashMap<FileKey, usize>) {
    let mut candidates: Vec<UsedCandidate<'_>> = Vec::new();
    let mut index: HashMap<FileKey, usize> = HashMap::new();
    for l in wanted {
        let Some(state) = listings.get(l) else {
            continue;
        };
        for c in &state.found {
            match index.get(&c.file.key()) {
                Some(&i) => {
                    if candidates[i].1.is_none() {
                        candidates[i].1 = c.user_uid;
                    }
                }
                None => {
                    index.insert(c.file.key(), candidates.len());
                    candidates.push((c, c.user_uid));
                }
            }
        }
    }
    (candidates, index)
}

/// Which GPU processes map each file (by identity), from their listings: a region's slot counts
/// for a process only if the process is one of them.
fn mapped_by(
    listings: &HashMap<Listing, ListingState>,
    wanted: &[Listing],
) -> HashMap<FileKey, Vec<u32>> {
    let mut mapped_by: HashMap<FileKey, Vec<u32>> = HashMap::new();
    for l in wanted {
        let (Listing::Process(pid), Some(state)) = (l, listings.get(l)) else {
            continue;
        };
        for c in &state.found {
            let pids = mapped_by.entry(c.file.key()).or_default();
            if !pids.contains(pid) {
                pids.push(*pid);
            }
        }
    }
    mapped_by
}

/// A job: builds the region's reader from its checked file when it has none yet, then reads it
/// within `budget`.
fn read_region(path: &Path, from: ReadFrom, budget: &ReadBudget) -> (Option<Reader>, RegionRead) {
    let reader = match from {
        ReadFrom::Reader(r) => r,
        ReadFrom::File(file, format) => {
            let opened = match format {
                Format::Vgpu => RegionReader::from_file(file)
                    .map(Reader::Vgpu)
                    .map_err(|e| e.to_string()),
                Format::Hami => HamiReader::from_file(file)
                    .map(Reader::Hami)
                    .map_err(|e| e.to_string()),
            };
            match opened {
                Ok(r) => r,
                Err(e) => {
                    log::debug!("{}: {e}", path.display());
                    return (None, RegionRead::Failed(format, e));
                }
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
    (Some(reader), read)
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Mutex,
            atomic::{AtomicUsize, Ordering::Relaxed},
        },
        time::Duration,
    };

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
        scan.read = Arc::new(move |path, from, budget| {
            if path.ends_with("blocked.cache") {
                counted.fetch_add(1, Relaxed);
                let _ = gate.lock().unwrap().recv();
            }
            read_region(path, from, budget)
        });
        let names = |reads: &ScanResult| -> Vec<(String, &'static str)> {
            reads
                .regions
                .iter()
                .map(
                    |RegionReading {
                         path: p, read: r, ..
                     }| {
                        let name = p.file_name().unwrap().to_string_lossy().into_owned();
                        let what = match r {
                            RegionRead::Vgpu(_) => "read",
                            RegionRead::Blocked { .. } => "blocked",
                            _ => "other",
                        };
                        (name, what)
                    },
                )
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

    /// Each region's control block is read with it: a freezing or frozen mark is seen, a block
    /// never written or cleared is running, and none is absent. A control block the tenant made
    /// hostile (garbage, too short, a link to a frozen block elsewhere, a FIFO, a directory) is
    /// read as no mark with the reason, never followed or waited on, and its region is still
    /// read.
    #[test]
    fn control_blocks_are_read_with_their_regions_and_hostile_ones_are_not_trusted() {
        use region::FreezeMark;
        use regions::write_mark as mark;
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let config = region::RegionConfig::unlimited(1);
        let names = [
            "frozen",
            "freezing",
            "in-process",
            "thawed",
            "never",
            "none",
            "garbage",
            "short",
            "link",
            "fifo",
            "dir",
        ];
        let _regions: Vec<_> = names
            .iter()
            .map(|n| {
                let sub = dir.path().join(format!("pod_{n}"));
                std::fs::create_dir_all(&sub).unwrap();
                region::Region::open_or_create(&sub.join("r.cache"), &config).unwrap()
            })
            .collect();
        let region = |n: &str| dir.path().join(format!("pod_{n}/r.cache"));
        let ctl = |n: &str| region::control_path(&region(n));
        mark(&region("frozen"), FreezeMark::Frozen);
        mark(&region("freezing"), FreezeMark::Freezing);
        mark(&region("in-process"), FreezeMark::InProcess);
        mark(&region("thawed"), FreezeMark::Frozen);
        mark(&region("thawed"), FreezeMark::Running);
        drop(region::ControlReader::open_or_create(&ctl("never")).unwrap());
        // Garbage with an even generation word (a complete copy that does not validate).
        std::fs::write(ctl("garbage"), [0x5au8; region::control::CONTROL_SIZE]).unwrap();
        std::fs::write(ctl("short"), [0u8; 100]).unwrap();
        let elsewhere = host.path().join("r.cache");
        mark(&elsewhere, FreezeMark::Frozen);
        std::os::unix::fs::symlink(region::control_path(&elsewhere), ctl("link")).unwrap();
        let fifo =
            std::ffi::CString::new(ctl("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        std::fs::create_dir(ctl("dir")).unwrap();

        let mut scan = RegionScan::new(vec![dir.path().to_owned()], Path::new("/proc"));
        let started = Instant::now();
        let result = scan.scan(&[], Instant::now() + Duration::from_secs(30));
        assert!(started.elapsed() < Duration::from_secs(5), "nothing blocks");
        let control = |n: &str| {
            let r = result
                .regions
                .iter()
                .find(|r| r.path == region(n))
                .unwrap_or_else(|| panic!("region {n} read: {:?}", result.regions));
            assert!(matches!(r.read, RegionRead::Vgpu(_)), "{n}: {:?}", r.read);
            r.control.clone()
        };
        assert_eq!(control("frozen"), ControlRead::Mark(FreezeMark::Frozen));
        assert_eq!(control("freezing"), ControlRead::Mark(FreezeMark::Freezing));
        assert_eq!(control("thawed"), ControlRead::Mark(FreezeMark::Running));
        assert_eq!(control("never"), ControlRead::Mark(FreezeMark::Running));
        assert_eq!(control("none"), ControlRead::Absent);
        assert_eq!(
            control("in-process"),
            ControlRead::Mark(FreezeMark::InProcess)
        );
        assert!(control("frozen").frozen() && control("freezing").frozen());
        assert!(control("in-process").frozen() && control("in-process").in_process());
        assert!(!control("frozen").in_process());
        for n in ["thawed", "never", "none"] {
            assert!(!control(n).frozen(), "{n}");
        }
        for (n, why) in [
            ("garbage", "magic"),
            ("short", "shorter"),
            ("link", "symbolic link"),
            ("fifo", "FIFO"),
            ("dir", "not a regular file"),
        ] {
            match control(n) {
                ControlRead::Failed(e) => assert!(e.contains(why), "{n}: {e}"),
                other => panic!("{n}: {other:?}"),
            }
        }
    }

    /// Finding the regions a process maps that blocks (its maps, or a file it maps, do not
    /// return) holds a worker, not the scan: the configured directory's region is read at each
    /// scan, the scan after the first says which process's listing is late, and once the
    /// listing returns its regions are read.
    #[test]
    fn a_listing_that_blocks_holds_a_worker_not_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let mapped = tempfile::tempdir().unwrap();
        let config = region::RegionConfig::unlimited(1);
        let (_a, _) =
            region::Region::open_or_create(&dir.path().join("dir.cache"), &config).unwrap();
        let (_b, _) =
            region::Region::open_or_create(&mapped.path().join("mapped.cache"), &config).unwrap();
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let mapped_dir = mapped.path().to_owned();
        let mut scan = RegionScan::new(vec![dir.path().to_owned()], Path::new("/proc"));
        scan.list_process = Arc::new(move |_, pid| {
            assert_eq!(pid, 4242);
            let _ = gate.lock().unwrap().recv();
            regions::dir_candidates(&mapped_dir)
        });
        let names = |r: &ScanResult| -> Vec<String> {
            let mut v: Vec<String> = r
                .regions
                .iter()
                .filter(|r| matches!(r.read, RegionRead::Vgpu(_)))
                .map(|r| r.path.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let soon = || Instant::now() + Duration::from_millis(500);
        let first = scan.scan(&[4242], soon());
        assert_eq!(names(&first), ["dir.cache"]);
        let second = scan.scan(&[4242], soon());
        assert_eq!(names(&second), ["dir.cache"]);
        assert!(
            second.warnings.len() == 1 && second.warnings[0].contains("process 4242"),
            "{:?}",
            second.warnings
        );
        release.send(()).unwrap();
        release.send(()).unwrap();
        let both = (0..100).any(|_| {
            let r = scan.scan(&[4242], Instant::now() + Duration::from_secs(30));
            names(&r) == ["dir.cache", "mapped.cache"] && r.warnings.is_empty() || {
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        });
        assert!(both, "the process's region was never read");
    }
}
