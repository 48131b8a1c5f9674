//! The runtime layer: the process-wide state, all of it in one static ([`Runtime`]), reached one
//! way: [`get`].
//!
//! - The hot line ([`HotLine`]): the line every hook reads first, in the library's `.data.hot`
//!   section (see `hints`): the published state and process, the thread words' offset, and the
//!   addresses `hints` prefetches on entry.
//! - The [`state::State`], initialised by the first intercepted CUDA call; the bound driver and
//!   glibc's `dlsym`, bound lazily (a `dlsym` lookup may need them before the state exists); the
//!   bound NVML; the panic counter.
//! - This process's accounting ([`process::Process`]), created at its first hooked call, again in
//!   a forked child.
//!
//! Below this module, the runtime's pieces ([`state`], [`process`], [`ledger`], [`control`],
//! [`sm_feedback`], [`qos`], [`gpu_time`], [`backlog`], [`own_freeze`]) never reach the static: what they need of it is handed to them (the state
//! holds the driver, the panic counter and the thread words' offset). Nothing runs at load time:
//! no constructor, no thread, no file.

pub(crate) mod backlog;
pub(crate) mod control;
pub(crate) mod gpu_time;
pub(crate) mod ledger;
pub(crate) mod own_freeze;
pub(crate) mod process;
pub(crate) mod qos;
pub(crate) mod sm_feedback;
pub(crate) mod state;

use std::{
    ptr,
    sync::{
        OnceLock,
        atomic::{AtomicPtr, AtomicUsize, Ordering},
    },
};

use limiter_core::config::Config;

use self::{
    own_freeze::Tenant,
    process::Process,
    state::{Services, State},
};
use crate::platform::{
    clock::{self, LazyClock},
    cuda::{CUDA_ERROR_NOT_INITIALIZED, CUresult},
    driver::{BindError, DlsymFn, Driver, find_real_dlsym},
    freeze_pool,
    guard::{Panics, Reentry},
    log::{self, Level},
    nvml::Nvml,
    os,
    thread_words::{ThreadWords, Tls},
};

/// What the in-process freeze needs of this process (`own_freeze::Tenant`).
pub(crate) fn own_freeze_tenant(state: &'static State, process: &'static Process) -> Tenant {
    Tenant {
        driver: state.driver,
        region: process.region_slot(),
        control: state.control(),
        held: process,
        log: state.log_level(),
        pool: freeze_pool::socket_path(state.config.freeze_pool_socket.as_deref()),
    }
}

/// The one cache line every hook reads first. Each field says what pairs with what.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct HotLine {
    /// The process-wide state once initialised successfully, else null. Published with Release
    /// after [`Runtime::state`] holds it; read with Acquire (the pairing makes its fields
    /// visible).
    state: AtomicPtr<State>,
    /// This process's accounting; null before its first CUDA call and in a freshly forked child.
    /// Published with Release after the `Process` is fully built, read with Acquire.
    process: AtomicPtr<Process>,
    /// Where the thread words are.
    tls: Tls,
    /// What `hints` prefetches on entry (0 = unknown): the slot's first line, device 0's
    /// container reservation word, the address table's buckets. Relaxed: hints.
    entry_lines: [AtomicUsize; 3],
}

const _: () = assert!(size_of::<HotLine>() == 64);

/// The limiter's process-wide state: see the module documentation.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Runtime {
    hot: HotLine,
    state: OnceLock<Result<State, CUresult>>,
    driver: OnceLock<Result<Driver, BindError>>,
    /// glibc's `dlsym` (0 until found). Written with Release after a successful lookup, read
    /// with Acquire: the pairing makes the pointer's target (in an already-loaded libc) valid to
    /// call; a racing second lookup stores the same value.
    real_dlsym: AtomicUsize,
    nvml: OnceLock<Option<Nvml>>,
    panics: Panics,
}

// The state, the driver table and the rest stay within the page of `.data.hot` (`build.rs`).
const _: () = assert!(size_of::<Runtime>() <= 4096);

/// The limiter's one static, in `.data.hot` (page-aligned by `build.rs`).
#[unsafe(link_section = ".data.hot.vgpu")]
static RUNTIME: Runtime = Runtime::new();

/// The runtime: its address computed PC-relative, without the GOT (`platform::direct`).
#[inline(always)]
pub(crate) fn get() -> &'static Runtime {
    direct!(RUNTIME)
}

impl Runtime {
    pub(crate) const fn new() -> Runtime {
        Runtime {
            hot: HotLine {
                state: AtomicPtr::new(ptr::null_mut()),
                process: AtomicPtr::new(ptr::null_mut()),
                tls: Tls::new(),
                entry_lines: [const { AtomicUsize::new(0) }; 3],
            },
            state: OnceLock::new(),
            driver: OnceLock::new(),
            real_dlsym: AtomicUsize::new(0),
            nvml: OnceLock::new(),
            panics: Panics::new(),
        }
    }

    /// The calling thread's words.
    #[inline(always)]
    pub(crate) fn words(&'static self) -> &'static ThreadWords {
        self.hot.tls.words()
    }

    /// Marks the calling thread as inside the limiter, or `None` if it already is.
    #[inline(always)]
    pub(crate) fn enter(&'static self) -> Option<Reentry> {
        Reentry::enter(self.words())
    }

    /// Runs `f`, turning a panic into `None` (counted).
    #[inline]
    pub(crate) fn shield<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        self.panics.shield(f)
    }

    /// Panics caught so far.
    #[cfg(test)]
    pub(crate) fn panics(&self) -> u64 {
        self.panics.count()
    }

    /// The hint addresses `hints` prefetches on entry (see [`HotLine::entry_lines`]).
    #[inline(always)]
    pub(crate) fn entry_lines(&self) -> &[AtomicUsize; 3] {
        &self.hot.entry_lines
    }

    /// The hot line's address (a line every hook reads).
    #[inline(always)]
    pub(crate) fn hot_line(&self) -> usize {
        ptr::from_ref(&self.hot) as usize
    }

    /// The state if it is published already: one load, nothing that can panic.
    #[inline(always)]
    pub(crate) fn state(&self) -> Option<&'static State> {
        // Acquire: pairs with the Release store in `state_or_init`.
        let ready = self.hot.state.load(Ordering::Acquire);
        // SAFETY: a non-null pointer points into `self.state` of a runtime that lives as long as
        // the process, initialised and never changed again.
        unsafe { ready.as_ref() }
    }

    /// The state, initialised by the first caller, or the initialisation's error. The guard
    /// proves the caller is inside the limiter, so that a hooked call made by the driver while it
    /// loads on this thread does not re-enter here.
    #[cold]
    #[inline(never)]
    pub(crate) fn state_or_init(
        &'static self,
        guard: &Reentry,
    ) -> Result<&'static State, CUresult> {
        let state = self
            .state
            .get_or_init(|| self.init(guard))
            .as_ref()
            .map_err(|&c| c)?;
        // Release: pairs with the Acquire load in `state`.
        self.hot
            .state
            .store(ptr::from_ref(state).cast_mut(), Ordering::Release);
        Ok(state)
    }

    /// Reads the configuration, binds the driver and builds the state; registers the fork and
    /// exit handlers.
    fn init(&'static self, guard: &Reentry) -> Result<State, CUresult> {
        let started = std::time::Instant::now();
        let cpu = clock::thread_cpu_ns();
        // Calibrated until the first conversion (after this call's driver call), not spun out.
        let clock = LazyClock::start();
        let config = match Config::from_vars(std::env::vars_os()) {
            Ok(c) => c,
            Err(e) => {
                log::emit(
                    Level::Error,
                    format_args!(
                        "configuration error: {e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"
                    ),
                );
                return Err(CUDA_ERROR_NOT_INITIALIZED);
            }
        };
        let driver = match self.driver(guard) {
            Ok(d) => d,
            Err(e) => {
                log::emit(
                    Level::Error,
                    format_args!("{e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"),
                );
                return Err(CUDA_ERROR_NOT_INITIALIZED);
            }
        };
        let level = config.log_level;
        let services = Services {
            driver,
            panics: &self.panics,
            tls: &self.hot.tls,
        };
        let state = State::new(config, clock, services);
        self.register_handlers(level);
        // Start-up cost figures (`scripts/gpu/bench-limiter.sh` reads them): wall time, and the
        // thread's CPU time (the rest is waiting: descheduled, or for another process).
        log::write(
            level,
            Level::Info,
            format_args!(
                "initialised in {} us (cpu {} us): memory limits {:?}",
                started.elapsed().as_micros(),
                clock::thread_cpu_ns().saturating_sub(cpu) / 1000,
                state.config.memory_limit
            ),
        );
        Ok(state)
    }

    /// This process's accounting if it exists already (the launch path).
    #[inline(always)]
    pub(crate) fn process(&self) -> Option<&'static Process> {
        // Acquire: pairs with the Release half of the publishing compare-and-swap.
        // SAFETY: a non-null pointer was leaked from a `Box<Process>` and is never freed.
        unsafe { self.hot.process.load(Ordering::Acquire).as_ref() }
    }

    /// This process's accounting, created at the first call (again in a forked child).
    #[inline(always)]
    pub(crate) fn process_or_create(&self, state: &'static State) -> &'static Process {
        match self.process() {
            Some(p) => p,
            None => self.create_process(state),
        }
    }

    #[cold]
    #[inline(never)]
    fn create_process(&self, state: &'static State) -> &'static Process {
        let fresh: *mut Process = Box::into_raw(Box::new(Process::new(state)));
        // AcqRel: Release publishes `fresh`; Acquire on failure makes the winner's fields visible.
        let published = self.hot.process.compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        match published {
            Ok(_) => {
                // SAFETY: just leaked, never freed.
                let process = unsafe { &*fresh };
                for (cell, line) in self.hot.entry_lines.iter().zip(process.entry_lines()) {
                    // Relaxed: a hint (see `HotLine::entry_lines`).
                    cell.store(line, Ordering::Relaxed);
                }
                // A forked child gets its own SM feedback thread (threads do not survive fork).
                state.start();
                if let Some(own) = state.own_freeze {
                    own.start(own_freeze_tenant(state, process));
                }
                process
            }
            Err(winner) => {
                // Another thread created it first: give our slot back and use theirs.
                // SAFETY: `fresh` was never published, so this thread owns it exclusively.
                let lost = unsafe { Box::from_raw(fresh) };
                lost.retire(state.log_level());
                // SAFETY: the winner's pointer is a leaked `Box<Process>`, never freed.
                unsafe { &*winner }
            }
        }
    }

    /// After `fork()`, in the child (single-threaded there): forgets the parent's accounting
    /// without touching its locks; the child's first CUDA call builds its own.
    fn forget_process(&self) {
        // Relaxed: the child has one thread; the next creation publishes with Release.
        self.hot.process.store(ptr::null_mut(), Ordering::Relaxed);
    }

    /// At exit: retires this process's slot, returning everything it still holds.
    fn retire_process(&self) {
        if let (Some(state), Some(p)) = (self.state(), self.process()) {
            let _ = self.shield(|| p.retire(state.log_level()));
        }
    }

    /// Registers the fork and exit handlers; called once, at initialisation (never at load).
    fn register_handlers(&self, level: Level) {
        let (fork_failed, exit_failed) = os::register_lifetime_handlers(on_fork_child, on_exit);
        if fork_failed {
            log::write(level, Level::Warn, format_args!("pthread_atfork failed"));
        }
        if exit_failed {
            log::write(level, Level::Warn, format_args!("atexit failed"));
        }
    }

    /// The bound driver, binding it the first time. The caller holds the re-entrancy guard, so a
    /// `dlsym` or hooked call that libcuda's constructors make on this thread while it loads goes
    /// straight to glibc/the driver instead of re-entering the binding.
    pub(crate) fn driver(
        &'static self,
        _guard: &Reentry,
    ) -> Result<&'static Driver, &'static BindError> {
        self.driver
            .get_or_init(|| Driver::open(self.real_dlsym().ok_or(BindError::NoRealDlsym)?))
            .as_ref()
    }

    /// The driver if already bound, without binding.
    #[inline]
    pub(crate) fn bound_driver(&self) -> Option<&Driver> {
        self.driver.get().and_then(|r| r.as_ref().ok())
    }

    /// glibc's `dlsym`, never this library's export; found once.
    pub(crate) fn real_dlsym(&self) -> Option<DlsymFn> {
        let p = self.real_dlsym.load(Ordering::Acquire);
        if p != 0 {
            // SAFETY: a non-zero value was stored from a `DlsymFn` below.
            return Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) });
        }
        let f = find_real_dlsym()?;
        // Release: see the field.
        self.real_dlsym.store(f as usize, Ordering::Release);
        Some(f)
    }

    /// The real NVML, bound the first time it is asked for (`None`: it cannot be opened).
    pub(crate) fn nvml(&self) -> Option<&Nvml> {
        self.nvml
            .get_or_init(|| self.real_dlsym().and_then(Nvml::open))
            .as_ref()
    }
}

#[cfg(test)]
impl Runtime {
    /// A runtime whose state is `state` (built by the test, not from the environment).
    pub(crate) fn with_state(state: &'static State) -> &'static Runtime {
        let rt: &'static Runtime = Box::leak(Box::new(Runtime::new()));
        rt.hot
            .state
            .store(ptr::from_ref(state).cast_mut(), Ordering::Release);
        rt
    }

    /// What `on_fork_child` does, on this runtime.
    pub(crate) fn after_fork_in_child(&self) {
        self.forget_process();
    }

    /// What `on_exit` does, on this runtime.
    pub(crate) fn at_exit(&self) {
        self.retire_process();
    }
}

/// `pthread_atfork` child handler: the child is single-threaded here; it forgets the parent's
/// accounting (never touching its locks) and builds its own at its first CUDA call.
extern "C" fn on_fork_child() {
    get().forget_process();
}

/// `atexit` handler: retires this process's slot. Runs in a forked child too, for the child's own
/// `Process` (or none). Never unwinds (the retirement is shielded).
extern "C" fn on_exit() {
    get().retire_process();
}

#[cfg(test)]
mod tests {
    //! The runtime's process lifecycle and run-time limit changes, in process over the fake driver of
    //! `test_support`: what a forked child and an exit do to this process's accounting, a creation
    //! race, and a control block change reaching the SM controller and the region.

    use std::sync::Barrier;

    use agent_common::api::ApiId;
    use limiter_core::accounting::{Accounting as _, Call};
    use region::{ControlWriter, control_path, reader::SlotPhase};

    use super::Runtime;
    use crate::test_support::{Cx, config};

    const MIB: u64 = 1 << 20;

    fn alloc_call() -> Call {
        Call {
            latency_ns: 1_000,
            ok: true,
            bytes_allocated: MIB,
            bytes_freed: 0,
            bytes_moved: 0,
        }
    }

    #[test]
    fn a_forked_child_forgets_the_parents_accounting_and_exit_returns_its_own() {
        let cx = Cx::new(config(1 << 30), "fork");
        let rt = Runtime::with_state(cx.state);
        let api = ApiId::from_name("cuMemAlloc_v2").unwrap();
        let parent = rt.process_or_create(cx.state);
        assert!(std::ptr::eq(rt.process().unwrap(), parent));
        assert_eq!(
            rt.entry_lines()[2].load(std::sync::atomic::Ordering::Relaxed),
            parent.ptrs.base(),
            "the hints know the table"
        );
        parent.ledger.try_reserve(0, 64 * MIB).unwrap();
        parent.ledger.record(api, alloc_call(), || 10);
        // The child handler: the parent's accounting is forgotten, not torn down.
        rt.after_fork_in_child();
        assert!(rt.process().is_none());
        let child = rt.process_or_create(cx.state);
        assert!(!std::ptr::eq(child, parent));
        let (_, parent_slot) = parent.region_slot().unwrap();
        let (_, child_slot) = child.region_slot().unwrap();
        assert_ne!(parent_slot.index(), child_slot.index(), "its own slot");
        child.ledger.try_reserve(0, 32 * MIB).unwrap();
        // This thread's writer belonged to the parent's ledger: the child's record lands in its own
        // slot.
        child.ledger.record(api, alloc_call(), || 10);
        let snap = cx.snapshot();
        for slot in [parent_slot.index(), child_slot.index()] {
            let s = snap.slots.iter().find(|s| s.index == slot).unwrap();
            assert_eq!(s.phase, SlotPhase::Live);
            let a = s.apis.iter().find(|a| a.api == api).unwrap();
            assert_eq!(a.calls, 1, "slot {slot}");
        }
        // Exit retires the child's slot only, returning what it held.
        rt.at_exit();
        let region = cx.state.region().unwrap();
        assert_eq!(region.reserved(0), 64 * MIB);
        let snap = cx.snapshot();
        assert!(
            !snap
                .slots
                .iter()
                .any(|s| s.index == child_slot.index() && s.phase == SlotPhase::Live)
        );
    }

    #[test]
    fn threads_racing_to_create_the_process_share_one_and_the_losers_give_their_slots_back() {
        let cx = Cx::new(config(1 << 30), "race");
        let rt = Runtime::with_state(cx.state);
        let start = Barrier::new(4);
        let made: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        std::ptr::from_ref(rt.process_or_create(cx.state)) as usize
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(made.iter().all(|&p| p == made[0]));
        // `cx` built a process of its own; the runtime's is the only other live slot.
        let live = cx
            .snapshot()
            .slots
            .iter()
            .filter(|s| s.phase == SlotPhase::Live)
            .count();
        assert_eq!(live, 2);
    }

    #[test]
    fn a_control_block_change_reaches_the_controller_and_the_region() {
        let mut c = config(1 << 30);
        c.sm_limit[1] = Some(50);
        c.sm_feedback = limiter_core::config::SmFeedback::Off;
        let cx = Cx::new(c.clone(), "control");
        let region = cx.state.region().unwrap();
        assert_eq!(cx.state.sm.percent(0), 0);
        let block = tenant_fs::open_no_links(
            &control_path(cx.region.as_ref().unwrap()),
            tenant_fs::Access::ReadWrite,
        )
        .unwrap();
        let writer = ControlWriter::new(&block).unwrap();
        writer
            .update(|s| {
                s.sm_percent[0] = Some(30);
                s.memory_limit[0] = Some(2 << 30);
            })
            .unwrap();
        cx.state.poll_control();
        assert_eq!(cx.state.sm.percent(0), 30);
        assert_eq!(
            cx.state.sm.percent(1),
            50,
            "not overridden: the environment's"
        );
        assert_eq!(region.limit(0), 2 << 30);
        // Lowered below what is held: further reservations are denied, nothing is revoked.
        cx.process.ledger.try_reserve(0, 64 * MIB).unwrap();
        writer.update(|s| s.memory_limit[0] = Some(MIB)).unwrap();
        cx.state.poll_control();
        assert!(cx.process.ledger.try_reserve(0, MIB).is_err());
        assert_eq!(cx.process.ledger.used(0), 64 * MIB);
        // A process that starts after the change applies it from its first call.
        c.shared_cache = cx.region.clone();
        let later = crate::test_support::state(c);
        assert_eq!(later.sm.percent(0), 30);
    }
}
