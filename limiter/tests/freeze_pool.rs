//! The in-process freeze with the agent's freeze pool (`VGPU_FREEZE_IN_PROCESS=1`,
//! `VGPU_FREEZE_POOL_SOCKET`, docs/oversubscription.md): a tenant under the limiter on the
//! simulated driver, frozen and thawed by the control block's marks as the agent writes them,
//! borrowing host memory from a stand-in agent of the test's own (a thread on a Unix socket that
//! lends memfds of `CHUNK_BYTES` through `SCM_RIGHTS`, or answers as told). The simulated driver
//! refuses a copy that spans two registrations, as the real one does, so a freeze that uses two
//! chunks shows that its copies are split at the chunk boundary.

mod support;

use std::{
    io::{BufRead, BufReader, IoSlice, Read, Write},
    mem::MaybeUninit,
    os::{
        fd::{AsFd, FromRawFd, OwnedFd},
        unix::net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{Arc, Mutex, OnceLock, mpsc},
    time::{Duration, Instant},
};

use region::{
    FreezeMark, OwnFreezeState,
    freeze_pool::{CHUNK_BYTES, REQUEST_SIZE, Reply, Request, Status},
};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
use support::{cc, fresh_region, paths, preloaded};

const MIB: u64 = 1 << 20;

fn caller() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc("freeze_caller.c", "freeze_caller", &[&libdir, "-lcuda"])
    })
}

/// What the stand-in agent answers a request with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// The chunks asked for, each a memfd of `CHUNK_BYTES`.
    Lend,
    /// A refusal.
    Refuse(Status),
    /// A loan of the chunks asked for with one descriptor fewer.
    FewerDescriptors,
    /// A loan whose chunks are 4 KiB short.
    WrongSize,
    /// 24 bytes that are no reply.
    Garbage,
    /// Nothing at all (the connection stays open).
    Silence,
}

/// A stand-in agent: answers every connection on its socket as `answer` says now, and records
/// the requests.
struct Pool {
    path: PathBuf,
    answer: Arc<Mutex<Answer>>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Pool {
    fn start() -> Pool {
        let path = fresh_region("pool").with_extension("sock");
        let listener = UnixListener::bind(&path).unwrap();
        let answer = Arc::new(Mutex::new(Answer::Lend));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (a, r) = (Arc::clone(&answer), Arc::clone(&requests));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (a, r) = (*a.lock().unwrap(), Arc::clone(&r));
                std::thread::spawn(move || serve(conn, a, &r));
            }
        });
        Pool {
            path,
            answer,
            requests,
        }
    }

    fn answer(&self, a: Answer) {
        *self.answer.lock().unwrap() = a;
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// A memfd of `size` bytes (sparse: its pages come with the tenant's writes).
fn memfd(size: u64) -> OwnedFd {
    // SAFETY: a valid name; the descriptor returned is owned below.
    let fd = unsafe { libc::memfd_create(c"vgpu-test-chunk".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a descriptor just created and owned nowhere else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::fs::ftruncate(&fd, size).unwrap();
    fd
}

fn serve(mut conn: UnixStream, answer: Answer, requests: &Mutex<Vec<Request>>) {
    let mut req = [0u8; REQUEST_SIZE];
    if conn.read_exact(&mut req).is_err() {
        return;
    }
    let request = Request::decode(&req).unwrap();
    requests.lock().unwrap().push(request);
    let chunks = request.chunks();
    let lend = |fds: u32, size: u64| {
        let files: Vec<OwnedFd> = (0..fds).map(|_| memfd(size)).collect();
        let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(256))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        }
        let reply = Reply::lent(chunks).encode();
        sendmsg(
            &conn,
            &[IoSlice::new(&reply)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
    };
    match answer {
        Answer::Lend => lend(chunks, CHUNK_BYTES),
        Answer::FewerDescriptors => lend(chunks - 1, CHUNK_BYTES),
        Answer::WrongSize => lend(chunks, CHUNK_BYTES - 4096),
        Answer::Refuse(status) => conn.write_all(&Reply::refused(status).encode()).unwrap(),
        Answer::Garbage => conn.write_all(&[0xa5; 24]).unwrap(),
        Answer::Silence => {}
    }
    // Until the tenant hangs up.
    let _ = conn.read_to_end(&mut Vec::new());
}

/// A `freeze_caller` of `mib` allocations with the in-process path on, the pool at `socket`.
struct Tenant {
    child: Child,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
    region: PathBuf,
    pid: u32,
}

impl Tenant {
    fn start(mib: &[u64], socket: &Path) -> Tenant {
        let region = fresh_region("own");
        let mut c = preloaded(caller());
        c.args(mib.iter().map(u64::to_string))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
            .env("VGPU_FREEZE_IN_PROCESS", "1")
            .env("VGPU_FREEZE_POOL_SOCKET", socket)
            .env("VGPU_SM_FEEDBACK", "off")
            .env("LIBCUDA_LOG_LEVEL", "3")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let lines = |r: Box<dyn Read + Send>| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            rx
        };
        let out = lines(Box::new(child.stdout.take().unwrap()));
        let err = lines(Box::new(child.stderr.take().unwrap()));
        let pid = child.id();
        let mut t = Tenant {
            child,
            out,
            err,
            region,
            pid,
        };
        assert_eq!(t.line(), "ready");
        t.wait_answer(OwnFreezeState::Running, 0);
        t
    }

    fn line(&mut self) -> String {
        match self.out.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => l,
            Err(_) => panic!("no line within 120 s; its log:\n{}", self.log().join("\n")),
        }
    }

    fn log(&mut self) -> Vec<String> {
        self.err.try_iter().collect()
    }

    /// Waits (at most 60 s) for a log line containing `text`; returns it.
    fn wait_log(&mut self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .err
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no log line {text:?} within 60 s"));
            if l.contains(text) {
                return l;
            }
        }
    }

    /// Its pattern, checked by its next CUDA calls (which thaw it if frozen).
    fn check_intact(&mut self, what: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "check").unwrap();
        assert_eq!(self.line(), "intact 0 0", "{what}");
    }

    /// Writes `mark` in the control block (as the agent does); returns the generation.
    fn mark(&self, mark: FreezeMark) -> u64 {
        let ctl = region::control_path(&self.region);
        let file = tenant_fs::open_no_links(&ctl, tenant_fs::Access::ReadWrite).unwrap();
        region::ControlWriter::new(&file)
            .unwrap()
            .update(|s| s.freeze = mark)
            .unwrap()
    }

    /// Waits (at most 60 s) until the slot answers `state` for `generation`; returns its bytes.
    fn wait_answer(&mut self, state: OwnFreezeState, generation: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let a = region::reader::RegionReader::open(&self.region)
                .ok()
                .and_then(|r| r.snapshot().ok())
                .and_then(|s| s.slots.iter().find(|s| s.pid == self.pid)?.own_freeze);
            if let Some(a) = a
                && a.state.state == state
                && a.state.answers(generation)
            {
                return a.bytes;
            }
            assert!(
                Instant::now() < deadline,
                "no answer {state:?} for generation {generation}: {a:?}; its log:\n{}",
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Freezes it at a new mark; returns the freeze's log line.
    fn freeze(&mut self) -> String {
        let g = self.mark(FreezeMark::InProcess);
        self.wait_answer(OwnFreezeState::Frozen, g);
        self.wait_log("frozen in-process:")
    }

    /// Thaws it at a `Running` mark (its memory given back at once, before the answer).
    fn thaw_by_mark(&mut self) {
        let g = self.mark(FreezeMark::Running);
        self.wait_answer(OwnFreezeState::Running, g);
    }

    /// Its open descriptors: number and what each names.
    fn fds(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let to = std::fs::read_link(e.path()).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    to.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        v.sort();
        v
    }

    /// Chunks of the stand-in pool it holds open.
    fn chunk_fds(&self) -> usize {
        self.fds()
            .iter()
            .filter(|(_, to)| to.contains("vgpu-test-chunk"))
            .count()
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A freeze borrows from the pool what its allocations hold (one chunk for 14 MiB), copies into
/// it, and answers frozen; the thaw at a call copies back word for word and gives the loan back
/// (its descriptor closed) 2 s later; a thaw at the `Running` mark gives it back before it
/// answers. Each freeze borrows anew.
#[test]
fn a_freeze_borrows_from_the_pool_and_every_word_survives() {
    let pool = Pool::start();
    let mut t = Tenant::start(&[8, 6], &pool.path);
    let before = t.fds();

    let line = t.freeze();
    assert!(
        line.contains("frozen in-process: 14680064 bytes moved to host memory in ")
            && line.ends_with("(the agent's pool: 1 chunks)"),
        "{line}"
    );
    assert_eq!(pool.requests(), vec![Request { bytes: 14 * MIB }]);
    assert_eq!(t.chunk_fds(), 1, "the loan is held while frozen");
    t.check_intact("thawed by its next call, from the loan");
    // Given back by the watcher 2 s after the thaw at a call.
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.fds() != before {
        assert!(Instant::now() < deadline, "{:?} != {before:?}", t.fds());
        std::thread::sleep(Duration::from_millis(50));
    }

    let line = t.freeze();
    assert!(line.ends_with("(the agent's pool: 1 chunks)"), "{line}");
    assert_eq!(pool.requests().len(), 2, "a loan per freeze");
    t.thaw_by_mark();
    assert_eq!(t.fds(), before, "given back before the thaw's answer");
    t.check_intact("thawed by the Running mark");
    t.finish();
}

/// 1022 MiB and 4 MiB laid out back to back take two chunks, and the second allocation straddles
/// their boundary: the simulated driver, like the real one, refuses a copy across the two
/// registrations, so the freeze's use of the pool (and the words intact) shows the copies split.
#[test]
fn a_copy_across_a_chunk_boundary_is_split() {
    let pool = Pool::start();
    let mut t = Tenant::start(&[1022, 4], &pool.path);
    let line = t.freeze();
    assert!(
        line.ends_with("(the agent's pool: 2 chunks)"),
        "{line}; {:?}",
        t.log()
    );
    assert_eq!(pool.requests(), vec![Request { bytes: 1026 * MIB }]);
    assert_eq!(t.chunk_fds(), 2);
    t.thaw_by_mark();
    assert_eq!(t.chunk_fds(), 0);
    t.check_intact("the straddling allocation, copied in two pieces each way");
    t.finish();
}

/// Without a pool (nothing at the socket's path) the freeze uses its own host memory and says
/// nothing of the pool; a pool that lends nothing usable (a refusal, fewer descriptors than
/// chunks, a chunk of the wrong size, bytes that are no reply, no answer within 3 s) leaves it
/// to its own memory too, says why once, and keeps no descriptor of the pool's. Every freeze
/// completes and every word survives.
#[test]
fn a_pool_that_lends_nothing_usable_leaves_the_freeze_to_its_own_memory() {
    let absent = fresh_region("no-pool").with_extension("sock");
    let mut t = Tenant::start(&[8], &absent);
    let line = t.freeze();
    assert!(line.ends_with("(own host memory)"), "{line}");
    t.thaw_by_mark();
    t.check_intact("no pool");
    let log = t.log();
    assert!(
        !log.iter().any(|l| l.contains("freeze pool")),
        "quiet without a pool: {log:?}"
    );
    t.finish();

    let pool = Pool::start();
    let mut t = Tenant::start(&[8], &pool.path);
    let before = t.fds();
    for (answer, why) in [
        (
            Answer::Refuse(Status::Empty),
            "the agent lent nothing: the pool has less populated now than asked",
        ),
        (
            Answer::FewerDescriptors,
            "0 descriptors came with a loan of 1 chunks",
        ),
        (
            Answer::WrongSize,
            "chunk 0 is not a regular file of 1073741824 bytes",
        ),
        (Answer::Garbage, "is not the freeze pool's"),
        (Answer::Silence, "the agent did not answer within 3 s"),
    ] {
        pool.answer(answer);
        let g = t.mark(FreezeMark::InProcess);
        let said = t.wait_log("the agent's freeze pool");
        assert!(said.contains(why), "{answer:?}: {said}");
        t.wait_answer(OwnFreezeState::Frozen, g);
        let line = t.wait_log("frozen in-process:");
        assert!(line.ends_with("(own host memory)"), "{answer:?}: {line}");
        assert_eq!(t.chunk_fds(), 0, "{answer:?}: no descriptor kept");
        t.thaw_by_mark();
        t.check_intact(&format!("{answer:?}"));
        assert_eq!(t.fds(), before, "{answer:?}");
    }
    assert_eq!(pool.requests().len(), 5);
    t.finish();
}
