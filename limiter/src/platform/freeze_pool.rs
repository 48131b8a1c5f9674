//! The agent's freeze pool, the limiter's side (the protocol is `region::freeze_pool`): host
//! memory the agent populated beforehand, borrowed for one in-process freeze so that the freeze
//! waits for the copy instead of for fresh pages (docs/oversubscription.md, "The host pool").
//!
//! - [`borrow`]: one exchange over the agent's Unix socket (3 s timeouts each way): the request,
//!   then a reply of [`REPLY_SIZE`] bytes with one descriptor per chunk (`SCM_RIGHTS`), each a
//!   regular file of exactly [`CHUNK_BYTES`]. Every descriptor received is closed on every error.
//! - [`Loan`]: the chunks mapped side by side in one reserved, 2 MiB-aligned range
//!   (`MAP_SHARED | MAP_FIXED | MAP_POPULATE`: the pages exist in the agent's tmpfs, so this only
//!   builds page tables), each registered with the driver on its own (`cuMemHostRegister`,
//!   portable) by up to [`REGISTER_THREADS`] threads, lowest chunk first, so that copies into
//!   chunk 0 start while later chunks still register. The real driver refuses a copy that spans
//!   two registrations (CUDA error 1), so [`Loan::save`] and [`Loan::restore`] split every copy
//!   at chunk boundaries and wait for each chunk's registration. [`Loan::save`] queues its copies:
//!   beside synchronous copies each registration took the copy's time more (45 ms per GiB
//!   instead of 25, H200 host, driver 580); queued, the copy of chunk `i` runs while chunk
//!   `i + 1` registers, and a 16 GiB freeze took 0.45-0.56 s instead of 0.72-0.78 s.
//! - [`Loan::release`] unregisters, unmaps and closes; [`Loan::forget`] (a forked child, whose
//!   parent's registrations and threads are not its own) only unmaps and closes.
//!
//! Only the bytes asked for are mapped and registered: the last chunk as far as they reach.

use std::{
    ffi::c_void,
    io::IoSliceMut,
    mem::MaybeUninit,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    path::Path,
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use region::freeze_pool::{
    CHUNK_BYTES, DEFAULT_SOCKET, MAX_CHUNKS, REPLY_SIZE, Reply, Request, Status, WireError,
};
use rustix::{
    io::Errno,
    net::{
        AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
        SendFlags, SocketAddrUnix, SocketFlags, SocketType, connect, recvmsg, send, socket_with,
        sockopt::{Timeout, set_socket_timeout},
    },
};

use super::{
    cuda::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUcontext, CUdeviceptr},
    driver::{Driver, sym},
    vmm::Code,
};

/// How long the agent has to accept, read the request and answer (each way): more than the
/// agent's own bound on measuring the asking process (2 s, `agent/src/freeze_pool/server.rs`)
/// plus its reply, so a slow measurement ends in the agent's refusal, not in this timeout.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(3);
/// The most threads that map and register one loan's chunks. The driver serialises
/// registrations (about 25 ms per chunk): on an H200 host (driver 580, 16 GiB in 16 chunks,
/// copies queued behind them) one thread had every chunk registered after 415-430 ms, two after
/// 393-421 ms, four after 540-570 ms (out of order, each registration slower), and the freeze
/// took 0.44-0.46 s, 0.44-0.48 s and 0.57-0.79 s (the copy back: 0.32 s).
pub(crate) const REGISTER_THREADS: usize = 2;
/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
const CU_MEMHOSTREGISTER_PORTABLE: u32 = 1;
/// The loan's alignment (a huge page of the agent's tmpfs).
const HUGE_PAGE: usize = 2 << 20;
/// The slices in which the mapping's page tables are dropped before the `munmap` (see
/// `HostBuffer::unmap`: `MADV_DONTNEED` holds the process's memory map only for reading).
const RELEASE_SLICE: usize = 64 << 20;
/// Bytes of one chunk, as an address offset.
const CHUNK: usize = CHUNK_BYTES as usize;

/// Why the pool lent nothing usable (the freeze then uses its own host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    #[error("no freeze pool socket")]
    NoPool,
    #[error("{step} failed (errno {errno})")]
    Io { step: &'static str, errno: i32 },
    #[error("the agent did not answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    #[error("the agent's reply ended after {got} of {REPLY_SIZE} bytes")]
    Short { got: usize },
    #[error("the agent's reply: {0}")]
    Wire(#[from] WireError),
    #[error("the agent lent nothing: {}", .0.reason())]
    Refused(Status),
    #[error("the agent lent {lent} chunks for a request of {asked}")]
    Count { lent: u32, asked: u32 },
    #[error("{got} descriptors came with a loan of {chunks} chunks")]
    Descriptors { got: usize, chunks: u32 },
    #[error(
        "chunk {index} is not a regular file of {CHUNK_BYTES} bytes (mode {mode:#o}, {size} bytes)"
    )]
    ChunkFile { index: usize, mode: u32, size: u64 },
    #[error("reserving {bytes} bytes of address space failed (errno {errno})")]
    Reserve { bytes: u64, errno: i32 },
    #[error("mapping chunk {index} failed (errno {errno})")]
    Map { index: usize, errno: i32 },
    #[error("cuMemHostRegister of chunk {index} failed with CUDA error {code}")]
    Register { index: usize, code: Code },
    #[error("chunk {index} was never registered (its threads ended)")]
    Stopped { index: usize },
    #[error("{call} of {bytes} bytes into the pool's memory failed with CUDA error {code}")]
    Copy {
        call: &'static str,
        bytes: u64,
        code: Code,
    },
    #[error("{bytes} bytes at offset {offset} are outside the loan")]
    Outside { offset: u64, bytes: u64 },
}

/// The socket: `VGPU_FREEZE_POOL_SOCKET` as the configuration read it, else the default.
pub(crate) fn socket_path(configured: Option<&Path>) -> &Path {
    configured.unwrap_or(Path::new(DEFAULT_SOCKET))
}

/// Chunks the agent lent: one descriptor each, checked to be a regular file of [`CHUNK_BYTES`].
#[derive(Debug)]
pub(crate) struct Lent {
    fds: Vec<OwnedFd>,
}

fn errno(step: &'static str) -> impl Fn(Errno) -> PoolError {
    move |e| PoolError::Io {
        step,
        errno: e.raw_os_error(),
    }
}

/// Asks the agent at `path` for host memory for `bytes` of device memory. [`PoolError::NoPool`]
/// when nothing is at `path` (no agent with a pool: the quiet case).
pub(crate) fn borrow(path: &Path, bytes: u64) -> Result<Lent, PoolError> {
    let request = Request { bytes };
    let asked = request.chunks();
    let addr = SocketAddrUnix::new(path).map_err(errno("the socket's path"))?;
    let sock = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(errno("socket"))?;
    // The send timeout bounds the connect too (a listener whose backlog is full).
    set_socket_timeout(&sock, Timeout::Send, Some(TIMEOUT)).map_err(errno("SO_SNDTIMEO"))?;
    set_socket_timeout(&sock, Timeout::Recv, Some(TIMEOUT)).map_err(errno("SO_RCVTIMEO"))?;
    let deadline = Instant::now() + TIMEOUT;
    let past = || Instant::now() >= deadline;
    loop {
        match connect(&sock, &addr) {
            Ok(()) => break,
            Err(Errno::NOENT) => return Err(PoolError::NoPool),
            Err(Errno::INTR) if !past() => {}
            Err(Errno::AGAIN | Errno::INTR) => return Err(PoolError::Timeout),
            Err(e) => return Err(errno("connect")(e)),
        }
    }
    let encoded = request.encode();
    let mut sent = 0;
    while sent < encoded.len() {
        // NOSIGNAL: a peer that closed gives EPIPE here, never a SIGPIPE to the application.
        match send(&sock, &encoded[sent..], SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) if !past() => {}
            Err(Errno::AGAIN | Errno::INTR) => return Err(PoolError::Timeout),
            Err(e) => return Err(errno("send")(e)),
        }
    }
    let (reply, fds) = receive(&sock, deadline)?;
    let reply = Reply::decode(&reply)?;
    if reply.status != Status::Lent {
        return Err(PoolError::Refused(reply.status));
    }
    if reply.chunks != asked {
        return Err(PoolError::Count {
            lent: reply.chunks,
            asked,
        });
    }
    if fds.len() != reply.chunks as usize {
        return Err(PoolError::Descriptors {
            got: fds.len(),
            chunks: reply.chunks,
        });
    }
    for (index, fd) in fds.iter().enumerate() {
        let st = rustix::fs::fstat(fd).map_err(errno("fstat"))?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        if !regular || st.st_size as u64 != reply.chunk_bytes {
            return Err(PoolError::ChunkFile {
                index,
                mode: st.st_mode,
                size: st.st_size as u64,
            });
        }
    }
    Ok(Lent { fds })
}

/// Reads the reply: exactly [`REPLY_SIZE`] bytes and the descriptors that come with them (owned
/// at once, so that any error closes them).
fn receive(
    sock: &OwnedFd,
    deadline: Instant,
) -> Result<([u8; REPLY_SIZE], Vec<OwnedFd>), PoolError> {
    let mut reply = [0u8; REPLY_SIZE];
    let mut fds = Vec::new();
    let mut space =
        [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_CHUNKS as usize))];
    let mut got = 0;
    while got < REPLY_SIZE {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut reply[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        let msg = match r {
            Ok(msg) => msg,
            Err(Errno::INTR) if Instant::now() < deadline => continue,
            Err(Errno::AGAIN | Errno::INTR) => return Err(PoolError::Timeout),
            Err(e) => return Err(errno("recvmsg")(e)),
        };
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            // More descriptors than a loan has: the kernel closed those that did not fit.
            return Err(PoolError::Descriptors {
                got: fds.len() + 1,
                chunks: MAX_CHUNKS,
            });
        }
        if msg.bytes == 0 {
            return Err(PoolError::Short { got });
        }
        got += msg.bytes;
    }
    Ok((reply, fds))
}

/// The state of one chunk of a loan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// No thread took it yet, or it is being mapped and registered.
    Pending,
    /// Mapped and registered: copies may use it (and the release unregisters it).
    Ready,
    /// Mapping or registering failed (what was mapped goes with the reservation).
    Failed(PoolError),
}

/// What the loan's threads share with it.
#[derive(Debug)]
struct Chunks {
    driver: &'static Driver,
    /// The context the chunks are registered (and unregistered) in.
    context: usize,
    /// The loan's start: 2 MiB-aligned, inside the reservation.
    base: usize,
    /// Bytes of each chunk mapped and registered (whole chunks; the last as far as the loan's
    /// bytes reach).
    lens: Vec<usize>,
    /// The chunks' descriptors (owned by the [`Loan`], which outlives its threads).
    fds: Vec<RawFd>,
    /// The next chunk a thread takes.
    next: AtomicUsize,
    /// Set by a release: the threads take no further chunk.
    stop: AtomicBool,
    /// Each chunk's state, and the threads still running (a chunk still pending once none runs
    /// will never be ready).
    states: Mutex<(Vec<Chunk>, usize)>,
    changed: Condvar,
}

impl Chunks {
    fn lock(&self) -> MutexGuard<'_, (Vec<Chunk>, usize)> {
        // Every write is one element or one count, whole: a panic while it was held left it
        // consistent.
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, index: usize, state: Chunk) {
        self.lock().0[index] = state;
        self.changed.notify_all();
    }

    /// Maps and registers chunks, lowest first, until none is left (a thread's work).
    fn work(&self) {
        loop {
            // Relaxed: a hint; the states' mutex orders what a chunk's waiter reads.
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            // Relaxed: only hands each chunk to one thread.
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.lens.len() {
                return;
            }
            let state = match self.map(index).and_then(|()| self.register(index)) {
                Ok(()) => Chunk::Ready,
                Err(e) => Chunk::Failed(e),
            };
            self.set(index, state);
        }
    }

    fn at(&self, index: usize) -> usize {
        self.base + index * CHUNK
    }

    fn map(&self, index: usize) -> Result<(), PoolError> {
        let (at, len) = (self.at(index), self.lens[index]);
        // SAFETY: replaces part of the reservation the loan made and owns (nothing else maps
        // there) with the chunk's file, which the loan keeps open; `len` is within the file.
        let p = unsafe {
            libc::mmap(
                at as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                self.fds[index],
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let errno = last_errno();
            // A failed fixed mapping may have unmapped the reservation there: fill it again, so
            // that nothing else is placed inside the range the release unmaps.
            // SAFETY: the same part of the loan's own reservation.
            unsafe {
                libc::mmap(
                    at as *mut c_void,
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            return Err(PoolError::Map { index, errno });
        }
        Ok(())
    }

    fn register(&self, index: usize) -> Result<(), PoolError> {
        let (at, len) = (self.at(index), self.lens[index]);
        let d = self.driver;
        d.with_context(self.context as CUcontext, || {
            let register = d
                .get::<sym::MemHostRegisterV2>()
                .ok_or(CUDA_ERROR_NOT_FOUND)?;
            // SAFETY: `len` bytes of this process's mapping of the chunk.
            match unsafe { register(at as *mut c_void, len, CU_MEMHOSTREGISTER_PORTABLE) } {
                CUDA_SUCCESS => Ok(()),
                code => Err(code),
            }
        })
        .map_err(|code| PoolError::Register { index, code })
    }

    /// Waits until chunk `index` is mapped and registered.
    fn ready(&self, index: usize) -> Result<(), PoolError> {
        let mut s = self.lock();
        loop {
            match s.0[index] {
                Chunk::Ready => return Ok(()),
                Chunk::Failed(e) => return Err(e),
                Chunk::Pending if s.1 == 0 => return Err(PoolError::Stopped { index }),
                Chunk::Pending => {
                    s = self
                        .changed
                        .wait_timeout(s, Duration::from_millis(100))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }
}

/// Counts a thread out when it ends, however it ends.
struct Running<'a>(&'a Chunks);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.lock().1 -= 1;
        self.0.changed.notify_all();
    }
}

/// Borrowed host memory, mapped and being registered: see the module documentation.
#[derive(Debug)]
pub(crate) struct Loan {
    shared: Arc<Chunks>,
    /// The reservation (one huge page longer than the chunks, for the alignment).
    raw: usize,
    raw_len: usize,
    /// Bytes usable from the start (what was asked for).
    bytes: u64,
    workers: Vec<JoinHandle<()>>,
    /// Closed last, after the threads that map them ended and the mapping is gone.
    fds: Vec<OwnedFd>,
}

/// One piece of a copy: the chunk, the offset in the loan, the offset in the copy, the bytes.
type Piece = (usize, u64, u64, u64);

/// `len` bytes at `offset` of the loan, split at chunk boundaries.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let mut done = 0;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let at = offset + done;
        let n = (CHUNK_BYTES - at % CHUNK_BYTES).min(len - done);
        let piece = ((at / CHUNK_BYTES) as usize, at, done, n);
        done += n;
        Some(piece)
    })
}

impl Loan {
    /// Reserves the range, and starts mapping and registering the chunks `lent` for `bytes`
    /// (registered in context `context`); returns at once.
    pub(crate) fn start(
        lent: Lent,
        bytes: u64,
        driver: &'static Driver,
        context: CUcontext,
    ) -> Result<Loan, PoolError> {
        let chunks = lent.fds.len();
        // Every chunk holds some of the bytes (as `borrow` checked the agent's answer).
        if bytes.div_ceil(CHUNK_BYTES) != chunks as u64 {
            return Err(PoolError::Outside { offset: 0, bytes });
        }
        let raw_len = chunks * CHUNK + HUGE_PAGE;
        // SAFETY: an anonymous private mapping at an address the kernel chooses, inaccessible: a
        // reservation the chunks are mapped into.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(PoolError::Reserve {
                bytes: raw_len as u64,
                errno: last_errno(),
            });
        }
        let raw = raw as usize;
        let lens = (0..chunks)
            .map(|i| CHUNK.min(bytes as usize - i * CHUNK))
            .collect();
        let shared = Arc::new(Chunks {
            driver,
            context: context as usize,
            base: raw.next_multiple_of(HUGE_PAGE),
            lens,
            fds: lent.fds.iter().map(AsRawFd::as_raw_fd).collect(),
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            states: Mutex::new((vec![Chunk::Pending; chunks], 0)),
            changed: Condvar::new(),
        });
        let mut loan = Loan {
            shared,
            raw,
            raw_len,
            bytes,
            workers: Vec::new(),
            fds: lent.fds,
        };
        for _ in 0..REGISTER_THREADS.min(chunks) {
            // Counted before it starts, so that a waiter never sees no thread while one starts.
            loan.shared.lock().1 += 1;
            let shared = Arc::clone(&loan.shared);
            let started = std::thread::Builder::new()
                .name("vgpu-pool".into())
                .spawn(move || {
                    let _running = Running(&shared);
                    shared.work();
                });
            match started {
                Ok(h) => loan.workers.push(h),
                Err(_) => {
                    loan.shared.lock().1 -= 1;
                    break;
                }
            }
        }
        if loan.workers.is_empty() {
            // No thread: this one does it all now.
            loan.shared.lock().1 += 1;
            let _running = Running(&loan.shared);
            loan.shared.work();
        }
        Ok(loan)
    }

    /// Bytes usable from the loan's start.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Chunks lent.
    pub(crate) fn chunks(&self) -> usize {
        self.fds.len()
    }

    /// The pieces of `len` bytes at `offset`, each once its chunk is ready, with its host address.
    fn ready_pieces(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<impl Iterator<Item = Result<(*mut c_void, u64, u64), PoolError>> + '_, PoolError>
    {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(PoolError::Outside { offset, bytes: len });
        }
        Ok(pieces(offset, len).map(|(chunk, at, done, n)| {
            self.shared.ready(chunk)?;
            Ok(((self.shared.base + at as usize) as *mut c_void, done, n))
        }))
    }

    /// Queues copies of `len` bytes of device memory at `src` into the loan at `offset` on the
    /// calling thread's current context's default stream, each once its chunk is registered;
    /// they are complete once that context has synchronised (queued, a copy runs while the
    /// next chunks register: the driver serialises a registration with a synchronous copy).
    pub(crate) fn save(&self, offset: u64, src: CUdeviceptr, len: u64) -> Result<(), PoolError> {
        for piece in self.ready_pieces(offset, len)? {
            let (host, done, n) = piece?;
            self.shared
                .driver
                .copy_to_host_async(host, src + done, n)
                .map_err(|code| PoolError::Copy {
                    call: "cuMemcpyDtoHAsync_v2",
                    bytes: n,
                    code,
                })?;
        }
        Ok(())
    }

    /// Copies `len` bytes at `offset` of the loan back to device memory at `dst`.
    pub(crate) fn restore(&self, offset: u64, dst: CUdeviceptr, len: u64) -> Result<(), PoolError> {
        for piece in self.ready_pieces(offset, len)? {
            let (host, done, n) = piece?;
            self.shared
                .driver
                .copy_to_device(dst + done, host, n)
                .map_err(|code| PoolError::Copy {
                    call: "cuMemcpyHtoD_v2",
                    bytes: n,
                    code,
                })?;
        }
        Ok(())
    }

    /// Copies `len` bytes at `offset` of the loan into host memory at `dst` (with the CPU).
    ///
    /// # Safety
    ///
    /// `dst` holds `len` writable bytes outside the loan.
    pub(crate) unsafe fn read(
        &self,
        offset: u64,
        dst: *mut c_void,
        len: u64,
    ) -> Result<(), PoolError> {
        for piece in self.ready_pieces(offset, len)? {
            let (host, done, n) = piece?;
            // SAFETY: `host` is `n` mapped bytes of the loan; the caller vouches for `dst`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    host.cast::<u8>(),
                    dst.cast::<u8>().add(done as usize),
                    n as usize,
                );
            }
        }
        Ok(())
    }

    /// Stops the threads and waits for them (a chunk being registered finishes first).
    fn join(&mut self) {
        // Relaxed: the join below is what orders the threads' last writes before ours.
        self.shared.stop.store(true, Ordering::Relaxed);
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }

    /// Unregisters every registered chunk (in the loan's context), unmaps and closes.
    pub(crate) fn release(mut self) {
        self.join();
        let s = &self.shared;
        let states = s.lock().0.clone();
        let _ = s.driver.with_context(s.context as CUcontext, || {
            if let Some(unregister) = s.driver.get::<sym::MemHostUnregister>() {
                for (i, _) in states
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c == Chunk::Ready)
                {
                    // SAFETY: the start `register` registered, in this context.
                    unsafe { unregister(s.at(i) as *mut c_void) };
                }
            }
            Ok(())
        });
        // Dropped here: unmapped, then closed.
    }

    /// Unmaps and closes without a driver call or a join: a forked child's copy of its parent's
    /// loan (the registrations and threads are the parent's).
    pub(crate) fn forget(mut self) {
        for h in self.workers.drain(..) {
            // The thread does not exist in this process: its handle is leaked, not joined.
            std::mem::forget(h);
        }
    }

    fn unmap(&mut self) {
        if self.raw == 0 {
            return;
        }
        for lo in (0..self.raw_len).step_by(RELEASE_SLICE) {
            // SAFETY: a slice of the loan's own reservation, whose contents nobody reads any
            // more (dropping a shared mapping's page tables leaves the file's pages alone).
            unsafe {
                libc::madvise(
                    (self.raw + lo) as *mut c_void,
                    RELEASE_SLICE.min(self.raw_len - lo),
                    libc::MADV_DONTNEED,
                )
            };
        }
        // SAFETY: the whole reservation `start` made, unmapped once (`raw` is cleared).
        unsafe { libc::munmap(self.raw as *mut c_void, self.raw_len) };
        self.raw = 0;
    }
}

impl Drop for Loan {
    /// A loan dropped without [`Loan::release`] (an error path) stops its threads and is at
    /// least unmapped and closed; the driver drops a registration whose memory is gone at the
    /// process's exit.
    fn drop(&mut self) {
        self.join();
        self.unmap();
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    //! The exchange against a stand-in agent on a socket of the test's own (the freeze that uses
    //! a loan, end to end over the simulated driver: `tests/freeze_pool.rs`).

    use std::{
        io::{IoSlice, Read},
        os::{
            fd::{AsFd, FromRawFd},
            unix::net::UnixListener,
        },
        path::PathBuf,
        sync::atomic::AtomicU64,
    };

    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, sendmsg};

    use super::*;

    #[test]
    fn copies_are_split_at_chunk_boundaries() {
        let c = CHUNK_BYTES;
        let all = |offset, len| pieces(offset, len).collect::<Vec<_>>();
        assert_eq!(all(0, 4 << 20), vec![(0, 0, 0, 4 << 20)]);
        assert_eq!(all(0, c), vec![(0, 0, 0, c)]);
        assert_eq!(
            all(c - (2 << 20), 4 << 20),
            vec![(0, c - (2 << 20), 0, 2 << 20), (1, c, 2 << 20, 2 << 20)]
        );
        assert_eq!(
            all(c / 2, 2 * c),
            vec![
                (0, c / 2, 0, c / 2),
                (1, c, c / 2, c),
                (2, 2 * c, c + c / 2, c / 2)
            ]
        );
        assert!(all(5, 0).is_empty());
        // Every piece stays in one chunk, and the pieces cover the copy once.
        for (offset, len) in [(0, 1), (c - 1, 2), (3 * c + 7, 5 * c + 11)] {
            let p = all(offset, len);
            assert_eq!(p.iter().map(|x| x.3).sum::<u64>(), len);
            for &(chunk, at, _, n) in &p {
                assert_eq!(at / c, chunk as u64);
                assert_eq!((at + n - 1) / c, chunk as u64);
            }
        }
    }

    #[test]
    fn the_variable_is_the_protocols() {
        assert_eq!(
            limiter_core::config::FREEZE_POOL_SOCKET,
            region::freeze_pool::SOCKET_ENV
        );
        assert_eq!(socket_path(None), Path::new(DEFAULT_SOCKET));
        assert_eq!(socket_path(Some(Path::new("/x"))), Path::new("/x"));
    }

    /// What the stand-in agent answers.
    #[derive(Clone, Copy)]
    enum Answer {
        /// `Reply::lent(chunks)` with `fds` memfds of `size` bytes.
        Lend { chunks: u32, fds: usize, size: u64 },
        /// A refusal.
        Refuse(Status),
        /// These bytes, no descriptor.
        Raw([u8; REPLY_SIZE]),
        /// Nothing, until the client hangs up.
        Silence,
        /// Half a reply, then the connection closes.
        Half,
    }

    fn unique(tag: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "vgpu-pool-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Descriptors of this process that are memfds named `name`.
    fn open_memfds(name: &str) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().contains(name))
            .count()
    }

    /// A memfd named `name` of `size` bytes (sparse).
    fn memfd(name: &str, size: u64) -> OwnedFd {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: a valid name; the descriptor returned is owned below.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a descriptor just created and owned nowhere else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        rustix::fs::ftruncate(&fd, size).unwrap();
        fd
    }

    /// Serves one connection at a fresh socket with `answer`; returns the path, the memfds'
    /// name, and the thread, which returns the request it read.
    fn serve(answer: Answer) -> (PathBuf, String, std::thread::JoinHandle<Vec<u8>>) {
        let path = std::env::temp_dir().join(unique("sock"));
        let name = unique("chunk");
        let listener = UnixListener::bind(&path).unwrap();
        let n = name.clone();
        let h = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = vec![0u8; region::freeze_pool::REQUEST_SIZE];
            conn.read_exact(&mut req).unwrap();
            match answer {
                Answer::Lend { chunks, fds, size } => {
                    let files: Vec<OwnedFd> = (0..fds).map(|_| memfd(&n, size)).collect();
                    let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
                    let mut space = vec![
                        MaybeUninit::<u8>::uninit();
                        rustix::cmsg_space!(ScmRights(fds.max(1)))
                    ];
                    let mut control = SendAncillaryBuffer::new(&mut space);
                    if fds > 0 {
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
                    // The server's own descriptors close here: only the client's copies remain.
                }
                Answer::Refuse(status) => {
                    send(&conn, &Reply::refused(status).encode(), SendFlags::NOSIGNAL).unwrap();
                }
                Answer::Raw(bytes) => {
                    send(&conn, &bytes, SendFlags::NOSIGNAL).unwrap();
                }
                Answer::Silence => {
                    let mut rest = Vec::new();
                    let _ = conn.read_to_end(&mut rest);
                }
                Answer::Half => {
                    send(
                        &conn,
                        &Reply::refused(Status::Empty).encode()[..10],
                        SendFlags::NOSIGNAL,
                    )
                    .unwrap();
                    conn.shutdown(std::net::Shutdown::Write).unwrap();
                }
            }
            // Wait for the client to hang up (its socket closed on every path).
            let mut rest = Vec::new();
            let _ = conn.read_to_end(&mut rest);
            req
        });
        (path, name, h)
    }

    #[test]
    fn a_loan_is_one_checked_file_per_chunk() {
        let (path, name, h) = serve(Answer::Lend {
            chunks: 2,
            fds: 2,
            size: CHUNK_BYTES,
        });
        let lent = borrow(&path, CHUNK_BYTES + (2 << 20)).unwrap();
        // The server's own descriptors are closed once it saw the connection end.
        let req = h.join().unwrap();
        assert_eq!(lent.fds.len(), 2);
        assert_eq!(open_memfds(&name), 2);
        drop(lent);
        assert_eq!(open_memfds(&name), 0, "closed with the loan");
        assert_eq!(
            Request::decode(&req),
            Ok(Request {
                bytes: CHUNK_BYTES + (2 << 20)
            })
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn no_socket_is_the_quiet_error() {
        let path = std::env::temp_dir().join(unique("absent"));
        assert_eq!(borrow(&path, 1 << 30).unwrap_err(), PoolError::NoPool);
        let missing_dir = path.join("sock");
        assert_eq!(
            borrow(&missing_dir, 1 << 30).unwrap_err(),
            PoolError::NoPool
        );
    }

    #[test]
    fn a_refusal_or_a_hostile_reply_is_an_error_and_leaves_no_descriptor() {
        let mut garbage = [0xa5u8; REPLY_SIZE];
        garbage[0] = b'X';
        let mut wrong_version = Reply::lent(1).encode();
        wrong_version[4] = 9;
        type Case = (Answer, u64, fn(&PoolError) -> bool);
        let cases: Vec<Case> = vec![
            (Answer::Refuse(Status::Empty), 1 << 30, |e| {
                *e == PoolError::Refused(Status::Empty)
            }),
            (
                Answer::Lend {
                    chunks: 2,
                    fds: 1,
                    size: CHUNK_BYTES,
                },
                2 << 30,
                |e| matches!(e, PoolError::Descriptors { got: 1, chunks: 2 }),
            ),
            (
                Answer::Lend {
                    chunks: 2,
                    fds: 3,
                    size: CHUNK_BYTES,
                },
                2 << 30,
                |e| matches!(e, PoolError::Descriptors { got: 3, chunks: 2 }),
            ),
            (
                Answer::Lend {
                    chunks: 2,
                    fds: 2,
                    size: CHUNK_BYTES - 4096,
                },
                2 << 30,
                |e| matches!(e, PoolError::ChunkFile { index: 0, .. }),
            ),
            (
                Answer::Lend {
                    chunks: 1,
                    fds: 1,
                    size: CHUNK_BYTES,
                },
                2 << 30,
                |e| matches!(e, PoolError::Count { lent: 1, asked: 2 }),
            ),
            (Answer::Raw(garbage), 1 << 30, |e| {
                matches!(e, PoolError::Wire(WireError::Magic(_)))
            }),
            (Answer::Raw(wrong_version), 1 << 30, |e| {
                *e == PoolError::Wire(WireError::Version(9))
            }),
            (Answer::Half, 1 << 30, |e| {
                *e == PoolError::Short { got: 10 }
            }),
        ];
        for (answer, bytes, expected) in cases {
            let (path, name, h) = serve(answer);
            let e = borrow(&path, bytes).unwrap_err();
            assert!(expected(&e), "{e}");
            h.join().unwrap();
            assert_eq!(open_memfds(&name), 0, "{e}: every descriptor closed");
            let _ = std::fs::remove_file(path);
        }
        // An agent that never answers: given up at the timeout.
        let (path, _name, h) = serve(Answer::Silence);
        let started = Instant::now();
        assert_eq!(borrow(&path, 1 << 30).unwrap_err(), PoolError::Timeout);
        let waited = started.elapsed();
        assert!(
            waited >= TIMEOUT && waited < TIMEOUT * 2,
            "gave up at the timeout: {waited:?}"
        );
        h.join().unwrap();
        let _ = std::fs::remove_file(path);
    }
}
