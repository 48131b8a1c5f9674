//! The chunks: those ready to lend, and the refill that keeps ready and lent chunks at the pool's
//! size. A chunk leaves the pool with a loan and never comes back: at the loan's end its pages
//! are freed and its descriptor closed ([`Chunk::take_back`]), and the refill populates a new one
//! in its place.

use std::{
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    chunk::{Chunk, Tmpfs},
    host::{self, HostMemory},
};

/// Threads that populate chunks at once (populating is the host's CPU allocating and zeroing
/// pages), each at the lowest priority: the host's other work goes first.
pub(super) const REFILL_THREADS: usize = 2;
/// Bytes of zeros a chunk is written with at a time (a huge page).
const ZEROS: usize = 2 << 20;
/// How long the refill waits before trying again after a failure, or while the host is short
/// of memory.
const RETRY: Duration = Duration::from_secs(1);

/// Where the chunks stand.
#[derive(Default)]
struct State {
    ready: Vec<Chunk>,
    /// Chunks out on loans.
    lent: usize,
    /// Chunks being populated now.
    populating: usize,
    /// Why the refill does not make chunks now (host memory short, pages kept by borrowers,
    /// populating failed).
    problem: Option<Problem>,
}

/// A reason the refill waits, since when, and whether the log said it.
struct Problem {
    kind: &'static str,
    message: String,
    since: Instant,
    said: bool,
}

/// How long ended loans' pages may stay held before the log says so: a borrower that thawed at
/// a call keeps its chunks registered for 2 s (`RELEASE_AFTER` in the limiter's in-process
/// freeze) before it lets go, which is no problem to warn about.
const KEPT_GRACE: Duration = Duration::from_secs(10);

/// The pool's chunks and their refill.
pub(super) struct Pool {
    tmpfs: Tmpfs,
    /// Chunks ready and lent together, at most.
    target: usize,
    state: Mutex<State>,
    changed: Condvar,
    host: Box<dyn HostMemory>,
    stop: AtomicBool,
}

/// What [`Pool::figures`] says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Figures {
    pub target: usize,
    pub ready: usize,
    pub lent: usize,
    /// Bytes of ended loans their borrowers still hold (counted against the target).
    pub kept: u64,
    pub problem: Option<String>,
}

impl Pool {
    /// A pool of `target` chunks in `tmpfs` (none made before [`Pool::start_refill`]).
    pub fn new(tmpfs: Tmpfs, target: usize, host: Box<dyn HostMemory>) -> Pool {
        Pool {
            tmpfs,
            target,
            state: Mutex::default(),
            changed: Condvar::new(),
            host,
            stop: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the refill threads.
    pub fn start_refill(self: &Arc<Pool>) -> std::io::Result<Vec<JoinHandle<()>>> {
        (0..REFILL_THREADS)
            .map(|_| {
                let pool = Arc::clone(self);
                std::thread::Builder::new()
                    .name("fpool-fill".into())
                    .spawn(move || pool.refill())
            })
            .collect()
    }

    /// Stops the refill (a chunk being populated is finished first).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _guard = self.lock();
        self.changed.notify_all();
    }

    /// `n` ready chunks, all or none (`None`: fewer are ready); they count as lent from now.
    pub fn take(&self, n: usize) -> Option<Vec<Chunk>> {
        let mut s = self.lock();
        if n == 0 || s.ready.len() < n {
            return None;
        }
        let at = s.ready.len() - n;
        let chunks = s.ready.split_off(at);
        s.lent += n;
        Some(chunks)
    }

    /// Takes back the chunks of a loan that ended: each one's pages freed and its descriptor
    /// closed, then new chunks populated in their place.
    pub fn take_back(&self, chunks: Vec<Chunk>) {
        let n = chunks.len();
        for c in chunks {
            if let Err(e) = c.take_back() {
                // Its descriptor is closed all the same; its pages go with the last holder's.
                log::warn!("freeze pool: freeing a chunk's pages: {e}");
            }
        }
        let mut s = self.lock();
        s.lent = s.lent.saturating_sub(n);
        self.changed.notify_all();
    }

    /// The chunks now.
    pub fn figures(&self) -> Figures {
        let kept = host::kept_bytes(&*self.host);
        let s = self.lock();
        Figures {
            target: self.target,
            ready: s.ready.len(),
            lent: s.lent,
            kept,
            problem: s.problem.as_ref().map(|p| p.message.clone()),
        }
    }

    /// Waits until `n` chunks are ready (`false`: not within `within`).
    #[cfg(test)]
    pub fn wait_ready(&self, n: usize, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut s = self.lock();
        while s.ready.len() < n {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// One refill thread: populates a chunk whenever ready, lent and populating chunks are fewer
    /// than the target, with room for it beside the pages borrowers kept, and the host keeps its
    /// reserve; until stopped.
    fn refill(&self) {
        if let Err(e) = crate::sys::process::lowest_priority_for_this_thread() {
            log::debug!("freeze pool: lowering the refill's priority: {e}");
        }
        // What a chunk's pages are written with: a huge page's worth of zeros.
        let zeros = vec![0u8; ZEROS];
        loop {
            let out = {
                let mut s = self.lock();
                loop {
                    if self.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if s.ready.len() + s.lent + s.populating < self.target {
                        break;
                    }
                    s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
                s.populating += 1;
                s.ready.len() + s.lent + s.populating
            };
            let made = match host::short_of(&*self.host, out, self.target) {
                Some(why) => Err(why),
                None => self
                    .tmpfs
                    .chunk(&zeros)
                    .map_err(|e| ("populate", format!("populating a chunk failed: {e}"))),
            };
            let mut s = self.lock();
            s.populating -= 1;
            let failed = match made {
                Ok(chunk) => {
                    s.ready.push(chunk);
                    if let Some(was) = s.problem.take()
                        && was.said
                    {
                        log::info!("freeze pool: populating again (after: {})", was.message);
                    }
                    false
                }
                Err((kind, why)) => {
                    // Said once per kind of problem (its figures change while it lasts); pages
                    // kept only once they have been kept past a borrower's usual release.
                    let (since, said) = match &s.problem {
                        Some(p) if p.kind == kind => (p.since, p.said),
                        _ => (Instant::now(), false),
                    };
                    let say = !said && (kind != "kept" || since.elapsed() >= KEPT_GRACE);
                    if say {
                        log::warn!("freeze pool: {why} (tried again every second)");
                    }
                    s.problem = Some(Problem {
                        kind,
                        message: why,
                        since,
                        said: said || say,
                    });
                    true
                }
            };
            self.changed.notify_all();
            if failed && !self.stop.load(Ordering::Relaxed) {
                drop(
                    self.changed
                        .wait_timeout(s, RETRY)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{host::testing::FakeHost, testing::privileged_tmpfs},
        *,
    };

    const GIB: u64 = 1 << 30;

    /// The refill keeps ready and lent chunks at the target: a loan is taken whole or not at
    /// all, the chunks taken back are replaced by new ones; while the host is short of memory
    /// nothing is populated (the reason is shown) until it has room again, and pages borrowers
    /// kept after their loans count against the target.
    #[test]
    fn the_refill_keeps_the_target_and_waits_while_the_host_is_short() {
        let Some(tmpfs) = privileged_tmpfs() else {
            return;
        };
        let host = Arc::new(FakeHost(Some((GIB / 2, 64 * GIB)).into(), None.into()));
        struct Shared(Arc<FakeHost>);
        impl HostMemory for Shared {
            fn now(&self) -> Option<(u64, u64)> {
                self.0.now()
            }
            fn kept(&self) -> Option<u64> {
                self.0.kept()
            }
        }
        let pool = Arc::new(Pool::new(tmpfs, 2, Box::new(Shared(Arc::clone(&host)))));
        let threads = pool.start_refill().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let short = pool.figures();
        assert_eq!(short.ready, 0, "the host is short: nothing populated");
        assert!(
            short
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("waits for memory")),
            "{short:?}"
        );
        *host.0.lock().unwrap() = Some((64 * GIB, 64 * GIB));
        assert!(
            pool.wait_ready(2, Duration::from_secs(60)),
            "{:?}",
            pool.figures()
        );
        assert_eq!(pool.figures().problem, None);
        assert!(pool.take(3).is_none(), "more than ready: none");
        assert_eq!(pool.figures().ready, 2);
        let lent = pool.take(2).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let out = pool.figures();
        assert_eq!(
            (out.ready, out.lent),
            (0, 2),
            "lent chunks count: no refill"
        );
        pool.take_back(lent);
        assert!(
            pool.wait_ready(2, Duration::from_secs(60)),
            "{:?}",
            pool.figures()
        );
        assert_eq!(pool.figures().lent, 0);
        pool.stop();
        for t in threads {
            t.join().unwrap();
        }
    }
}
