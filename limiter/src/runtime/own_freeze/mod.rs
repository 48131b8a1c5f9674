//! The in-process freeze (`VGPU_FREEZE_IN_PROCESS`, docs/oversubscription.md): the process
//! moves the device memory it allocated to host memory itself and gives it back to the GPU, and
//! maps it again at the same addresses at its next CUDA call.
//!
//! - [`backing`]: `cuMemAlloc` of at least 2 MiB is backed with the virtual memory API, so its
//!   physical memory can be released and created again under the same addresses.
//! - [`gate`]: every hooked call passes a gate that counts the calls in flight; a freeze closes
//!   it and waits until none is in flight (a call that already reached the driver may use the
//!   memory), then synchronises each context, so no work of the process touches the memory
//!   while it is away.
//! - The freeze runs on a watcher thread, started at the process's first CUDA call, which looks
//!   at the container's control block every [`WATCH_PERIOD`]: at the agent's mark
//!   (`FreezeMark::InProcess`) it saves every backed allocation to pinned host memory, releases
//!   its physical memory and answers in the slot (`own_freeze`); at a `Running` mark it thaws
//!   and answers. A call that finds the gate closed on a frozen process thaws it itself, on its
//!   own thread, before it goes on, and asks the agent (the region's thaw request) to thaw the
//!   container's other processes.
//! - The host memory: borrowed from the agent's freeze pool where there is one
//!   (`platform::freeze_pool`: populated beforehand, so the freeze waits for the copy only),
//!   asked for before the gate closes, the allocations laid out back to back in the loan; else,
//!   and for what the loan does not hold, the process's own (`HostBuffer`). The loan is the
//!   process's until it answers the thaw (the agent takes the pages back then): the copy back
//!   ends before `Running` is published, and the loan is not touched after it.
//!
//! ```text
//!   Running --(mark InProcess; no call in flight within DRAIN_LIMIT; saved)--> Frozen
//!   Running --(calls stayed in flight, or a driver call failed)--> Running (answers Failed)
//!   Frozen --(a hooked call, or a Running mark)--> Thawing --> Running
//! ```
//!
//! - [`created`]: device memory the application creates itself (`cuMemCreate`, `cuMemMap`,
//!   `cuMemSetAccess`) moves too: its handles are the limiter's, translated at every hooked
//!   call, and a thaw creates it again with its properties, mappings and access.
//!
//! What stays on the GPU: the CUDA context, allocations under 2 MiB, created memory that was
//! exported or is not mapped whole with its device's access, pools and managed memory. A thaw that
//! finds no room on the GPU waits for it (as the driver's restore would), logging once a minute.

mod backing;
mod created;
mod gate;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use region::{FreezeMark, OwnFreeze as Answer, OwnFreezeState, Region, Slot};

pub(crate) use self::backing::{Backing, MIN_BACKED};
pub(crate) use self::created::{CreatedTable, on_device, whole_prop};
use self::{backing::Saved, gate::Gate};
use super::control::Control;
use crate::platform::{
    cuda::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUcontext, CUdevice, CUdeviceptr},
    driver::Driver,
    freeze_pool::{self, Loan, PoolError},
    host_memory::{HostBuffer, HostMemoryError},
    log::{self, Level},
    os,
    vmm::Code,
};
pub(crate) use limiter_core::gate::Admitted;

/// How often the watcher looks at the control block.
pub(crate) const WATCH_PERIOD: Duration = Duration::from_millis(20);
/// How long a freeze waits for the calls in flight to end before it gives up.
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long a thaw waits between attempts when the GPU has no room.
const ROOM_RETRY: Duration = Duration::from_millis(20);
/// Attempts of a thaw step that fails for another reason than room.
const OTHER_ATTEMPTS: u32 = 3;
/// How long after a thaw at a call its host memory is given back: not while the application's
/// first calls after the thaw run (unregistering and unmapping 16 GiB takes 0.4 s of the
/// driver's and the kernel's time beside them).
const RELEASE_AFTER: Duration = Duration::from_secs(2);
/// How often a thaw waiting for room says so again.
const ROOM_LOG_PERIOD: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Freezing,
    /// Saved, for the mark of this generation.
    Frozen(u64),
    Thawing,
}

/// The process's in-process freeze: see the module documentation.
#[derive(Debug)]
pub(crate) struct OwnFreeze {
    pub(crate) backing: Backing,
    /// The memory the application creates itself (`cuMemCreate`): its handles translated, its
    /// mappings and access recorded. Locked after the backing's table, before the loan.
    pub(crate) created: CreatedTable,
    gate: Gate,
    phase: Mutex<Phase>,
    changed: Condvar,
    /// The answer last published (its word), republished with new byte counts.
    answer: AtomicU64,
    /// The process whose watcher runs (0: none yet; another pid: a forked child's parent).
    watcher: AtomicU32,
    /// The loan from the agent's pool that the allocations saved as [`Saved::Pool`] are in:
    /// from a freeze's start to the end of its thaw. Locked after the backing's table.
    loan: Mutex<Option<Loan>>,
    /// Host memory a thaw at a call copied from, and when that thaw ended: released by the
    /// watcher [`RELEASE_AFTER`] later.
    left: Mutex<Left>,
}

/// Host memory a thaw copied from, to be released.
#[derive(Debug, Default)]
struct Released {
    buffers: Vec<HostBuffer>,
    loans: Vec<Loan>,
}

/// What a thaw at a call left, and when that thaw ended.
#[derive(Debug, Default)]
struct Left {
    released: Released,
    since: Option<Instant>,
}

/// What a freeze saved, and where.
#[derive(Debug, Default)]
struct Moved {
    bytes: u64,
    /// Chunks of the agent's pool used (0: none).
    pool_chunks: usize,
    /// Bytes saved to the process's own host memory.
    own_bytes: u64,
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pool_chunks, self.own_bytes) {
            (0, _) => write!(f, "own host memory"),
            (k, 0) => write!(f, "the agent's pool: {k} chunks"),
            (k, own) => write!(
                f,
                "the agent's pool: {k} chunks; own host memory for {own} bytes"
            ),
        }
    }
}

/// Why an in-process freeze did not happen (the memory stayed on the GPU).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnFreezeError {
    #[error("CUDA calls stayed in flight for {} s", .0.as_secs())]
    Busy(Duration),
    #[error("{call} failed with CUDA error {code}")]
    Driver { call: &'static str, code: Code },
    #[error(transparent)]
    HostMemory(#[from] HostMemoryError),
    #[error(
        "the limiter backs {backed} of the {allocated} bytes this process's allocations hold \
         (memory from cuMemCreate that is exported or not mapped whole with its device's access, \
         pools or managed memory, and allocations under 2 MiB, cannot move in-process); the \
         driver's path moves it all"
    )]
    NotCovered { backed: u64, allocated: u64 },
}

/// Releases host memory buffers and loans (unregistered, unmapped, closed).
fn release_all(driver: &Driver, released: Released) {
    for b in released.buffers {
        b.release(driver);
    }
    for l in released.loans {
        l.release();
    }
}

/// A copy into or out of the loan failed: its driver code (a loan that cannot be used is
/// `CUDA_ERROR_INVALID_VALUE`, for the log).
fn pool_code(e: PoolError) -> Code {
    match e {
        PoolError::Copy { code, .. } | PoolError::Register { code, .. } => code,
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

/// What the in-process freeze needs of the process, handed in by the runtime (this module never
/// reaches the state or the process itself).
#[derive(Clone, Copy)]
pub(crate) struct Tenant {
    pub(crate) driver: &'static Driver,
    pub(crate) region: Option<(&'static Region, &'static Slot)>,
    /// The container's control block: the agent's freeze marks.
    pub(crate) control: Option<&'static Control>,
    /// What the process's allocations hold.
    pub(crate) held: &'static dyn Held,
    pub(crate) log: Level,
    /// The agent's freeze pool socket (`VGPU_FREEZE_POOL_SOCKET`, else the default path).
    pub(crate) pool: &'static std::path::Path,
}

/// What a process's allocations hold by its region's accounting, beyond its contexts (`None`:
/// no region to say).
pub(crate) trait Held: Sync {
    fn allocated_bytes(&self) -> Option<u64>;
}

/// The share of a process's allocations that must be backed for an in-process freeze to go on:
/// below it, too much would stay on the GPU, and the driver's path (which moves everything)
/// is the better one.
const COVERED_PERCENT: u64 = 90;

/// Whether `backed` bytes cover enough of the `allocated` ones (see [`COVERED_PERCENT`]).
fn covered(backed: u64, allocated: u64) -> Result<(), OwnFreezeError> {
    if backed.saturating_mul(100) >= allocated.saturating_mul(COVERED_PERCENT) {
        Ok(())
    } else {
        Err(OwnFreezeError::NotCovered { backed, allocated })
    }
}

impl OwnFreeze {
    pub(crate) fn new() -> OwnFreeze {
        OwnFreeze {
            backing: Backing::default(),
            created: CreatedTable::default(),
            gate: Gate::default(),
            phase: Mutex::new(Phase::Running),
            changed: Condvar::new(),
            answer: AtomicU64::new(
                Answer {
                    state: OwnFreezeState::Running,
                    generation: 0,
                }
                .encode(),
            ),
            watcher: AtomicU32::new(0),
            loan: Mutex::new(None),
            left: Mutex::new(Left::default()),
        }
    }

    fn lock_loan(&self) -> MutexGuard<'_, Option<Loan>> {
        // Written whole (taken or put): a panic while it was held left it consistent.
        self.loan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_left(&self) -> MutexGuard<'_, Left> {
        // As `lock_loan`.
        self.left.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // The phase is one word, written whole: a panic while it was held left it consistent.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the phase to change (at most 10 ms: the caller looks again either way).
    fn wait_for_change<'a>(&self, p: MutexGuard<'a, Phase>) -> MutexGuard<'a, Phase> {
        self.changed
            .wait_timeout(p, Duration::from_millis(10))
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    fn set_phase(&self, phase: Phase) {
        *self.lock() = phase;
        self.changed.notify_all();
    }

    /// Starts the watcher of this process (once per process: a forked child starts its own,
    /// with an empty table: its parent's allocations are not its own) and announces the path in
    /// the slot. Without a control block, or a thread that cannot be started, the path stays
    /// unannounced: the agent then freezes the container through the driver.
    pub(crate) fn start(&'static self, tenant: Tenant) {
        if tenant.control.is_none() {
            // Without a control block no mark can reach the process: not announced, so the
            // agent takes the driver's path (the block's own warning said why).
            return;
        }
        let me = os::pid() as u32;
        // Relaxed: one thread per process starts it (the runtime creates the process once).
        let before = self.watcher.swap(me, Ordering::Relaxed);
        if before == me {
            return;
        }
        if before != 0 {
            // The parent's: dropped without a driver call (each unmaps its copy of the pages;
            // a loan also closes its copies of the chunks' descriptors). A lock a thread of the
            // parent held at the fork stays held here: what it guards is leaked instead.
            self.backing.forget_all();
            self.created.forget_all();
            if let Ok(mut loan) = self.loan.try_lock()
                && let Some(l) = loan.take()
            {
                l.forget();
            }
            if let Ok(mut left) = self.left.try_lock() {
                let left = std::mem::take(&mut *left);
                // Host buffers unmap when dropped.
                drop(left.released.buffers);
                for l in left.released.loans {
                    l.forget();
                }
            }
            self.gate.open();
            self.set_phase(Phase::Running);
        }
        let started = std::thread::Builder::new()
            .name("vgpu-freeze".into())
            .spawn(move || self.watch(tenant));
        match started {
            Ok(_) => self.publish(tenant, OwnFreezeState::Running, 0),
            Err(e) => log::write(
                tenant.log,
                Level::Warn,
                format_args!(
                    "VGPU_FREEZE_IN_PROCESS: no watcher thread ({e}); this container is frozen \
                     through the driver instead"
                ),
            ),
        }
    }

    /// Counts the calling thread's hooked call in; while the process is frozen, thaws it first
    /// (`tenant` is asked for only then).
    #[inline]
    pub(crate) fn admit(&'static self, tenant: impl Fn() -> Tenant) -> Admitted<'static> {
        loop {
            if let Some(a) = self.gate.try_admit() {
                return a;
            }
            self.wait_at_gate(tenant());
        }
    }

    /// The gate is closed: waits for a freeze to end, or thaws a frozen process.
    #[cold]
    #[inline(never)]
    fn wait_at_gate(&self, tenant: Tenant) {
        let mut p = self.lock();
        loop {
            match *p {
                Phase::Running => return,
                Phase::Freezing | Phase::Thawing => {
                    p = self.wait_for_change(p);
                }
                Phase::Frozen(generation) => {
                    *p = Phase::Thawing;
                    drop(p);
                    let env = tenant;
                    let started = Instant::now();
                    let released = self.restore(env);
                    let mut l = self.lock_left();
                    l.released.buffers.extend(released.buffers);
                    l.released.loans.extend(released.loans);
                    l.since = Some(Instant::now());
                    drop(l);
                    self.publish(env, OwnFreezeState::Running, generation);
                    if let Some((region, _)) = env.region {
                        region.request_thaw(generation);
                    }
                    log::write(
                        env.log,
                        Level::Info,
                        format_args!(
                            "thawed in-process at a CUDA call in {} ms",
                            started.elapsed().as_millis()
                        ),
                    );
                    return;
                }
            }
        }
    }

    /// The watcher: answers the control block's freeze marks.
    fn watch(&'static self, tenant: Tenant) {
        let Some(control) = tenant.control else {
            return;
        };
        let mut seen = 0;
        loop {
            std::thread::sleep(WATCH_PERIOD);
            if self.watcher.load(Ordering::Relaxed) != os::pid() as u32 {
                return;
            }
            self.release_left(tenant.driver);
            let Some((generation, mark)) = control.freeze_mark_since(&mut seen) else {
                continue;
            };
            let env = tenant;
            match mark {
                FreezeMark::InProcess => self.freeze(env, generation),
                FreezeMark::Running => self.thaw_for_agent(env, generation),
                FreezeMark::Freezing | FreezeMark::Frozen => {}
            }
        }
    }

    /// Freezes the process for the mark of `generation` and answers.
    fn freeze(&self, env: Tenant, generation: u64) {
        {
            let mut p = self.lock();
            match *p {
                Phase::Running => *p = Phase::Freezing,
                Phase::Frozen(_) => {
                    *p = Phase::Frozen(generation);
                    drop(p);
                    self.publish(env, OwnFreezeState::Frozen, generation);
                    return;
                }
                Phase::Freezing | Phase::Thawing => return,
            }
        }
        let started = Instant::now();
        if let Some(held) = env.held.allocated_bytes()
            && let Err(e) = covered(self.bytes(), held)
        {
            self.set_phase(Phase::Running);
            self.publish(env, OwnFreezeState::Failed, generation);
            log::write(
                env.log,
                Level::Warn,
                format_args!("in-process freeze refused: {e}"),
            );
            return;
        }
        // Asked for while the application runs: the agent's answer and the chunks' mapping and
        // registration overlap the drain, the synchronisation and the first copies.
        let loan = self.borrow(env);
        let borrowed = started.elapsed();
        if !self.gate.close_and_drain(DRAIN_LIMIT) {
            if let Some(l) = loan {
                l.release();
            }
            self.set_phase(Phase::Running);
            self.publish(env, OwnFreezeState::Failed, generation);
            log::write(
                env.log,
                Level::Warn,
                format_args!(
                    "in-process freeze refused: {}",
                    OwnFreezeError::Busy(DRAIN_LIMIT)
                ),
            );
            return;
        }
        let drained = started.elapsed();
        match self.save(env, loan) {
            Ok(moved) => {
                self.set_phase(Phase::Frozen(generation));
                self.publish(env, OwnFreezeState::Frozen, generation);
                log::debug!(
                    env.log,
                    "in-process freeze: host memory asked for in {} ms, calls drained at {} ms, \
                     saved and released at {} ms",
                    borrowed.as_millis(),
                    drained.as_millis(),
                    started.elapsed().as_millis()
                );
                log::write(
                    env.log,
                    Level::Info,
                    format_args!(
                        "frozen in-process: {} bytes moved to host memory in {} ms ({moved})",
                        moved.bytes,
                        started.elapsed().as_millis()
                    ),
                );
            }
            Err(e) => {
                self.gate.open();
                self.set_phase(Phase::Running);
                self.publish(env, OwnFreezeState::Failed, generation);
                log::write(
                    env.log,
                    Level::Warn,
                    format_args!("in-process freeze failed: {e}; the memory stays on the GPU"),
                );
            }
        }
    }

    /// Thaws at the agent's `Running` mark of `generation` (if frozen) and answers.
    fn thaw_for_agent(&self, env: Tenant, generation: u64) {
        {
            let mut p = self.lock();
            loop {
                match *p {
                    Phase::Frozen(_) => {
                        *p = Phase::Thawing;
                        break;
                    }
                    Phase::Running => {
                        drop(p);
                        self.publish(env, OwnFreezeState::Running, generation);
                        return;
                    }
                    // A call is thawing it (a freeze runs on this thread): answer once it is
                    // done.
                    Phase::Freezing | Phase::Thawing => {
                        p = self.wait_for_change(p);
                    }
                }
            }
        }
        let released = self.restore(env);
        release_all(env.driver, released);
        self.publish(env, OwnFreezeState::Running, generation);
    }

    /// Borrows host memory from the agent's pool for the allocations on the GPU, and starts
    /// mapping and registering it; `None` (the freeze uses its own host memory) if there is no
    /// pool or it lends nothing usable.
    fn borrow(&self, env: Tenant) -> Option<Loan> {
        let (bytes, context) = self.backing.with_table(|t| {
            let ct = self.created.lock();
            let created = ct
                .handles
                .iter()
                .filter(|(h, c)| c.real != 0 && ct.copy_address(**h, c).is_some())
                .map(|(_, c)| (c.size, c.context));
            let mut on_gpu = t
                .values()
                .filter(|b| b.handle != 0)
                .map(|b| (b.size, b.context))
                .chain(created)
                .peekable();
            let context = on_gpu.peek().map(|&(_, c)| c);
            (on_gpu.map(|(size, _)| size).sum::<u64>(), context)
        });
        let context = context?;
        let loan = freeze_pool::borrow(env.pool, bytes)
            .and_then(|lent| Loan::start(lent, bytes, env.driver, context as CUcontext));
        match loan {
            Ok(l) => Some(l),
            Err(PoolError::NoPool) => {
                log::debug!(
                    env.log,
                    "no freeze pool at {}: own host memory",
                    env.pool.display()
                );
                None
            }
            Err(e) => {
                log::write(
                    env.log,
                    Level::Info,
                    format_args!(
                        "the agent's freeze pool ({}): {e}; own host memory instead",
                        env.pool.display()
                    ),
                );
                None
            }
        }
    }

    /// Saves every backed allocation, and every movable one the application created
    /// (`created`), to host memory (the `loan` where it holds it, else the process's own) and
    /// releases its physical memory, with the gate closed and drained; returns what was saved
    /// where. On an error nothing is lost: what was released is mapped again, and the host
    /// memory (the loan too) is released.
    fn save(&self, env: Tenant, loan: Option<Loan>) -> Result<Moved, OwnFreezeError> {
        let d = env.driver;
        let driver_err = |call| move |code| OwnFreezeError::Driver { call, code };
        // Where a failed save's restore finds it.
        *self.lock_loan() = loan;
        let saved = self.backing.with_table(|t| {
            let mut ct = self.created.lock();
            let ct = &mut *ct;
            // The created allocations that move, and the address each is copied through.
            let movable: BTreeMap<u64, CUdeviceptr> = ct
                .handles
                .iter()
                .filter(|(_, c)| c.real != 0)
                .filter_map(|(&h, c)| ct.copy_address(h, c).map(|va| (h, va)))
                .collect();
            let contexts: BTreeSet<usize> = t
                .values()
                .map(|b| b.context)
                .chain(movable.keys().map(|h| ct.handles[h].context))
                .collect();
            for c in contexts {
                d.with_context(c as CUcontext, || d.synchronize_checked())
                    .map_err(driver_err("cuCtxSynchronize"))?;
            }
            let mut moved = Moved::default();
            let mut items: Vec<Item<'_>> = t
                .iter_mut()
                .filter(|(_, b)| b.handle != 0)
                .map(|(&ptr, b)| Item {
                    ptr,
                    size: b.size,
                    context: b.context,
                    saved: &mut b.saved,
                })
                .chain(ct.handles.iter_mut().filter_map(|(h, c)| {
                    movable.get(h).map(|&ptr| Item {
                        ptr,
                        size: c.size,
                        context: c.context,
                        saved: &mut c.saved,
                    })
                }))
                .collect();
            let mut loan = self.lock_loan();
            if let Some(l) = loan.as_ref() {
                match save_to_loan(d, &mut items, l) {
                    Ok(0) => {}
                    Ok(_) => moved.pool_chunks = l.chunks(),
                    Err(e) => {
                        // The memory is all on the GPU still: the process's own host memory
                        // takes the loan's place.
                        for it in items.iter_mut() {
                            if matches!(it.saved, Some(Saved::Pool { .. })) {
                                *it.saved = None;
                            }
                        }
                        if let Some(l) = loan.take() {
                            l.release();
                        }
                        log::write(
                            env.log,
                            Level::Info,
                            format_args!("the agent's freeze pool: {e}; own host memory instead"),
                        );
                    }
                }
            }
            drop(loan);
            let mut failed = None;
            for it in items.iter_mut().filter(|it| it.saved.is_none()) {
                let buf = match HostBuffer::new(d, it.context as CUcontext, it.size) {
                    Ok(buf) => buf,
                    Err(e) => {
                        failed = Some(OwnFreezeError::HostMemory(e));
                        break;
                    }
                };
                let copied = d.with_context(it.context as CUcontext, || {
                    d.copy_to_host(buf.ptr(), it.ptr, it.size)
                });
                if let Err(code) = copied {
                    buf.release(d);
                    failed = Some(driver_err("cuMemcpyDtoH_v2")(code));
                    break;
                }
                *it.saved = Some(Saved::Own(buf));
                moved.own_bytes += it.size;
            }
            if let Some(f) = failed {
                for it in items.iter_mut() {
                    if let Some(Saved::Own(buf)) = it.saved.take() {
                        buf.release(d);
                    }
                }
                return Err(f);
            }
            drop(items);
            for (&ptr, b) in t.iter_mut().filter(|(_, b)| b.handle != 0) {
                let r = d
                    .vmm_unmap(ptr, b.size)
                    .map_err(driver_err("cuMemUnmap"))
                    .and_then(|()| d.vmm_release(b.handle).map_err(driver_err("cuMemRelease")));
                match r {
                    Ok(()) => {
                        b.handle = 0;
                        moved.bytes += b.size;
                    }
                    Err(f) => {
                        failed = Some(f);
                        break;
                    }
                }
            }
            if failed.is_none() {
                for &h in movable.keys() {
                    let mappings = ct.mappings_of(h);
                    // Listed from the table above; a panic must not cross into the application.
                    let Some(c) = ct.handles.get_mut(&h) else {
                        continue;
                    };
                    match created::release_created(d, c, &mappings) {
                        Ok(()) => {
                            c.real = 0;
                            moved.bytes += c.size;
                        }
                        Err((call, code)) => {
                            failed = Some(driver_err(call)(code));
                            break;
                        }
                    }
                }
            }
            match failed {
                None => Ok(moved),
                Some(f) => Err(f),
            }
        });
        if saved.is_err() {
            // Some were released before the failure: map them again.
            let released = self.restore(env);
            release_all(d, released);
        }
        saved
    }

    /// Maps new physical memory under every saved allocation (a created one with its
    /// properties, mappings and access) and copies it back, then opens the gate (`Running`).
    /// Waits for room as long as the GPU has none. Returns the host memory it copied from (the
    /// loan too), for the caller to release (off a thawing call's path: releasing 16 GiB takes
    /// 0.4 s); the loan is not used after.
    fn restore(&self, env: Tenant) -> Released {
        let d = env.driver;
        let mut last_room_log: Option<Instant> = None;
        let mut done = Released::default();
        self.backing.with_table(|t| {
            let mut loan = self.lock_loan();
            for (&ptr, b) in t.iter_mut().filter(|(_, b)| b.handle == 0) {
                let placed = until_placed(env, &mut last_room_log, ptr, b.size, b.device, || {
                    d.with_context(b.context as CUcontext, || {
                        let h = d.vmm_create(b.device, b.size)?;
                        if let Err(e) = d.vmm_map(ptr, b.size, h, b.device) {
                            let _ = d.vmm_release(h);
                            return Err(e);
                        }
                        if let Err(e) = copy_back(d, loan.as_ref(), ptr, b.size, &b.saved) {
                            let _ = d.vmm_unmap(ptr, b.size);
                            let _ = d.vmm_release(h);
                            return Err(e);
                        }
                        Ok(h)
                    })
                });
                if let Some(h) = placed {
                    b.handle = h;
                    if let Some(Saved::Own(buf)) = b.saved.take() {
                        done.buffers.push(buf);
                    }
                }
            }
            let mut ct = self.created.lock();
            let ct = &mut *ct;
            let frozen: Vec<u64> = ct
                .handles
                .iter()
                .filter(|(_, c)| c.real == 0 && c.saved.is_some())
                .map(|(&h, _)| h)
                .collect();
            for h in frozen {
                let mappings = ct.mappings_of(h);
                // Listed from the table above; a panic must not cross into the application.
                let Some(c) = ct.handles.get(&h) else {
                    continue;
                };
                let Some(va) = ct.copy_address(h, c) else {
                    log::write(
                        env.log,
                        Level::Error,
                        format_args!(
                            "in-process thaw: the allocation {h:#x} lost the mapping it was saved through; its copy kept"
                        ),
                    );
                    continue;
                };
                let device = c.prop.location.id;
                let placed = until_placed(env, &mut last_room_log, va, c.size, device, || {
                    let h = created::recreate(d, c, &mappings)?;
                    let copied = d.with_context(c.context as CUcontext, || {
                        copy_back(d, loan.as_ref(), va, c.size, &c.saved)
                    });
                    if let Err(e) = copied {
                        for (va, m) in &mappings {
                            let _ = d.vmm_unmap(*va, m.size);
                        }
                        let _ = d.vmm_release(h);
                        return Err(e);
                    }
                    created::drop_creation_reference(d, c, h);
                    Ok(h)
                });
                let Some(c) = ct.handles.get_mut(&h) else {
                    continue;
                };
                if let Some(new) = placed {
                    c.real = new;
                    if let Some(Saved::Own(buf)) = c.saved.take() {
                        done.buffers.push(buf);
                    }
                }
            }
            // A save that failed after copying left copies of memory still on the GPU: dropped,
            // so that the next freeze copies it afresh.
            let stale = t
                .values_mut()
                .filter(|b| b.handle != 0)
                .map(|b| &mut b.saved)
                .chain(
                    ct.handles
                        .values_mut()
                        .filter(|c| c.real != 0)
                        .map(|c| &mut c.saved),
                );
            for saved in stale {
                if let Some(Saved::Own(buf)) = saved.take() {
                    done.buffers.push(buf);
                }
            }
            // A copy kept in the loan moves to host memory of the process's own: the agent takes
            // the loan's pages back once the thaw is answered.
            let kept = t
                .iter_mut()
                .map(|(&ptr, b)| (ptr, b.size, b.context, &mut b.saved))
                .chain(
                    ct.handles
                        .iter_mut()
                        .filter(|(_, c)| c.real == 0)
                        .map(|(&h, c)| (h, c.size, c.context, &mut c.saved)),
                );
            for (ptr, size, context, saved) in kept {
                let Some(Saved::Pool { offset }) = *saved else {
                    continue;
                };
                *saved = None;
                let kept = loan.as_ref().ok_or(None).and_then(|l| {
                    let buf = HostBuffer::new(d, context as CUcontext, size)
                        .map_err(|e| Some(e.to_string()))?;
                    // SAFETY: the buffer holds `size` writable bytes of its own.
                    match unsafe { l.read(offset, buf.ptr(), size) } {
                        Ok(()) => Ok(buf),
                        Err(e) => {
                            buf.release(d);
                            Err(Some(e.to_string()))
                        }
                    }
                });
                match kept {
                    Ok(buf) => *saved = Some(Saved::Own(buf)),
                    Err(why) => log::write(
                        env.log,
                        Level::Error,
                        format_args!(
                            "in-process thaw: the copy of {size} bytes at {ptr:#x} could not leave the agent's pool ({}); that allocation's content is lost",
                            why.as_deref().unwrap_or("no loan")
                        ),
                    ),
                }
            }
            done.loans.extend(loan.take());
        });
        self.gate.open();
        self.set_phase(Phase::Running);
        done
    }

    /// Bytes that can move: the backed allocations and the movable created ones (the 90% rule
    /// and the slot's figure).
    pub(crate) fn bytes(&self) -> u64 {
        self.backing.bytes() + self.created.movable_bytes()
    }

    /// Releases host memory a thawing call left (see [`OwnFreeze::restore`]) once
    /// [`RELEASE_AFTER`] has passed since that thaw; the watcher's work.
    fn release_left(&self, driver: &Driver) {
        let mut l = self.lock_left();
        if l.since.is_some_and(|t| t.elapsed() >= RELEASE_AFTER) {
            let left = std::mem::take(&mut *l);
            drop(l);
            release_all(driver, left.released);
        }
    }

    /// Publishes `state` for `generation` in the slot, with the bytes backed.
    fn publish(&self, env: Tenant, state: OwnFreezeState, generation: u64) {
        let word = Answer { state, generation }.encode();
        // Relaxed: the slot's own Release store publishes it; this copy is for `republish`.
        self.answer.store(word, Ordering::Relaxed);
        if let Some((region, slot)) = env.region {
            region.publish_own_freeze(slot, Answer { state, generation }, self.bytes());
        }
    }

    /// Republishes the last answer with the bytes backed now (after an allocation or a free).
    pub(crate) fn republish(&self, region: Option<(&Region, &Slot)>) {
        let Some((region, slot)) = region else {
            return;
        };
        // Relaxed: see `publish`.
        if let Some(answer) = Answer::decode(self.answer.load(Ordering::Relaxed)) {
            region.publish_own_freeze(slot, answer, self.bytes());
        }
    }
}

/// One allocation a freeze saves: the address its copy is made through, its size and context,
/// and where its copy goes (a backed allocation's or a created one's).
struct Item<'a> {
    ptr: CUdeviceptr,
    size: u64,
    context: usize,
    saved: &'a mut Option<Saved>,
}

/// Runs a thaw step `place` for `size` bytes at `ptr` on `device` until it succeeds: waits for
/// room as long as the GPU has none (a warning every [`ROOM_LOG_PERIOD`]), gives up after
/// [`OTHER_ATTEMPTS`] other failures (`None`: the allocation stays unmapped, its copy kept).
fn until_placed<T>(
    env: Tenant,
    last_room_log: &mut Option<Instant>,
    ptr: CUdeviceptr,
    size: u64,
    device: CUdevice,
    mut place: impl FnMut() -> Result<T, Code>,
) -> Option<T> {
    let mut other_failures = 0;
    loop {
        match place() {
            Ok(v) => return Some(v),
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                if last_room_log.is_none_or(|t| t.elapsed() >= ROOM_LOG_PERIOD) {
                    *last_room_log = Some(Instant::now());
                    log::write(
                        env.log,
                        Level::Warn,
                        format_args!(
                            "in-process thaw waits for {size} bytes of room on device {device}"
                        ),
                    );
                }
                std::thread::sleep(ROOM_RETRY);
            }
            Err(code) => {
                other_failures += 1;
                if other_failures >= OTHER_ATTEMPTS {
                    log::write(
                        env.log,
                        Level::Error,
                        format_args!(
                            "in-process thaw of {size} bytes at {ptr:#x} failed {other_failures} times (CUDA error {code}); that allocation stays unmapped, its copy kept"
                        ),
                    );
                    return None;
                }
                std::thread::sleep(ROOM_RETRY);
            }
        }
    }
}

/// Copies the allocations on the GPU into the loan, back to back in the items' order, each
/// where it fits whole (one made since the loan was asked for may not: it is left to the
/// process's own host memory), and waits for the copies, failed or not (nothing of the loan is
/// released while a copy into it is queued); returns the bytes copied.
fn save_to_loan(d: &Driver, items: &mut [Item<'_>], loan: &Loan) -> Result<u64, PoolError> {
    let mut offset = 0;
    let mut queued = BTreeSet::new();
    let mut failed = None;
    for it in items.iter_mut() {
        if offset + it.size > loan.bytes() {
            continue;
        }
        queued.insert(it.context);
        let r = d
            .with_context(it.context as CUcontext, || {
                Ok(loan.save(offset, it.ptr, it.size))
            })
            .unwrap_or_else(|code| {
                Err(PoolError::Copy {
                    call: "cuCtxSetCurrent",
                    bytes: 0,
                    code,
                })
            });
        if let Err(e) = r {
            failed = Some(e);
            break;
        }
        *it.saved = Some(Saved::Pool { offset });
        offset += it.size;
    }
    for c in queued {
        let synced = d.with_context(c as CUcontext, || d.synchronize_checked());
        if let (Err(code), None) = (synced, failed) {
            failed = Some(PoolError::Copy {
                call: "cuCtxSynchronize",
                bytes: 0,
                code,
            });
        }
    }
    match failed {
        None => Ok(offset),
        Some(e) => Err(e),
    }
}

/// Copies an allocation's saved copy back to its device memory at `ptr` (in the current
/// context).
fn copy_back(
    d: &Driver,
    loan: Option<&Loan>,
    ptr: CUdeviceptr,
    size: u64,
    saved: &Option<Saved>,
) -> Result<(), Code> {
    match saved {
        Some(Saved::Own(buf)) => d.copy_to_device(ptr, buf.ptr(), size),
        Some(Saved::Pool { offset }) => loan
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .restore(*offset, ptr, size)
            .map_err(pool_code),
        None => Ok(()),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freeze_needs_nine_tenths_of_the_allocations_backed() {
        assert!(covered(0, 0).is_ok(), "nothing to move");
        assert!(covered(90, 100).is_ok());
        assert!(covered(100, 100).is_ok());
        assert!(matches!(
            covered(89, 100),
            Err(OwnFreezeError::NotCovered {
                backed: 89,
                allocated: 100
            })
        ));
        assert!(
            covered(0, 2 << 30).is_err(),
            "a JAX process: all of it from cuMemCreate"
        );
        assert!(covered(u64::MAX, u64::MAX).is_ok(), "no overflow");
    }
}
