//! Per-process accounting: the ledger (the container's region, or counters in this process), the
//! live-allocation tables, the context charges and the pool charges.
//!
//! One [`Process`] per process, created at its first hooked CUDA call and leaked (slots, writers
//! and tables refer to it until exit). After `fork()` the child must not use its parent's slot,
//! thread shards or tables (a parent thread may even have held a table lock at the fork): the
//! runtime's `pthread_atfork` child handler only forgets the pointer, and the child's first CUDA
//! call creates its own `Process` (claiming its own slot). At normal exit the runtime's `atexit`
//! handler retires the slot, returning everything it still holds; after a crash or SIGKILL the
//! next claimant or a denied reservation reclaims it (the region's dead-slot sweep).

use agent_common::MAX_DEVICES;
use std::{
    ptr,
    sync::atomic::{AtomicBool, Ordering},
};

use limiter_core::{
    accounting::{Denied, InProcess},
    alloc_table::{ADDRESS_BUCKETS, AllocTable, HANDLE_BUCKETS},
    charge::{Charge, ContextCharges},
    pools::PoolTable,
};
use region::{Region, Slot};

use super::{
    ledger::{Ledger, RegionLedger},
    own_freeze::Held,
    state::State,
};
use crate::platform::{clock, log};

/// Which table a key lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// Device addresses (`cuMemAlloc*`).
    Ptr,
    /// `cuMemCreate` handles.
    Handle,
}

/// This process's accounting. `repr(C)`, what an allocation or free reads first: the ledger,
/// the context flags and the table of addresses' first words share the first lines.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Process {
    pub(crate) ledger: Ledger,
    context: ContextCharges,
    /// Live allocations by device address.
    pub(crate) ptrs: AllocTable<ADDRESS_BUCKETS>,
    /// Live `cuMemCreate` allocations by handle.
    handles: AllocTable<HANDLE_BUCKETS>,
    /// What each stream-ordered pool is charged.
    pub(crate) pools: PoolTable,
    /// The log level in force (for the context refusal's warning).
    log_level: log::Level,
    /// Whether a refused context charge was logged (once per process).
    context_warned: AtomicBool,
    /// Per device: a context charge was refused there (until one is held).
    context_refused: [AtomicBool; MAX_DEVICES],
}

impl Process {
    /// This process's accounting under `state`: claims a slot of the region if there is one (else,
    /// or if that fails, counts in this process).
    pub(crate) fn new(state: &'static State) -> Process {
        let config = &state.config;
        let ledger = match state.region() {
            Some(region) => match (
                std::time::Instant::now(),
                clock::thread_cpu_ns(),
                region.claim_slot(),
            ) {
                (started, cpu, Ok(slot)) => {
                    // Start-up cost figures (`scripts/gpu/bench-limiter.sh` reads them).
                    log::write(
                        config.log_level,
                        log::Level::Info,
                        format_args!(
                            "claimed slot {} of {} in {} us (cpu {} us)",
                            slot.index(),
                            region.path().display(),
                            started.elapsed().as_micros(),
                            clock::thread_cpu_ns().saturating_sub(cpu) / 1000
                        ),
                    );
                    Ledger::Region(RegionLedger::new(region, slot))
                }
                (_, _, Err(e)) => {
                    log::write(
                        config.log_level,
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
        Process {
            ledger,
            context: ContextCharges::new(config.context_bytes),
            ptrs: AllocTable::new(),
            handles: AllocTable::new(),
            pools: PoolTable::default(),
            log_level: config.log_level,
            context_warned: AtomicBool::new(false),
            context_refused: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// The region and slot, if this process accounts in a region.
    pub(crate) fn region_slot(&self) -> Option<(&'static Region, &Slot)> {
        self.ledger.region().map(|l| (l.region, &l.slot))
    }

    /// Charges this process's context memory on `device` once: when the context appears
    /// (created, retained, or first used by a call that needs one) and at the latest before the
    /// first allocation there (shown in the slot's `context_bytes`). Denied if the context itself
    /// does not fit (an allocation is then refused too): logged once, and flagged in the slot.
    #[inline(always)]
    pub(crate) fn ensure_context(&self, device: usize) -> Result<(), Denied> {
        self.context
            .ensure(device, &self.ledger, |bytes| {
                if let Some((region, slot)) = self.region_slot() {
                    region.set_context_bytes(slot, device as u32, bytes);
                }
            })
            .map_err(|denied| self.context_refused(denied))
    }
}

impl Held for Process {
    /// The bytes this process holds in its region beyond its contexts' charges, over every
    /// device: what its allocations hold. `None` without a region (nothing to compare with).
    fn allocated_bytes(&self) -> Option<u64> {
        let (region, slot) = self.region_slot()?;
        let held: u64 = (0..MAX_DEVICES as u32).map(|d| region.held(slot, d)).sum();
        let contexts: u64 = (0..MAX_DEVICES)
            .filter(|&d| self.context.charged(d))
            .map(|_| self.context.bytes())
            .sum();
        Some(held.saturating_sub(contexts))
    }
}

impl Process {
    /// This process's context charge on `device` if it was refused and is still not held,
    /// else 0: free memory leaves it out, as the first allocation would reserve it first.
    pub(crate) fn context_pending(&self, device: usize) -> u64 {
        // Relaxed: a display figure; the charge itself is decided by the ledger.
        let refused = self
            .context_refused
            .get(device)
            .is_some_and(|r| r.load(Ordering::Relaxed));
        if refused && !self.context.charged(device) {
            self.context.bytes()
        } else {
            0
        }
    }

    #[cold]
    #[inline(never)]
    fn context_refused(&self, denied: Denied) -> Denied {
        let device = denied.device;
        if let Some(r) = self.context_refused.get(device) {
            // Relaxed: read only for display figures (`context_pending`).
            r.store(true, Ordering::Relaxed);
        }
        if let Some((region, slot)) = self.region_slot() {
            region.set_context_refused(slot, device as u32, denied.requested);
        }
        // Relaxed: only elects the one warning.
        if !self.context_warned.swap(true, Ordering::Relaxed) {
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            if denied.limit < denied.requested {
                // At Error, shown at the default log level: no allocation can ever succeed.
                log::write(
                    self.log_level,
                    log::Level::Error,
                    format_args!(
                        "device {device}: the memory limit ({:.0} MiB) is smaller than one \
                         context's charge ({:.0} MiB, VGPU_CONTEXT_BYTES): every allocation on \
                         this device will be refused; raise CUDA_DEVICE_MEMORY_LIMIT above the \
                         charge",
                        mib(denied.limit),
                        mib(denied.requested)
                    ),
                );
            } else {
                log::write(
                    self.log_level,
                    log::Level::Warn,
                    format_args!(
                        "device {device}: no room for this process's context charge ({:.0} MiB): \
                         the container holds {:.0} of its {:.0} MiB; its allocations are refused \
                         until memory is freed",
                        mib(denied.requested),
                        mib(denied.used),
                        mib(denied.limit)
                    ),
                );
            }
        }
        denied
    }

    /// Charges the context of `device` now that it exists (see [`Process::ensure_context`]).
    pub(crate) fn context_exists(&self, device: usize) {
        let _ = self.ensure_context(device);
    }

    /// Records a live allocation's charge under `key`; returns the charge it replaced, if the key
    /// was (wrongly) live.
    #[inline(always)]
    pub(crate) fn keep(&self, space: Space, key: u64, charge: Charge) -> Option<Charge> {
        match space {
            Space::Ptr => self.ptrs.insert(key, charge),
            Space::Handle => self.handles.insert(key, charge),
        }
    }

    /// Takes a live allocation's charge out of its table.
    #[inline(always)]
    pub(crate) fn take(&self, space: Space, key: u64) -> Option<Charge> {
        match space {
            Space::Ptr => self.ptrs.remove(key),
            Space::Handle => self.handles.remove(key),
        }
    }

    /// The address of `key`'s line in its table (what an insertion or removal touches first).
    #[inline(always)]
    pub(crate) fn key_line(&self, space: Space, key: u64) -> usize {
        match space {
            Space::Ptr => self.ptrs.home_addr(key),
            Space::Handle => self.handles.home_addr(key),
        }
    }

    /// The lines an allocation or a free needs first, whose addresses do not change for the life
    /// of the process: the slot's first line and device 0's container reservation word (0 when
    /// there are none) and the address table's buckets (see `hints`).
    pub(crate) fn entry_lines(&self) -> [usize; 3] {
        // Device 0: the device of every allocation in a single-device process (the usual case).
        let reservation = self
            .region_slot()
            .and_then(|(region, slot)| region.reservation_lines(slot, 0));
        let [slot, container] = reservation.map_or([0, 0], |l| l.map(|p| p as usize));
        [slot, container, self.ptrs.base()]
    }

    /// Gives the slot back (normal exit, or a `Process` that lost the creation race).
    pub(crate) fn retire(&self, level: log::Level) {
        if let Some((region, slot)) = self.region_slot()
            && slot.owned_by_current_process()
        {
            // SAFETY: `Slot` is plain data (an index and a state word, no `Drop`); the copy names
            // the same claim, and the region ignores (by generation) any later use of either.
            let owned = unsafe { ptr::read(slot) };
            let report = region.retire_slot(owned);
            log::debug!(level, "retired slot {}: {report:?}", slot.index());
        }
    }
}

const _: () = assert!(!std::mem::needs_drop::<Slot>());
