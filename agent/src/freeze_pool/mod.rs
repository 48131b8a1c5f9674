//! The freeze pool: host memory the daemon keeps populated and lends to a process that freezes
//! in-process (`vgpu-agent run --freeze-pool SIZE`; the protocol is `region::freeze_pool`, the
//! limiter's side `limiter/src/platform/freeze_pool`).
//!
//! Populating fresh host pages is most of what an in-process freeze waits for; the pool does it
//! beforehand. It keeps `SIZE` (whole chunks of `region::freeze_pool::CHUNK_BYTES`) ready and
//! lent together ([`pool`]): each chunk an unnamed file of the agent's own tmpfs in transparent
//! huge pages, mounted nowhere ([`chunk`]), populated by at most two threads at the lowest
//! priority while the host keeps its reserve ([`host`]). The pages are charged to the agent's
//! memory cgroup.
//!
//! A process asks on the pool's socket ([`server`]); the agent takes who it is from the socket
//! (`SO_PEERCRED`), measures it ([`asker`]: its start time, its container, the `InProcess` mark
//! beside a region it holds a slot in, its device memory per NVML) and decides ([`decide`]):
//! lent only to a process freezing in-process, holding no loan, for at most what NVML says it
//! holds plus one chunk, and only whole (never part of what it asked). A loan's chunks go with
//! the reply as descriptors; the loan is watched ([`loans`]) until the process answers the mark
//! (thawed, or its freeze failed), exits, or its pid names another process, and then each chunk
//! is taken back: its pages freed (a hole punched through it, also when the process kept its
//! descriptor or mapping) and the agent's descriptor closed. A chunk is never lent twice: new
//! ones are populated in their place.
//!
//! Frozen bytes count against `--freeze-host-budget` as without the pool (the pool is at most
//! that budget). At the daemon's stop, loans out are left as they are (a process may still be
//! frozen in one): their pages go when the process closes and unmaps them.

mod asker;
mod chunk;
mod counters;
mod decide;
mod error;
mod host;
mod lender;
mod loans;
mod pool;
mod server;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use region::freeze_pool::CHUNK_BYTES;

pub use self::error::FreezePoolError;
use self::{
    asker::Inspect,
    lender::Lender,
    pool::Pool,
    server::{Limits, Server},
};
use crate::{model::FreezePoolStatus, units};

/// The pool's settings (`--freeze-pool`, `--freeze-pool-socket`, `--freeze-host-budget`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Host bytes kept ready and lent together (rounded down to whole chunks).
    pub size: u64,
    /// The host budget of frozen containers, which the pool must fit in.
    pub host_budget: u64,
    pub socket: PathBuf,
}

impl Settings {
    /// The chunks the pool keeps, or why the settings are refused.
    fn chunks(&self) -> Result<usize, FreezePoolError> {
        if self.size < CHUNK_BYTES {
            return Err(FreezePoolError::TooSmall(self.size));
        }
        if self.size > self.host_budget {
            return Err(FreezePoolError::OverBudget {
                size: self.size,
                budget: self.host_budget,
            });
        }
        Ok(usize::try_from(self.size / CHUNK_BYTES).unwrap_or(usize::MAX))
    }
}

/// The running pool: its socket served, its chunks kept. Dropping it stops it.
pub struct FreezePool {
    lender: Arc<Lender>,
    socket: PathBuf,
    accept: Option<JoinHandle<()>>,
    refill: Vec<JoinHandle<()>>,
}

/// Reads the pool's figures for the model, from any thread.
#[derive(Clone)]
pub struct StatusSource(Arc<Lender>);

impl StatusSource {
    pub fn get(&self) -> FreezePoolStatus {
        self.0.status()
    }
}

/// How long a stop waits for a chunk being populated.
const STOP_WAIT: Duration = Duration::from_millis(200);

impl FreezePool {
    /// Starts the pool of the host (`/proc`, NVML): the tmpfs made, the socket bound, the
    /// refill started. Refused with the reason, never silently smaller.
    pub fn start(settings: &Settings) -> Result<FreezePool, FreezePoolError> {
        let chunks = settings.chunks()?;
        let cgroup =
            host::OwnCgroup::find(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
        host::check_own_cgroup(chunks as u64 * CHUNK_BYTES, cgroup.as_ref())?;
        if cgroup.is_none() {
            log::warn!(
                "freeze pool: the agent's memory cgroup is not known: pages a borrower keeps \
                 after its loan (pinned) are not seen, only the host's reserve bounds them"
            );
        }
        let tmpfs = chunk::Tmpfs::new()?;
        let nvml = asker::Nvml::new(crate::checkpoint::measure::nvml);
        if !nvml.loaded() {
            log::warn!(
                "freeze pool: NVML is not loaded: every request is refused (the pool lends at \
                 most what NVML says a process holds; tried again every 30 s)"
            );
        }
        let inspect = asker::Host {
            proc: PathBuf::from("/proc"),
            nvml,
        };
        let started = FreezePool::start_with(
            &settings.socket,
            Pool::new(
                tmpfs,
                chunks,
                Box::new(host::HostFiles {
                    meminfo: PathBuf::from("/proc/meminfo"),
                    cgroup,
                }),
            ),
            Box::new(inspect),
            Limits::DEFAULT,
        )?;
        log::info!(
            "freeze pool: keeping {} of host memory in huge pages for in-process freezes, lent on {}",
            units::bytes(chunks as u64 * CHUNK_BYTES),
            settings.socket.display()
        );
        Ok(started)
    }

    /// Serves `pool` on `socket`, measuring with `inspect`.
    fn start_with(
        socket: &Path,
        pool: Pool,
        inspect: Box<dyn Inspect>,
        limits: Limits,
    ) -> Result<FreezePool, FreezePoolError> {
        let listener = server::bind(socket)?;
        let pool = Arc::new(pool);
        let lender = Arc::new(Lender::new(Arc::clone(&pool)));
        let serving = Arc::new(Server::new(Arc::clone(&lender), inspect, limits));
        let mut started = FreezePool {
            lender,
            socket: socket.to_owned(),
            accept: None,
            refill: Vec::new(),
        };
        started.refill = pool.start_refill().map_err(FreezePoolError::Thread)?;
        started.accept = Some(
            std::thread::Builder::new()
                .name("fpool-accept".into())
                .spawn(move || server::serve(listener, serving))
                .map_err(FreezePoolError::Thread)?,
        );
        Ok(started)
    }

    pub fn status_source(&self) -> StatusSource {
        StatusSource(Arc::clone(&self.lender))
    }
}

impl Drop for FreezePool {
    fn drop(&mut self) {
        self.lender.stop();
        let _ = std::fs::remove_file(&self.socket);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let deadline = Instant::now() + STOP_WAIT;
        for t in self.refill.drain(..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// A pool served on a socket of a temporary directory, and its clients, as the tests use them.
#[cfg(test)]
mod testing {
    use std::{
        io::Write,
        os::{fd::OwnedFd, unix::net::UnixStream},
    };

    use region::freeze_pool::{REPLY_SIZE, Reply, Request};

    use super::*;

    /// A pool of `chunks` in `tmpfs` served with `inspect`, the host's memory plentiful.
    pub struct Served {
        pub dir: tempfile::TempDir,
        pub pool: FreezePool,
    }

    impl Served {
        pub fn new(
            tmpfs: chunk::Tmpfs,
            chunks: usize,
            inspect: impl Inspect + 'static,
            limits: Limits,
        ) -> Served {
            let host = host::testing::FakeHost(Some((1 << 50, 1 << 50)).into(), None.into());
            Served::with_host(tmpfs, chunks, inspect, limits, host)
        }

        /// The same, the host's memory as `host` says.
        pub fn with_host(
            tmpfs: chunk::Tmpfs,
            chunks: usize,
            inspect: impl Inspect + 'static,
            limits: Limits,
            host: impl host::HostMemory + 'static,
        ) -> Served {
            let dir = tempfile::tempdir().unwrap();
            let pool = FreezePool::start_with(
                &dir.path().join("pool/freeze-pool.sock"),
                Pool::new(tmpfs, chunks, Box::new(host)),
                Box::new(inspect),
                limits,
            )
            .unwrap();
            Served { dir, pool }
        }

        /// A pool of no chunks, its files in the temporary directory (no privilege needed).
        pub fn unprivileged(inspect: impl Inspect + 'static, limits: Limits) -> Served {
            let files = tempfile::tempdir().unwrap();
            let served = Served::new(chunk::Tmpfs::in_dir(files.path()), 0, inspect, limits);
            drop(files);
            served
        }

        pub fn socket(&self) -> PathBuf {
            self.dir.path().join("pool/freeze-pool.sock")
        }

        pub fn connect(&self) -> UnixStream {
            let s = UnixStream::connect(self.socket()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        }

        /// Asks for `bytes`: the reply and the descriptors that came with it.
        pub fn ask(&self, bytes: u64) -> (Reply, Vec<OwnedFd>) {
            let mut s = self.connect();
            s.write_all(&Request { bytes }.encode()).unwrap();
            let mut buf = [0u8; REPLY_SIZE];
            let (n, fds) = crate::sys::socket::recv_with_fds(&s, &mut buf, 256).unwrap();
            assert_eq!(n, REPLY_SIZE);
            (Reply::decode(&buf).unwrap(), fds)
        }

        pub fn status(&self) -> FreezePoolStatus {
            self.pool.status_source().get()
        }

        /// Waits until the status says what `done` wants (`false`: not within `within`).
        pub fn until(&self, within: Duration, done: impl Fn(&FreezePoolStatus) -> bool) -> bool {
            let deadline = Instant::now() + within;
            while !done(&self.status()) {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            true
        }
    }

    /// The agent's own tmpfs, or `None` (the test skips) where it cannot be made: no
    /// `CAP_SYS_ADMIN`, no mount API or no transparent huge pages. Under `cargo xtask test` as
    /// root (`VGPU_REQUIRE_PRIVILEGED=1`) that is a failure, not a skip.
    pub fn privileged_tmpfs() -> Option<chunk::Tmpfs> {
        match chunk::Tmpfs::new() {
            Ok(t) => Some(t),
            Err(e) => {
                assert!(
                    std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none_or(|v| v != "1"),
                    "privileged test cannot run: {e}"
                );
                eprintln!("skipping privileged test: {e}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use region::{OwnFreeze, OwnFreezeState};

    use std::sync::Mutex;

    use region::freeze_pool::{Reply, Status};

    use super::{
        asker::testing::{FakeAsker, FakeInspect},
        loans::{Look, Process},
        testing::{Served, privileged_tmpfs},
        *,
    };
    use crate::sys::tmpfs::allocated;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_pool_is_whole_chunks_within_the_host_budget() {
        let settings = |size, host_budget| Settings {
            size,
            host_budget,
            socket: PathBuf::from("/x"),
        };
        assert_eq!(settings(64 * GIB, 64 * GIB).chunks().unwrap(), 64);
        assert_eq!(settings(5 * GIB / 2, 64 * GIB).chunks().unwrap(), 2);
        let e = settings(65 * GIB, 64 * GIB).chunks().unwrap_err();
        assert!(e.to_string().contains("--freeze-host-budget"), "{e}");
        let e = settings(GIB / 2, 64 * GIB).chunks().unwrap_err();
        assert!(e.to_string().contains("less than one chunk"), "{e}");
    }

    fn identity(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    /// A freezing process asking for 2 GiB gets two descriptors of populated chunks in one reply;
    /// asking again while its loan is out it is refused, and past NVML's figure plus a chunk
    /// too. When its slot answers the mark with a thaw the loan ends: the chunks' pages are
    /// freed though the process kept its descriptors, and new chunks (other files) are
    /// populated for the next loan. A request that shows the loan's end (its slot answered
    /// already) ends it before the watch sees it; a process gone, or its pid reused, ends it.
    #[test]
    fn a_loan_is_lent_whole_and_its_pages_freed_at_its_end_though_its_fds_are_kept() {
        let Some(tmpfs) = privileged_tmpfs() else {
            return;
        };
        let inspect = FakeInspect::new(FakeAsker::freezing(2 * GIB));
        let asker = Arc::clone(&inspect.asker);
        let served = Served::new(tmpfs, 2, inspect, Limits::DEFAULT);
        assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == 2 * GIB));
        let (reply, fds) = served.ask(2 * GIB);
        assert_eq!(reply, Reply::lent(2));
        assert_eq!(fds.len(), 2);
        for fd in &fds {
            assert_eq!(
                allocated(fd).unwrap(),
                (CHUNK_BYTES, CHUNK_BYTES),
                "populated"
            );
        }
        let s = served.status();
        assert_eq!((s.lent_bytes, s.loans, s.loans_total), (2 * GIB, 1, 1));
        assert_eq!(served.ask(GIB).0, Reply::refused(Status::AlreadyLent));
        let first: Vec<u64> = fds.iter().map(identity).collect();

        // Thawed: its slot answers the mark's generation, running.
        let look = Arc::clone(&asker.lock().unwrap().look);
        look.lock().unwrap().answer = Some(OwnFreeze {
            state: OwnFreezeState::Running,
            generation: 8,
        });
        let over = |s: &FreezePoolStatus| s.loans == 0 && s.lent_bytes == 0;
        assert!(served.until(Duration::from_secs(2), over));
        for fd in &fds {
            assert_eq!(
                allocated(fd).unwrap(),
                (0, CHUNK_BYTES),
                "freed though kept"
            );
        }
        assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == 2 * GIB));
        assert_eq!(served.status().lent_bytes, 0);

        // Its next freeze (generation 10): two new chunks, never the first two.
        {
            let mut a = asker.lock().unwrap();
            a.freezing = Some(decide::Freezing {
                generation: 10,
                answer: Some(OwnFreeze {
                    state: OwnFreezeState::Running,
                    generation: 8,
                }),
            });
            a.look = Arc::new(Mutex::new(Look {
                process: Process::Started(100),
                answer: None,
            }));
        }
        assert_eq!(
            served.ask(3 * GIB + 1).0,
            Reply::refused(Status::TooMuch),
            "past NVML's 2 GiB plus a chunk"
        );
        let (reply, again) = served.ask(2 * GIB);
        assert_eq!(reply, Reply::lent(2));
        assert!(again.iter().map(identity).all(|i| !first.contains(&i)));
        // Its slot answers the thaw before the watch looks: its next request ends the loan.
        asker.lock().unwrap().freezing = Some(decide::Freezing {
            generation: 12,
            answer: Some(OwnFreeze {
                state: OwnFreezeState::Running,
                generation: 10,
            }),
        });
        assert_eq!(
            served.ask(GIB).0,
            Reply::refused(Status::Empty),
            "the last loan ended, its chunks not populated again yet"
        );
        assert!(served.until(Duration::from_secs(2), over));
        for fd in &again {
            assert_eq!(allocated(fd).unwrap(), (0, CHUNK_BYTES));
        }
        assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == 2 * GIB));

        // A loan whose process is gone, or whose pid names another process, ends.
        for process in [Process::Gone, Process::Started(101)] {
            let look = Arc::new(Mutex::new(Look {
                process: Process::Started(100),
                answer: None,
            }));
            asker.lock().unwrap().look = Arc::clone(&look);
            let (reply, fds) = served.ask(GIB);
            assert_eq!(reply, Reply::lent(1));
            std::thread::sleep(loans::WATCH_PERIOD * 3);
            assert_eq!(served.status().loans, 1, "frozen, silent: kept");
            look.lock().unwrap().process = process;
            assert!(served.until(Duration::from_secs(2), over));
            assert_eq!(allocated(&fds[0]).unwrap().0, 0);
            assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == 2 * GIB));
        }
        let s = served.status();
        assert_eq!(s.loans_total, 4);
        assert_eq!(s.refusals.get("already_lent"), Some(&1));
        assert_eq!(s.refusals.get("too_much"), Some(&1));
        assert_eq!(s.refusals.get("empty"), Some(&1));
    }

    /// A borrower that pins its loan's pages (here in pipes, as any process can; a driver's
    /// registration does the same) keeps them after its loan ends and the hole is punched: they
    /// stay charged to the agent. The agent's memory cgroup shows them, the pool counts them
    /// against its size (it does not populate a chunk in their place) and says so; once the
    /// borrower lets go, the pool is whole again.
    #[test]
    fn pages_a_borrower_pins_past_its_loan_count_against_the_pool() {
        let Some(tmpfs) = privileged_tmpfs() else {
            return;
        };
        let Some(cgroup) =
            host::OwnCgroup::find(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"))
        else {
            eprintln!("skipping: this process's memory cgroup is not known");
            return;
        };
        let inspect = FakeInspect::new(FakeAsker::freezing(GIB));
        let asker = Arc::clone(&inspect.asker);
        let host = host::HostFiles {
            meminfo: PathBuf::from("/proc/meminfo"),
            cgroup: Some(cgroup),
        };
        let served = Served::with_host(tmpfs, 1, inspect, Limits::DEFAULT, host);
        assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == GIB));
        let (reply, fds) = served.ask(GIB);
        assert_eq!(reply, Reply::lent(1));
        let pipes = crate::sys::tmpfs::pin_in_pipes(
            std::os::fd::AsFd::as_fd(&fds[0]),
            CHUNK_BYTES as usize,
        )
        .unwrap();
        drop(fds);
        asker.lock().unwrap().look.lock().unwrap().answer = Some(OwnFreeze {
            state: OwnFreezeState::Running,
            generation: 8,
        });
        assert!(served.until(Duration::from_secs(5), |s| {
            s.loans == 0 && s.kept_bytes >= GIB * 9 / 10
        }));
        std::thread::sleep(Duration::from_millis(1500));
        let s = served.status();
        assert_eq!(s.ready_bytes, 0, "no chunk in the kept pages' place: {s:?}");
        assert!(s.problem.is_some_and(|p| p.contains("still held")));
        drop(pipes);
        assert!(
            served.until(Duration::from_secs(60), |s| s.ready_bytes == GIB
                && s.kept_bytes == 0),
            "{:?}",
            served.status()
        );
    }

    /// A request for more than the pool has ready gets nothing, never part of it.
    #[test]
    fn a_loan_is_never_partial() {
        let Some(tmpfs) = privileged_tmpfs() else {
            return;
        };
        let served = Served::new(
            tmpfs,
            1,
            FakeInspect::new(FakeAsker::freezing(8 * GIB)),
            Limits::DEFAULT,
        );
        assert!(served.until(Duration::from_secs(60), |s| s.ready_bytes == GIB));
        let (reply, fds) = served.ask(2 * GIB);
        assert_eq!(reply, Reply::refused(Status::Empty));
        assert!(fds.is_empty());
        assert_eq!(served.status().ready_bytes, GIB);
    }
}
