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
//! and otherwise takes its results at a later poll, so a slow or blocking read delays discovery,
//! never a snapshot.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        Arc,
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    time::{Duration, Instant},
};

use super::{FileId, LibraryKind, procmaps};
use crate::identity::container::{ContainerIdentity, ContainerKey};

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

/// What one cycle found.
#[derive(Debug, Default)]
pub struct Cycle {
    /// Every process listed (those not listed exited).
    pub listed: Vec<u32>,
    pub read: Vec<ProcessMaps>,
    pub unreadable: usize,
    pub bytes: u64,
    /// Processes due that the budget left for a later cycle.
    pub deferred: usize,
    pub took: Duration,
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
}

impl ProcState {
    fn class(&self, now: Instant) -> Option<Class> {
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

/// Byte and time budget of a cycle.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub bytes: u64,
    pub time: Duration,
}

impl Budget {
    pub const DEFAULT: Budget = Budget {
        bytes: CYCLE_BYTES,
        time: CYCLE_TIME,
    };
    /// No bound (a one-off synchronous scan).
    pub const UNBOUNDED: Budget = Budget {
        bytes: u64::MAX,
        time: Duration::MAX,
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
        self.procs.retain(|pid, _| live.contains(pid));
        for &pid in listed {
            let vsize = vsize_of(pid);
            let p = self.procs.entry(pid).or_insert_with(|| ProcState {
                tenant: tenant_of(pid),
                bytes: None,
                last_read: None,
                vsize_at_read: None,
                vsize: None,
            });
            p.vsize = vsize;
        }
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Reads what is due within `budget`: `read(pid)` reads one process's maps and returns its
    /// bytes (`None`: unreadable). Returns the pids read, in order, and how many due were left.
    pub fn cycle(
        &mut self,
        now: Instant,
        budget: Budget,
        clock: impl Fn() -> Instant,
        mut read: impl FnMut(u32, &Arc<str>) -> Option<u64>,
    ) -> (Vec<u32>, usize) {
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
                        if over(total) {
                            break 'classes;
                        }
                        let Some(q) = queue.get_mut(t) else { continue };
                        let Some(pid) = q.pop_front() else { continue };
                        if q.is_empty() {
                            queue.remove(t);
                        }
                        progressed = true;
                        let bytes = read(pid, t);
                        let n = bytes.unwrap_or(0);
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
        let deferred = queues
            .values()
            .flat_map(|q| q.values())
            .map(VecDeque::len)
            .sum();
        (done, deferred)
    }
}

/// The tenant a process belongs to: its container's id, or its cgroup path (bounded, read from
/// `/proc/<pid>/cgroup`); `?` when it cannot be read.
pub fn tenant_of(proc: &Path, pid: u32) -> Arc<str> {
    let mut text = String::new();
    let read = region::tenant_fs::read_proc_lines(
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
    region::tenant_fs::read_proc_lines(
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
pub fn candidates(maps: &[procmaps::MappedFile]) -> (Vec<Candidate>, u64) {
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

/// The scan of one `/proc`: the schedule and the reading.
#[derive(Debug)]
pub struct MapsScan {
    proc: PathBuf,
    schedule: Scheduler,
}

impl MapsScan {
    pub fn new(proc: &Path) -> MapsScan {
        MapsScan {
            proc: proc.to_path_buf(),
            schedule: Scheduler::default(),
        }
    }

    pub fn processes(&self) -> usize {
        self.schedule.len()
    }

    /// One cycle within `budget`.
    pub fn cycle(&mut self, budget: Budget) -> Cycle {
        let started = Instant::now();
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
        let (_, deferred) =
            self.schedule.cycle(
                started,
                budget,
                Instant::now,
                |pid, tenant| match procmaps::read(&proc, pid) {
                    Ok((maps, r)) => {
                        if r.truncated {
                            log::debug!(
                                "pid {pid}: maps longer than {} bytes; the rest was not read",
                                procmaps::MAX_MAPS_BYTES
                            );
                        }
                        let (candidates, over_cap) = candidates(&maps);
                        bytes += r.bytes;
                        read.push(ProcessMaps {
                            pid,
                            tenant: Arc::clone(tenant),
                            candidates,
                            over_cap,
                        });
                        Some(r.bytes)
                    }
                    Err(_) => {
                        unreadable += 1;
                        None
                    }
                },
            );
        Cycle {
            listed,
            read,
            unreadable,
            bytes,
            deferred,
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
        };
        let size = |pid: u32| if pid == 500 { 4096 } else { 16 << 20 };
        let (read, deferred) = s.cycle(now, budget, Instant::now, |pid, _| Some(size(pid)));
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
            let (r, _) = s.cycle(now, budget, Instant::now, |pid, _| Some(size(pid)));
            all.extend(r);
        }
        assert_eq!(all.len(), 32);
    }

    #[test]
    fn new_processes_first_then_changed_then_due_and_the_time_budget_holds() {
        let mut s = sched(&[(1, "a"), (2, "a"), (3, "b")]);
        let t0 = Instant::now();
        let (r, _) = s.cycle(t0, Budget::UNBOUNDED, Instant::now, |_, _| Some(1000));
        assert_eq!(r.len(), 3);
        // Nothing is due right after.
        let (r, d) = s.cycle(t0, Budget::UNBOUNDED, Instant::now, |_, _| Some(1000));
        assert!(r.is_empty() && d == 0);
        // A new process and a changed one: the new one first.
        s.refresh(
            &[1, 2, 3, 4],
            |_| Arc::from("b"),
            |p| Some(if p == 2 { 9 } else { 1 }),
        );
        let t1 = t0 + changed_after(1000);
        let (r, _) = s.cycle(t1, Budget::UNBOUNDED, Instant::now, |_, _| Some(1000));
        assert_eq!(r, vec![4, 2]);
        // Later everything unchanged is due again.
        let t2 = t1 + reread_after(1000);
        let (r, _) = s.cycle(t2, Budget::UNBOUNDED, Instant::now, |_, _| Some(1000));
        assert_eq!(r.len(), 4);
        // A cycle stops at its time budget (a read that takes 20 ms, a budget of 30 ms).
        let mut s = sched(&[(1, "a"), (2, "a"), (3, "a"), (4, "a")]);
        let budget = Budget {
            bytes: u64::MAX,
            time: Duration::from_millis(30),
        };
        let (r, d) = s.cycle(t0, budget, Instant::now, |_, _| {
            std::thread::sleep(Duration::from_millis(20));
            Some(1)
        });
        assert_eq!((r.len(), d), (2, 2));
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
        let maps: Vec<procmaps::MappedFile> = (0..5000u64)
            .map(|i| procmaps::MappedFile {
                start: i * 4096,
                end: i * 4096 + 4096,
                dev: 1,
                inode: 10 + i,
                shared: false,
                path: PathBuf::from(format!("/t/libcuda.so.{i}")),
                deleted: false,
            })
            .chain(std::iter::once(procmaps::MappedFile {
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
}
