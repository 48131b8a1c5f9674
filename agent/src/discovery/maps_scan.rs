//! Reading processes' maps incrementally, within a budget, and off the collector's thread.
//!
//! A process's maps are read when it is new, again soon after its address space changed (its
//! virtual size in `/proc/<pid>/statm`, which the kernel reports without taking the process's
//! memory-map lock, moved) and otherwise on a slow cadence that grows with the size of its maps.
//! Each cycle reads within a byte and a time budget: new processes first, then changed ones,
//! then those due, taking turns between tenants (processes grouped by their container, from
//! `/proc/<pid>/cgroup`) and giving each tenant a share of the bytes, so that a tenant whose
//! processes have 65,000 mappings each cannot keep another tenant's new process from being read.
//!
//! The cycle runs on a thread of its own ([`Worker`]); the collector waits for it a short while
//! and otherwise takes its results at a later poll, so a slow cycle delays discovery, never a
//! snapshot. The cycle does not read maps itself either: each process's read is a job on a small
//! pool ([`crate::pool::Pool`]) that the cycle waits for until [`Budget::read_wait`]. A read that
//! blocks (a tenant's thread stuck in a page fault on a FUSE or userfaultfd mapping holds its
//! process's memory-map lock, and reading its maps waits for that lock) holds one worker and goes
//! on in the background: the cycle goes on with the other processes, the process is shown as
//! blocked and not read again until its job returns (its result is taken by the next cycle), and a
//! tenant has at most [`MAX_READS_PER_TENANT`] such jobs, so its blocked processes cannot take
//! the pool from other tenants.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc,
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    time::{Duration, Instant},
};

use super::library::{FileId, LibraryKind};
use crate::{
    identity::container::{ContainerIdentity, ContainerKey},
    pool::Pool,
};

/// Bytes of maps one cycle reads at most (the read that crosses it finishes).
pub const CYCLE_BYTES: u64 = 32 << 20;
/// Time one cycle reads maps for at most (the read that crosses it finishes).
pub const CYCLE_TIME: Duration = Duration::from_millis(250);
/// A tenant's share of a cycle's bytes is at least this much.
pub const MIN_TENANT_SHARE: u64 = 1 << 20;
/// Driver-named mappings of one kind considered per process; the rest are counted.
pub const MAX_CANDIDATES_PER_KIND: usize = 8;
/// Bytes of `/proc/<pid>/cgroup` read at most.
const MAX_CGROUP_BYTES: u64 = 16 << 10;
/// How long a cycle waits for one process's maps before it goes on without them (the read goes
/// on in the background and is taken by a later cycle, so a read that is only slow loses
/// nothing).
pub const READ_WAIT: Duration = Duration::from_millis(100);
/// Worker threads reading maps at most. With [`MAX_READS_PER_TENANT`] at 2, it takes 8 tenants
/// whose reads all block to hold every worker; the other tenants' reads then wait (counted
/// deferred) until one returns.
pub const MAX_READERS: usize = 16;
/// A tenant's maps reads that may run at once (those that did not return within
/// [`READ_WAIT`] included): past it, the tenant's other processes wait for a later cycle.
pub const MAX_READS_PER_TENANT: usize = 2;

/// A driver-named mapping a process has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub kind: LibraryKind,
    pub id: FileId,
    pub start: u64,
    pub end: u64,
    pub path: PathBuf,
}

/// One process's maps, as read.
#[derive(Clone, Debug)]
pub struct ProcessMaps {
    pub pid: u32,
    pub tenant: Arc<str>,
    pub candidates: Vec<Candidate>,
    /// Driver-named mappings past [`MAX_CANDIDATES_PER_KIND`], not considered.
    pub over_cap: u64,
}

/// A process whose maps read has not returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub pid: u32,
    pub tenant: Arc<str>,
    /// Since when its read runs.
    pub since: Instant,
}

/// What one cycle found.
#[derive(Debug, Default)]
pub struct Cycle {
    /// Every process listed (those not listed exited).
    pub listed: Vec<u32>,
    /// Maps read in this cycle, and those whose read outlasted an earlier cycle and came back.
    pub read: Vec<ProcessMaps>,
    pub unreadable: usize,
    pub bytes: u64,
    /// Processes due that the budget (bytes, time, the pool, the tenant's reads running) left
    /// for a later cycle, by tenant.
    pub deferred: BTreeMap<Arc<str>, usize>,
    /// Processes whose maps read has not returned.
    pub blocked: Vec<Blocked>,
    pub took: Duration,
}

/// What became of one process's read in a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Read: its maps' bytes.
    Read(u64),
    /// Could not be read (it exited, or its maps are not readable).
    Unreadable,
    /// Its read did not return in time: it goes on in the background.
    Running,
    /// No worker was free to read it: left for a later cycle.
    NoRoom,
}

/// Why a process is read, in the order they are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    New,
    Changed,
    Due,
}

#[derive(Debug)]
struct ProcState {
    tenant: Arc<str>,
    /// Bytes of maps at the last read (`None`: never read).
    bytes: Option<u64>,
    last_read: Option<Instant>,
    /// Virtual size at the last read, and now.
    vsize_at_read: Option<u64>,
    vsize: Option<u64>,
    /// Since when a read of its maps runs that did not return within its cycle.
    reading_since: Option<Instant>,
}

impl ProcState {
    fn class(&self, now: Instant) -> Option<Class> {
        if self.reading_since.is_some() {
            return None;
        }
        let (Some(bytes), Some(last)) = (self.bytes, self.last_read) else {
            return Some(Class::New);
        };
        let since = now.saturating_duration_since(last);
        if self.vsize != self.vsize_at_read && since >= changed_after(bytes) {
            return Some(Class::Changed);
        }
        (since >= reread_after(bytes)).then_some(Class::Due)
    }
}

/// How soon a process whose address space changed is read again: its maps' bytes at 1 MiB/s,
/// 250 ms to 10 s.
pub fn changed_after(bytes: u64) -> Duration {
    Duration::from_millis(bytes / 1024).clamp(Duration::from_millis(250), Duration::from_secs(10))
}

/// How soon a process whose address space did not change is read again: its maps' bytes at
/// 64 KiB/s, 5 to 60 s.
pub fn reread_after(bytes: u64) -> Duration {
    Duration::from_millis(bytes / 64).clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// Byte and time budget of a cycle, and how long it waits for one process's read.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub bytes: u64,
    pub time: Duration,
    pub read_wait: Duration,
}

impl Budget {
    pub const DEFAULT: Budget = Budget {
        bytes: CYCLE_BYTES,
        time: CYCLE_TIME,
        read_wait: READ_WAIT,
    };
    /// No byte or time bound (a one-off synchronous scan); a read that blocks is still left
    /// running after a while.
    pub const UNBOUNDED: Budget = Budget {
        bytes: u64::MAX,
        time: Duration::MAX,
        read_wait: Duration::from_secs(2),
    };
}

/// Which processes to read and when (see the module docs). Pure: the reading is passed in.
#[derive(Debug, Default)]
pub struct Scheduler {
    procs: HashMap<u32, ProcState>,
    /// Which tenant takes the first turn, rotated each cycle.
    rotate: usize,
}

impl Scheduler {
    /// Updates the process list: forgets those not listed, adds new ones with their tenant.
    pub fn refresh(
        &mut self,
        listed: &[u32],
        mut tenant_of: impl FnMut(u32) -> Arc<str>,
        mut vsize_of: impl FnMut(u32) -> Option<u64>,
    ) {
        let live: std::collections::HashSet<u32> = listed.iter().copied().collect();
        // A process gone while its read runs keeps its entry until the job returns, so that a
        // reused pid does not start a second read beside it.
        self.procs
            .retain(|pid, p| live.contains(pid) || p.reading_since.is_some());
        for &pid in listed {
            let vsize = vsize_of(pid);
            let p = self.procs.entry(pid).or_insert_with(|| ProcState {
                tenant: tenant_of(pid),
                bytes: None,
                last_read: None,
                vsize_at_read: None,
                vsize: None,
                reading_since: None,
            });
            p.vsize = vsize;
        }
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// The tenant a known process was listed under.
    pub fn tenant(&self, pid: u32) -> Option<&Arc<str>> {
        self.procs.get(&pid).map(|p| &p.tenant)
    }

    /// Processes whose read has not returned, lowest pid first.
    pub fn blocked(&self) -> Vec<Blocked> {
        let mut out: Vec<Blocked> = self
            .procs
            .iter()
            .filter_map(|(&pid, p)| {
                Some(Blocked {
                    pid,
                    tenant: Arc::clone(&p.tenant),
                    since: p.reading_since?,
                })
            })
            .collect();
        out.sort_by_key(|b| b.pid);
        out
    }

    /// A read that outlasted its cycle returned at `now`: its bytes (`None`: unreadable).
    pub fn finish(&mut self, pid: u32, bytes: Option<u64>, now: Instant) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.reading_since = None;
            p.bytes = Some(bytes.unwrap_or(0));
            p.last_read = Some(now);
            p.vsize_at_read = p.vsize;
        }
    }

    /// Reads what is due within `budget`: `read(pid)` reads one process's maps (see
    /// [`Outcome`]). A tenant with [`MAX_READS_PER_TENANT`] reads running is not given another.
    /// Returns the pids read (or whose read was left running), in order, and how many due were
    /// left for later, by tenant.
    pub fn cycle(
        &mut self,
        now: Instant,
        budget: Budget,
        clock: impl Fn() -> Instant,
        mut read: impl FnMut(u32, &Arc<str>) -> Outcome,
    ) -> (Vec<u32>, BTreeMap<Arc<str>, usize>) {
        // Per class, per tenant, the pids to read (lowest pid first: the oldest, mostly).
        let mut queues: BTreeMap<Class, BTreeMap<Arc<str>, VecDeque<u32>>> = BTreeMap::new();
        let mut pids: Vec<u32> = self.procs.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            let p = &self.procs[&pid];
            if let Some(class) = p.class(now) {
                queues
                    .entry(class)
                    .or_default()
                    .entry(Arc::clone(&p.tenant))
                    .or_default()
                    .push_back(pid);
            }
        }
        let tenants: std::collections::BTreeSet<Arc<str>> =
            queues.values().flat_map(|q| q.keys().cloned()).collect();
        let share = (budget.bytes / tenants.len().max(1) as u64).max(MIN_TENANT_SHARE);
        let mut used: HashMap<Arc<str>, u64> = HashMap::new();
        let mut running: HashMap<Arc<str>, usize> = HashMap::new();
        for p in self.procs.values().filter(|p| p.reading_since.is_some()) {
            *running.entry(Arc::clone(&p.tenant)).or_default() += 1;
        }
        let mut total = 0u64;
        let mut done = Vec::new();
        let started = clock();
        self.rotate = self.rotate.wrapping_add(1);
        let over =
            |total: u64| total >= budget.bytes || clock().duration_since(started) >= budget.time;
        'classes: for queue in queues.values_mut() {
            // Two passes: each tenant within its share, then (work-conserving) whoever has work
            // left, while the budget lasts.
            for within_share in [true, false] {
                loop {
                    let names: Vec<Arc<str>> = queue.keys().cloned().collect();
                    if names.is_empty() {
                        break;
                    }
                    let first = self.rotate % names.len();
                    let mut progressed = false;
                    for i in 0..names.len() {
                        let t = &names[(first + i) % names.len()];
                        if within_share && used.get(t).copied().unwrap_or(0) >= share {
                            continue;
                        }
                        if running.get(t).copied().unwrap_or(0) >= MAX_READS_PER_TENANT {
                            continue;
                        }
                        if over(total) {
                            break 'classes;
                        }
                        let Some(q) = queue.get_mut(t) else { continue };
                        let Some(pid) = q.pop_front() else { continue };
                        if q.is_empty() {
                            queue.remove(t);
                        }
                        let n = match read(pid, t) {
                            Outcome::NoRoom => {
                                // Every worker is busy: nothing more is read this cycle.
                                queue.entry(Arc::clone(t)).or_default().push_front(pid);
                                break 'classes;
                            }
                            Outcome::Running => {
                                if let Some(p) = self.procs.get_mut(&pid) {
                                    p.reading_since = Some(clock());
                                }
                                *running.entry(Arc::clone(t)).or_default() += 1;
                                done.push(pid);
                                progressed = true;
                                continue;
                            }
                            Outcome::Read(n) => n,
                            Outcome::Unreadable => 0,
                        };
                        progressed = true;
                        total = total.saturating_add(n);
                        *used.entry(Arc::clone(t)).or_default() += n;
                        if let Some(p) = self.procs.get_mut(&pid) {
                            p.bytes = Some(n);
                            p.last_read = Some(now);
                            p.vsize_at_read = p.vsize;
                        }
                        done.push(pid);
                    }
                    if !progressed {
                        break;
                    }
                }
            }
        }
        let mut deferred: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        for (t, q) in queues.values().flat_map(|q| q.iter()) {
            *deferred.entry(Arc::clone(t)).or_default() += q.len();
        }
        (done, deferred)
    }
}

/// The tenant a process belongs to: its container's id, or its cgroup path (bounded, read from
/// `/proc/<pid>/cgroup`); `?` when it cannot be read.
pub fn tenant_of(proc: &Path, pid: u32) -> Arc<str> {
    let mut text = String::new();
    let read = tenant_fs::read_proc_lines(
        &proc.join(pid.to_string()).join("cgroup"),
        MAX_CGROUP_BYTES,
        MAX_CGROUP_BYTES as usize,
        |line| {
            text.push_str(&String::from_utf8_lossy(line));
            text.push('\n');
        },
    );
    if read.is_err() {
        return Arc::from("?");
    }
    match ContainerIdentity::from_proc_cgroup(&text).map(|i| i.key()) {
        Some(ContainerKey::Container(id)) => Arc::from(id.as_str()),
        Some(ContainerKey::Cgroup(path)) => Arc::from(path.as_str()),
        None => Arc::from("?"),
    }
}

/// A process's virtual size in pages (`/proc/<pid>/statm`'s first field).
fn vsize_of(proc: &Path, pid: u32) -> Option<u64> {
    let mut first = None;
    tenant_fs::read_proc_lines(
        &proc.join(pid.to_string()).join("statm"),
        256,
        256,
        |line| {
            first = std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok());
        },
    )
    .ok()?;
    first
}

/// The pids in `/proc`.
pub fn list_pids(proc: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .collect()
}

/// The driver-named mappings among a process's maps, at most [`MAX_CANDIDATES_PER_KIND`] of each
/// kind (distinct files); returns them and how many more there were.
pub fn candidates(maps: &[tenant_fs::maps::MappedFile]) -> (Vec<Candidate>, u64) {
    let mut out: Vec<Candidate> = Vec::new();
    let mut over = 0u64;
    for kind in LibraryKind::ALL {
        let mut ids: std::collections::HashSet<FileId> = std::collections::HashSet::new();
        for m in maps {
            let name = m.path.file_name().unwrap_or_default().to_string_lossy();
            if !kind.matches_file_name(&name) {
                continue;
            }
            let id = FileId {
                dev: m.dev,
                inode: m.inode,
            };
            if !ids.insert(id) {
                continue;
            }
            if ids.len() > MAX_CANDIDATES_PER_KIND {
                // Counted once per file, its mapping not kept.
                over += 1;
                continue;
            }
            out.push(Candidate {
                kind,
                id,
                start: m.start,
                end: m.end,
                path: m.path.clone(),
            });
        }
    }
    (out, over)
}

/// One process's maps as a job read them.
#[derive(Clone, Debug)]
pub struct MapsRead {
    pub candidates: Vec<Candidate>,
    pub over_cap: u64,
    pub bytes: u64,
}

/// How a job reads one process's maps ([`read_maps`]; tests make it block). `None`: unreadable.
type ReadFn = Arc<dyn Fn(&Path, u32) -> Option<MapsRead> + Send + Sync>;

/// A job: reads process `pid`'s maps within [`tenant_fs::maps::MAX_MAPS_BYTES`] and keeps its
/// driver-named mappings.
pub fn read_maps(proc: &Path, pid: u32) -> Option<MapsRead> {
    let (maps, r) = tenant_fs::maps::read(proc, pid).ok()?;
    if r.truncated {
        log::debug!(
            "pid {pid}: maps longer than {} bytes; the rest was not read",
            tenant_fs::maps::MAX_MAPS_BYTES
        );
    }
    let (candidates, over_cap) = candidates(&maps);
    Some(MapsRead {
        candidates,
        over_cap,
        bytes: r.bytes,
    })
}

/// The scan of one `/proc`: the schedule, and the pool its reads run on.
pub struct MapsScan {
    proc: PathBuf,
    schedule: Scheduler,
    read: ReadFn,
    pool: Pool,
    done_tx: Sender<(u32, Option<MapsRead>)>,
    done_rx: Receiver<(u32, Option<MapsRead>)>,
}

impl std::fmt::Debug for MapsScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapsScan")
            .field("proc", &self.proc)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

impl MapsScan {
    pub fn new(proc: &Path) -> MapsScan {
        let (done_tx, done_rx) = mpsc::channel();
        MapsScan {
            proc: proc.to_path_buf(),
            schedule: Scheduler::default(),
            read: Arc::new(read_maps),
            pool: Pool::new("maps-reader", MAX_READERS),
            done_tx,
            done_rx,
        }
    }

    pub fn processes(&self) -> usize {
        self.schedule.len()
    }

    /// One cycle within `budget`.
    pub fn cycle(&mut self, budget: Budget) -> Cycle {
        let started = Instant::now();
        // Reads that outlasted an earlier cycle and returned since.
        let mut late: Vec<(u32, Option<MapsRead>)> = self.done_rx.try_iter().collect();
        for (pid, r) in &late {
            self.schedule
                .finish(*pid, r.as_ref().map(|r| r.bytes), started);
        }
        let listed = list_pids(&self.proc);
        let proc = self.proc.clone();
        self.schedule.refresh(
            &listed,
            |pid| tenant_of(&proc, pid),
            |pid| vsize_of(&proc, pid),
        );
        let mut read = Vec::new();
        let mut unreadable = 0;
        let mut bytes = 0;
        let (pool, read_fn, done_tx, done_rx) =
            (&mut self.pool, &self.read, &self.done_tx, &self.done_rx);
        let mut keep = |pid: u32, tenant: &Arc<str>, r: Option<MapsRead>| match r {
            Some(m) => {
                bytes += m.bytes;
                read.push(ProcessMaps {
                    pid,
                    tenant: Arc::clone(tenant),
                    candidates: m.candidates,
                    over_cap: m.over_cap,
                });
                Outcome::Read(m.bytes)
            }
            None => {
                unreadable += 1;
                Outcome::Unreadable
            }
        };
        let mut came_back = Vec::new();
        let (_, deferred) = self
            .schedule
            .cycle(started, budget, Instant::now, |pid, tenant| {
                if !pool.has_room() {
                    return Outcome::NoRoom;
                }
                let (tx, f, proc) = (done_tx.clone(), Arc::clone(read_fn), proc.clone());
                pool.run(move || {
                    let _ = tx.send((pid, f(&proc, pid)));
                });
                let until = Instant::now() + budget.read_wait;
                loop {
                    let wait = until.saturating_duration_since(Instant::now());
                    match done_rx.recv_timeout(wait) {
                        Ok((p, r)) if p == pid => return keep(pid, tenant, r),
                        // An earlier cycle's read, returned meanwhile.
                        Ok(other) => came_back.push(other),
                        Err(_) => return Outcome::Running,
                    }
                }
            });
        let now = Instant::now();
        for (pid, r) in &came_back {
            self.schedule.finish(*pid, r.as_ref().map(|r| r.bytes), now);
        }
        late.extend(came_back);
        // Late reads of processes still listed count as read now.
        let live: std::collections::HashSet<u32> = listed.iter().copied().collect();
        for (pid, r) in late.into_iter().filter(|(pid, _)| live.contains(pid)) {
            let Some(tenant) = self.schedule.tenant(pid).cloned() else {
                continue;
            };
            keep(pid, &tenant, r);
        }
        Cycle {
            listed,
            read,
            unreadable,
            bytes,
            deferred,
            blocked: self.schedule.blocked(),
            took: started.elapsed(),
        }
    }
}

/// The scan running on a thread of its own: one cycle per request.
#[derive(Debug)]
pub struct Worker {
    ask: Sender<()>,
    done: Receiver<(Cycle, usize)>,
    busy: bool,
}

impl Worker {
    pub fn start(proc: &Path, budget: Budget) -> std::io::Result<Worker> {
        let (ask, asked) = mpsc::channel::<()>();
        let (tell, done) = mpsc::channel();
        let mut scan = MapsScan::new(proc);
        std::thread::Builder::new()
            .name("maps-scan".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    let cycle = scan.cycle(budget);
                    if tell.send((cycle, scan.processes())).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Worker {
            ask,
            done,
            busy: false,
        })
    }

    /// Starts a cycle unless one runs, then waits for the running one until `wait` passes.
    /// Returns the finished cycle (and the processes known), or `None` if it is still running.
    pub fn poll(&mut self, wait: Duration) -> Option<(Cycle, usize)> {
        if !self.busy {
            if self.ask.send(()).is_err() {
                return None;
            }
            self.busy = true;
        }
        match self.done.recv_timeout(wait) {
            Ok(c) => {
                self.busy = false;
                Some(c)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(procs: &[(u32, &str)]) -> Scheduler {
        let mut s = Scheduler::default();
        let tenants: HashMap<u32, Arc<str>> =
            procs.iter().map(|(p, t)| (*p, Arc::from(*t))).collect();
        let listed: Vec<u32> = procs.iter().map(|(p, _)| *p).collect();
        s.refresh(&listed, |p| Arc::clone(&tenants[&p]), |_| Some(1));
        s
    }

    /// A tenant with 31 processes of 16 MiB maps each and a victim with one new process: the
    /// victim's process is read in the first cycle, the flood's within the budget.
    #[test]
    fn one_tenants_huge_maps_do_not_starve_anothers_new_process() {
        let mut procs: Vec<(u32, &str)> = (100..131).map(|p| (p, "flood")).collect();
        procs.push((500, "victim"));
        let mut s = sched(&procs);
        let now = Instant::now();
        let budget = Budget {
            bytes: 32 << 20,
            time: Duration::from_secs(10),
            read_wait: READ_WAIT,
        };
        let size = |pid: u32| if pid == 500 { 4096 } else { 16 << 20 };
        let (read, deferred) =
            s.cycle(now, budget, Instant::now, |pid, _| Outcome::Read(size(pid)));
        let deferred: usize = deferred.values().sum();
        assert!(read.contains(&500), "{read:?}");
        let bytes: u64 = read.iter().map(|p| size(*p)).sum();
        assert!(
            bytes <= budget.bytes + (16 << 20),
            "one read past the budget at most: {bytes}"
        );
        assert!(read.len() <= 4, "{read:?}");
        assert_eq!(deferred, 32 - read.len());
        // The next cycles read the rest of the new processes before any re-read.
        let mut all: std::collections::HashSet<u32> = read.into_iter().collect();
        for _ in 0..20 {
            let (r, _) = s.cycle(now, budget, Instant::now, |pid, _| Outcome::Read(size(pid)));
            all.extend(r);
        }
        assert_eq!(all.len(), 32);
    }

    #[test]
    fn new_processes_first_then_changed_then_due_and_the_time_budget_holds() {
        let mut s = sched(&[(1, "a"), (2, "a"), (3, "b")]);
        let t0 = Instant::now();
        let (r, _) = s.cycle(t0, Budget::UNBOUNDED, Instant::now, |_, _| {
            Outcome::Read(1000)
        });
        assert_eq!(r.len(), 3);
        // Nothing is due right after.
        let (r, d) = s.cycle(t0, Budget::UNBOUNDED, Instant::now, |_, _| {
            Outcome::Read(1000)
        });
        assert!(r.is_empty() && d.is_empty());
        // A new process and a changed one: the new one first.
        s.refresh(
            &[1, 2, 3, 4],
            |_| Arc::from("b"),
            |p| Some(if p == 2 { 9 } else { 1 }),
        );
        let t1 = t0 + changed_after(1000);
        let (r, _) = s.cycle(t1, Budget::UNBOUNDED, Instant::now, |_, _| {
            Outcome::Read(1000)
        });
        assert_eq!(r, vec![4, 2]);
        // Later everything unchanged is due again.
        let t2 = t1 + reread_after(1000);
        let (r, _) = s.cycle(t2, Budget::UNBOUNDED, Instant::now, |_, _| {
            Outcome::Read(1000)
        });
        assert_eq!(r.len(), 4);
        // A cycle stops at its time budget (a read that takes 20 ms, a budget of 30 ms).
        let mut s = sched(&[(1, "a"), (2, "a"), (3, "a"), (4, "a")]);
        let budget = Budget {
            bytes: u64::MAX,
            time: Duration::from_millis(30),
            read_wait: READ_WAIT,
        };
        let (r, d) = s.cycle(t0, budget, Instant::now, |_, _| {
            std::thread::sleep(Duration::from_millis(20));
            Outcome::Read(1)
        });
        assert_eq!((r.len(), d.values().sum::<usize>()), (2, 2));
        // Exited processes are forgotten.
        s.refresh(&[4], |_| Arc::from("a"), |_| None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn the_reread_cadence_grows_with_the_maps_size() {
        assert_eq!(reread_after(10 << 10), Duration::from_secs(5));
        assert_eq!(reread_after(1 << 20), Duration::from_millis(16_384));
        assert_eq!(reread_after(16 << 20), Duration::from_secs(60));
        assert_eq!(changed_after(4 << 10), Duration::from_millis(250));
        assert_eq!(changed_after(1 << 20), Duration::from_millis(1024));
        assert_eq!(changed_after(16 << 20), Duration::from_secs(10));
    }

    #[test]
    fn candidates_are_capped_per_kind_and_the_rest_counted() {
        let maps: Vec<tenant_fs::maps::MappedFile> = (0..5000u64)
            .map(|i| tenant_fs::maps::MappedFile {
                start: i * 4096,
                end: i * 4096 + 4096,
                dev: 1,
                inode: 10 + i,
                shared: false,
                path: PathBuf::from(format!("/t/libcuda.so.{i}")),
                deleted: false,
            })
            .chain(std::iter::once(tenant_fs::maps::MappedFile {
                start: 1 << 40,
                end: (1 << 40) + 4096,
                dev: 1,
                inode: 9,
                shared: false,
                path: PathBuf::from("/t/libnccl.so.2"),
                deleted: false,
            }))
            .collect();
        let (c, over) = candidates(&maps);
        assert_eq!(c.iter().filter(|c| c.kind == LibraryKind::Cuda).count(), 8);
        assert_eq!(c.iter().filter(|c| c.kind == LibraryKind::Nccl).count(), 1);
        assert_eq!(over, 5000 - 8);
    }
    /// A fake `/proc` process of cgroup `tenant` whose maps map a driver-named file.
    fn fake_process(proc: &Path, pid: u32, tenant: &str) {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::{tenant}\n")).unwrap();
        std::fs::write(dir.join("statm"), "1000 10 0 0 0 0 0\n").unwrap();
        let line = format!(
            "7f00-7f10 r-xp 00000000 08:01 {} /usr/lib/libcuda.so.1\n",
            pid
        );
        std::fs::write(dir.join("maps"), line).unwrap();
    }

    /// A tenant's process whose maps read blocks (it holds its memory-map lock): the cycle goes
    /// on without it and shows it blocked, never starts a second read of it, and another
    /// tenant's new process is read in the next cycle, within the cycle's time. The tenant's
    /// other processes whose reads block too hold at most [`MAX_READS_PER_TENANT`] workers; the
    /// rest of its processes wait (counted deferred for it), and the other tenant's processes
    /// are still read. Once the blocked reads return, their maps are taken by a later cycle.
    #[test]
    fn a_maps_read_that_blocks_holds_a_worker_not_the_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().to_owned();
        fake_process(&proc, 100, "/hostile");
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(std::sync::Mutex::new(gate));
        let blocked_reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut scan = MapsScan::new(&proc);
        let (g, counted) = (Arc::clone(&gate), Arc::clone(&blocked_reads));
        scan.read = Arc::new(move |proc, pid| {
            if (100..200).contains(&pid) {
                // Relaxed: a count read after the cycles that made it.
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Every blocked read waits until the sender is dropped.
                let _ = g.lock().map(|r| r.recv());
            }
            read_maps(proc, pid)
        });
        let hostile: Arc<str> = Arc::from("/hostile");
        let victim: Arc<str> = Arc::from("/victim");
        let reads = |c: &Cycle| -> Vec<u32> {
            let mut v: Vec<u32> = c.read.iter().map(|p| p.pid).collect();
            v.sort_unstable();
            v
        };
        let blocked = |c: &Cycle| -> Vec<u32> { c.blocked.iter().map(|b| b.pid).collect() };
        // A cycle's time, with margin for a loaded host: the cycle waits READ_WAIT for the
        // blocked read and no more.
        let bound = CYCLE_TIME + READ_WAIT + Duration::from_secs(2);

        let first = scan.cycle(Budget::DEFAULT);
        println!("first cycle: {:?}", first.took);
        assert!(first.took < bound, "{:?}", first.took);
        assert_eq!(reads(&first), Vec::<u32>::new());
        assert_eq!(blocked(&first), [100]);
        assert_eq!(first.blocked[0].tenant, hostile);

        // Another tenant starts a process: read at the next cycle; the blocked one is not read
        // again.
        fake_process(&proc, 500, "/victim");
        let second = scan.cycle(Budget::DEFAULT);
        println!("second cycle: {:?}", second.took);
        assert!(second.took < bound, "{:?}", second.took);
        assert_eq!(reads(&second), [500]);
        assert_eq!(second.read[0].tenant, victim);
        assert_eq!(second.read[0].candidates.len(), 1);
        assert_eq!(blocked(&second), [100]);

        // The hostile tenant starts ten more processes that block; the victim one more.
        for pid in 101..111 {
            fake_process(&proc, pid, "/hostile");
        }
        fake_process(&proc, 501, "/victim");
        let third = scan.cycle(Budget::DEFAULT);
        println!("third cycle: {:?}", third.took);
        assert!(third.took < bound, "{:?}", third.took);
        assert_eq!(reads(&third), [501]);
        assert_eq!(
            third.blocked.len(),
            MAX_READS_PER_TENANT,
            "{:?}",
            third.blocked
        );
        assert_eq!(
            third.deferred.get(&hostile),
            Some(&(11 - MAX_READS_PER_TENANT))
        );
        assert_eq!(third.deferred.get(&victim), None);
        assert_eq!(
            blocked_reads.load(std::sync::atomic::Ordering::Relaxed),
            MAX_READS_PER_TENANT,
            "one read per process at a time, and two per tenant"
        );

        // The reads return: later cycles take them and read the tenant's other processes.
        drop(gate);
        drop(release);
        let mut seen: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let all_read = (0..100).any(|_| {
            let c = scan.cycle(Budget::DEFAULT);
            seen.extend(c.read.iter().map(|p| p.pid));
            (100..111).all(|p| seen.contains(&p)) && c.blocked.is_empty() || {
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        });
        assert!(all_read, "read: {seen:?}");
    }
}
