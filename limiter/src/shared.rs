//! The region backend: reservations in the container's shared region (exact across processes) and
//! statistics in this thread's shard of the process's slot.
//!
//! Each thread caches one [`ShardWriter`] in a thread-local, claimed at the thread's first recorded
//! call (threads created before and after initialisation alike) and released by the thread-local's
//! destructor when the thread exits; the hooks find it through the thread's words
//! (`thread_words`). A record is then a thread-local access and a seqlock section
//! of plain loads and stores: no lock, no allocation, no read-modify-write instruction. The cached
//! writer remembers which ledger it belongs to; after `fork()` the child has a new ledger (its own
//! slot), so the inherited writer is replaced at the child's first record.

use std::cell::RefCell;

use agent_common::api::ApiId;
use region::{Region, ReserveError, Reserver, ShardWriter, Slot};

use crate::{
    accounting::{Accounting, Call, Denied},
    thread_words,
};

/// Accounting of one process in the container's region (inside its leaked `Process`).
#[derive(Debug)]
pub struct RegionLedger {
    pub region: &'static Region,
    pub slot: Slot,
    /// Device 0's reservations with their cells looked up once (the device nearly every process
    /// on a shared GPU allocates on); other devices go through the region's lookups.
    device0: Option<Reserver<'static>>,
}

impl RegionLedger {
    pub fn new(region: &'static Region, slot: Slot) -> RegionLedger {
        RegionLedger {
            device0: region.reserver(&slot, 0),
            region,
            slot,
        }
    }

    /// [`Accounting::try_reserve`] on a device other than the kept one: through the region's
    /// lookups, out of line.
    #[cold]
    #[inline(never)]
    fn try_reserve_other(&self, device: usize, bytes: u64) -> Result<(), Denied> {
        let Ok(d) = u32::try_from(device) else {
            return Ok(());
        };
        match self.region.try_reserve(&self.slot, d, bytes) {
            Ok(()) => Ok(()),
            // Devices beyond the region's table are not limited (no configuration names them).
            Err(ReserveError::NoSuchDevice { .. }) => Ok(()),
            Err(e) => Err(denied(device, e, bytes)),
        }
    }

    /// [`Accounting::release`] on a device other than the kept one.
    #[cold]
    #[inline(never)]
    fn release_other(&self, device: usize, bytes: u64) {
        if let Ok(d) = u32::try_from(device) {
            self.region.release(&self.slot, d, bytes);
        }
    }

    /// The reserver of `device`, if it is the one kept.
    #[inline(always)]
    fn kept(&self, device: usize) -> Option<&Reserver<'static>> {
        if device == 0 {
            self.device0.as_ref()
        } else {
            None
        }
    }
}

struct Cached {
    writer: ShardWriter<'static>,
    ledger: *const RegionLedger,
}

impl Drop for Cached {
    fn drop(&mut self) {
        // The thread's words point at this writer: they must not outlive it.
        thread_words::clear_writer();
    }
}

thread_local! {
    /// Owns this thread's statistics writer (its destructor frees the shard when the thread
    /// exits). `const`-initialised. The hooks reach the writer through the pointer in the
    /// thread's words instead (`thread_words`: no `__tls_get_addr`, no `RefCell` check).
    static WRITER: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

impl RegionLedger {
    /// Runs `f` with this thread's writer for this ledger, claiming one the first time.
    #[inline(always)]
    fn with_writer(&self, f: impl FnOnce(&ShardWriter<'static>)) {
        if let Some(w) = self.writer() {
            f(w);
        }
    }

    /// This thread's writer for this ledger, claiming one the first time (`None` while the
    /// thread is being torn down). Nothing is passed to the out-of-line claim, so a record's
    /// values stay in registers on the common path.
    #[inline(always)]
    fn writer(&self) -> Option<&'static ShardWriter<'static>> {
        let me = std::ptr::from_ref(self).cast::<()>();
        match thread_words::current().writer_for(me) {
            Some(w) => Some(w),
            None => self.claim_writer(),
        }
    }

    /// Claims this thread's writer for this ledger (first record of the thread, or the first
    /// in a forked child, whose inherited writer is the parent's) and keeps a copy in the
    /// thread's words. Does nothing while the thread is being torn down (its thread-locals are
    /// gone).
    #[cold]
    #[inline(never)]
    fn claim_writer(&self) -> Option<&'static ShardWriter<'static>> {
        let me: *const RegionLedger = self;
        WRITER
            .try_with(|cell| {
                // A record never calls back into another record: the borrow cannot be taken
                // already.
                let Ok(mut cached) = cell.try_borrow_mut() else {
                    return;
                };
                if !matches!(&*cached, Some(c) if std::ptr::eq(c.ledger, me)) {
                    // A writer of another ledger is the parent's (this is a forked child): its
                    // `Drop` leaves the parent's shard alone.
                    *cached = Some(Cached {
                        writer: self.region.shard_writer(&self.slot),
                        ledger: me,
                    });
                }
                if let Some(c) = &*cached {
                    thread_words::current().set_writer(&c.writer, me.cast());
                }
            })
            .ok()?;
        thread_words::current().writer_for(me.cast())
    }
}

/// The region's denial as the hooks' [`Denied`].
fn denied(device: usize, e: ReserveError, bytes: u64) -> Denied {
    match e {
        ReserveError::Denied { denied, .. } => Denied {
            device,
            requested: denied.requested,
            used: denied.reserved,
            limit: denied.limit,
        },
        // The slot was retired (the process is exiting) or judged dead: refuse rather than
        // allocate without a charge.
        _ => Denied {
            device,
            requested: bytes,
            used: 0,
            limit: 0,
        },
    }
}

/// `Accounting` for a ledger that lives as long as the process (inside the leaked `Process`;
/// writers refer to the region, which lives in the process-wide state).
impl Accounting for RegionLedger {
    #[inline]
    #[unsafe(link_section = ".text.hot.vgpu")]
    fn try_reserve(&self, device: usize, bytes: u64) -> Result<(), Denied> {
        let result = match self.kept(device) {
            Some(r) => r.try_reserve(bytes),
            None => return self.try_reserve_other(device, bytes),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => Err(denied(device, e, bytes)),
        }
    }

    #[inline]
    #[unsafe(link_section = ".text.hot.vgpu")]
    fn release(&self, device: usize, bytes: u64) {
        match self.kept(device) {
            Some(r) => r.release(bytes),
            None => self.release_other(device, bytes),
        }
    }

    fn used(&self, device: usize) -> u64 {
        u32::try_from(device).map_or(0, |d| self.region.reserved(d))
    }

    fn limit(&self, device: usize) -> Option<u64> {
        let l = u32::try_from(device).map_or(0, |d| self.region.limit(d));
        (l != 0).then_some(l)
    }

    #[inline(always)]
    fn record(&self, api: ApiId, call: Call, hook_ns: impl FnOnce() -> u64) {
        self.with_writer(|w| w.record(api, call, hook_ns));
    }

    fn record_denied(&self, api: ApiId, bytes: u64) {
        self.with_writer(|w| w.record_denied(api, bytes));
    }

    #[inline(always)]
    fn prefetch_reserve(&self, device: usize) {
        if let Some(r) = self.kept(device) {
            r.prefetch();
        } else if let Ok(d) = u32::try_from(device) {
            self.region.prefetch_owner_op(&self.slot, d);
        }
    }

    /// Without claiming a writer: a thread's first record finds none, and nothing to prefetch
    /// (the claim is out of line and may fail; this runs outside the hooks' shields).
    #[inline(always)]
    fn stats_record(&self, api: ApiId) -> Option<&'static region::layout::ApiRecord> {
        let me = std::ptr::from_ref(self).cast::<()>();
        thread_words::current()
            .writer_for(me)
            .and_then(|w| w.record_of(api))
    }

    fn add_hook_ns(&self, api: ApiId, ns: u64) {
        self.with_writer(|w| w.add_hook_ns(api, ns));
    }

    fn record_throttled(&self, api: ApiId, ns: u64) {
        self.with_writer(|w| w.add_throttled_ns(api, ns));
    }
}
