//! Per-process accounting: the ledger (the container's region, or counters in this process), the
//! live-allocation tables, the context charges and the pool charges.
//!
//! One [`Process`] per process, created at its first hooked CUDA call and leaked (slots, writers
//! and tables refer to it until exit). After `fork()` the child must not use its parent's slot,
//! thread shards or tables (a parent thread may even have held a table lock at the fork): the
//! `pthread_atfork` child handler only forgets the pointer, and the child's first CUDA call creates
//! its own `Process` (claiming its own slot). At normal exit an `atexit` handler, registered at
//! initialisation, retires the slot, returning everything it still holds; after a crash or SIGKILL
//! the next claimant or a denied reservation reclaims it (the region's dead-slot sweep).

use std::{
    ptr,
    sync::atomic::{AtomicU8, Ordering},
};

use agent_common::api::ApiId;
use region::{Region, Slot};

use crate::{
    accounting::{Accounting, AllocTable, Call, Denied, InProcess},
    config::MAX_DEVICES,
    hot::hot,
    log,
    pools::PoolTable,
    shared::RegionLedger,
    state::State,
};

/// Where this process's reservations and statistics go.
#[derive(Debug)]
pub enum Ledger {
    /// No region configured (or it could not be used): exact within this process only.
    Local(Box<InProcess>),
    /// The container's region (inline: one pointer less to chase per call).
    Region(RegionLedger),
}

macro_rules! dispatch {
    ($self:ident, $l:ident => $e:expr) => {
        match $self {
            Ledger::Local($l) => $e,
            Ledger::Region($l) => $e,
        }
    };
}

impl Accounting for Ledger {
    #[inline]
    fn try_reserve(&self, device: usize, bytes: u64) -> Result<(), Denied> {
        dispatch!(self, l => l.try_reserve(device, bytes))
    }
    #[inline]
    fn release(&self, device: usize, bytes: u64) {
        dispatch!(self, l => l.release(device, bytes))
    }
    fn used(&self, device: usize) -> u64 {
        dispatch!(self, l => l.used(device))
    }
    fn limit(&self, device: usize) -> Option<u64> {
        dispatch!(self, l => l.limit(device))
    }
    #[inline(always)]
    fn record(&self, api: ApiId, call: Call, hook_ns: impl FnOnce() -> u64) {
        match self {
            Ledger::Region(l) => l.record(api, call, hook_ns),
            // The self-time is taken before the record here: the in-process counters are the
            // fallback, and the hot path passes nothing to this out-of-line call but values.
            Ledger::Local(l) => l.record_now(api, call, hook_ns()),
        }
    }
    fn record_denied(&self, api: ApiId, bytes: u64) {
        dispatch!(self, l => l.record_denied(api, bytes))
    }
    #[inline(always)]
    fn prefetch_reserve(&self, device: usize) {
        dispatch!(self, l => l.prefetch_reserve(device))
    }
    #[inline(always)]
    fn stats_record(&self, api: ApiId) -> Option<&'static region::layout::ApiRecord> {
        dispatch!(self, l => l.stats_record(api))
    }
    fn add_hook_ns(&self, api: ApiId, ns: u64) {
        dispatch!(self, l => l.add_hook_ns(api, ns))
    }
    fn record_throttled(&self, api: ApiId, ns: u64) {
        dispatch!(self, l => l.record_throttled(api, ns))
    }
}

/// Context charge states per device.
const CTX_NONE: u8 = 0;
const CTX_CHARGING: u8 = 1;
const CTX_CHARGED: u8 = 2;

/// This process's accounting. `repr(C)`, what an allocation or free reads first: the ledger,
/// the context flags and the table of addresses' first words share the first lines.
#[derive(Debug)]
#[repr(C)]
pub struct Process {
    pub ledger: Ledger,
    context: [AtomicU8; MAX_DEVICES],
    /// Live allocations by device address.
    pub ptrs: AllocTable,
    /// Live `cuMemCreate` allocations by handle.
    pub handles: AllocTable,
    /// What each stream-ordered pool is charged.
    pub pools: PoolTable,
    context_bytes: u64,
}

/// This process's accounting if it exists already (the launch path).
#[inline(always)]
pub fn ready() -> Option<&'static Process> {
    // SAFETY: a non-null pointer was leaked from a `Box<Process>` and is never freed.
    unsafe { hot().process.load(Ordering::Acquire).as_ref() }
}

/// This process's accounting, created at the first call (again in a forked child).
#[inline(always)]
pub fn current(state: &'static State) -> &'static Process {
    match ready() {
        Some(p) => p,
        None => create(state),
    }
}

#[cold]
#[inline(never)]
fn create(state: &'static State) -> &'static Process {
    let fresh: *mut Process = Box::into_raw(Box::new(Process::new(state)));
    // AcqRel: Release publishes `fresh`; Acquire on failure makes the winner's fields visible.
    let current = &hot().process;
    match current.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // SAFETY: just leaked, never freed.
            let process = unsafe { &*fresh };
            crate::entry_lines::publish(process);
            process
        }
        Err(winner) => {
            // Another thread created it first: give our slot back and use theirs.
            // SAFETY: `fresh` was never published, so this thread owns it exclusively.
            let lost = unsafe { Box::from_raw(fresh) };
            lost.retire();
            // SAFETY: the winner's pointer is a leaked `Box<Process>`, never freed.
            unsafe { &*winner }
        }
    }
}

impl Process {
    fn new(state: &'static State) -> Process {
        let config = &state.config;
        let ledger = match state.region() {
            Some(region) => match (
                std::time::Instant::now(),
                crate::clock::thread_cpu_ns(),
                region.claim_slot(),
            ) {
                (started, cpu, Ok(slot)) => {
                    // Start-up cost figures (`scripts/gpu/bench-limiter.sh` reads them).
                    log::write(
                        log::Level::Info,
                        format_args!(
                            "claimed slot {} of {} in {} us (cpu {} us)",
                            slot.index(),
                            region.path().display(),
                            started.elapsed().as_micros(),
                            crate::clock::thread_cpu_ns().saturating_sub(cpu) / 1000
                        ),
                    );
                    Ledger::Region(RegionLedger::new(region, slot))
                }
                (_, _, Err(e)) => {
                    log::write(
                        log::Level::Error,
                        format_args!(
                            "{e}; this process's limit is enforced within the process only"
                        ),
                    );
                    Ledger::Local(Box::new(InProcess::new(config)))
                }
            },
            None => Ledger::Local(Box::new(InProcess::new(config))),
        };
        // A forked child gets its own SM feedback thread (threads do not survive fork).
        crate::sm_feedback::ensure_started(config.sm_feedback);
        Process {
            ledger,
            ptrs: AllocTable::default(),
            // `cuMemCreate` handles: fewer live at once than addresses.
            handles: AllocTable::with_buckets(64),
            pools: PoolTable::default(),
            context: std::array::from_fn(|_| AtomicU8::new(CTX_NONE)),
            context_bytes: config.context_bytes,
        }
    }

    /// The region and slot, if this process accounts in a region.
    pub fn region_slot(&self) -> Option<(&'static Region, &Slot)> {
        match &self.ledger {
            Ledger::Region(l) => Some((l.region, &l.slot)),
            Ledger::Local(_) => None,
        }
    }

    /// Charges this process's context memory on `device` once, before its first allocation
    /// there. Denied if the context itself does not fit (the allocation is then refused too).
    #[inline(always)]
    pub fn ensure_context(&self, device: usize) -> Result<(), Denied> {
        match self.context.get(device) {
            // Acquire: pairs with the Release store of CHARGED in `charge_context`.
            Some(flag) if flag.load(Ordering::Acquire) != CTX_CHARGED => {
                self.charge_context(device, flag)
            }
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn charge_context(&self, device: usize, flag: &AtomicU8) -> Result<(), Denied> {
        loop {
            // Acquire: pairs with the Release store of CHARGED, after which the charge is held.
            match flag.load(Ordering::Acquire) {
                CTX_CHARGED => return Ok(()),
                CTX_CHARGING => std::thread::yield_now(),
                _ => {
                    // Acquire/Relaxed: the winner alone reserves; losers wait for its outcome.
                    if flag
                        .compare_exchange(
                            CTX_NONE,
                            CTX_CHARGING,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    let r = self.ledger.try_reserve(device, self.context_bytes);
                    // Release: pairs with the Acquire load above.
                    flag.store(
                        if r.is_ok() { CTX_CHARGED } else { CTX_NONE },
                        Ordering::Release,
                    );
                    if r.is_ok()
                        && let Some((region, slot)) = self.region_slot()
                    {
                        region.set_context_bytes(slot, device as u32, self.context_bytes);
                    }
                    return r;
                }
            }
        }
    }

    /// Gives the slot back (normal exit, or a `Process` that lost the creation race).
    fn retire(&self) {
        if let Some((region, slot)) = self.region_slot()
            && slot.owned_by_current_process()
        {
            // SAFETY: `Slot` is plain data (an index and a state word, no `Drop`); the copy names
            // the same claim, and the region ignores (by generation) any later use of either.
            let owned = unsafe { ptr::read(slot) };
            let report = region.retire_slot(owned);
            log::debug!("retired slot {}: {report:?}", slot.index());
        }
    }
}

const _: () = assert!(!std::mem::needs_drop::<Slot>());

/// `pthread_atfork` child handler: the child is single-threaded here; it forgets the parent's
/// accounting (never touching its locks) and builds its own at its first CUDA call.
extern "C" fn on_fork_child() {
    // Relaxed: the child has one thread; the next creation publishes with Release.
    hot().process.store(ptr::null_mut(), Ordering::Relaxed);
}

/// `atexit` handler: retires this process's slot. Runs in a forked child too, for the child's own
/// `Process` (or none).
extern "C" fn on_exit() {
    if let Some(p) = ready() {
        let _ = crate::guard::shield(|| p.retire());
    }
}

/// Registers the fork and exit handlers; called once, at initialisation (never at load).
pub fn register_handlers() {
    // SAFETY: both handlers are `extern "C" fn()` living as long as the process (this library is
    // preloaded and never unloaded); they never unwind (`on_exit` shields its logic).
    unsafe {
        if libc::pthread_atfork(None, None, Some(on_fork_child)) != 0 {
            log::write(log::Level::Warn, format_args!("pthread_atfork failed"));
        }
        if libc::atexit(on_exit) != 0 {
            log::write(log::Level::Warn, format_args!("atexit failed"));
        }
    }
}
