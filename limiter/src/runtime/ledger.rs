//! Where a process's reservations and statistics go: the container's region ([`RegionLedger`]:
//! reservations exact across processes, statistics in this thread's shard of the process's slot)
//! or, without one, counters in this process ([`InProcess`]). [`Ledger`] is the one a process
//! uses.
//!
//! Each thread caches one [`ShardWriter`] in a thread-local, claimed at the thread's first recorded
//! call (threads created before and after initialisation alike) and released by the thread-local's
//! destructor when the thread exits; the hooks find it through the thread's words
//! (`platform::thread_words`). A record is then a thread-local access and a seqlock section
//! of plain loads and stores: no lock, no allocation, no read-modify-write instruction. The cached
//! writer remembers which ledger it belongs to; after `fork()` the child has a new ledger (its own
//! slot), so the inherited writer is replaced at the child's first record.

use std::cell::RefCell;

use agent_common::api::ApiId;
use limiter_core::accounting::{Accounting, Call, Denied, InProcess};
use region::{Region, ReserveError, Reserver, ShardWriter, Slot, layout::ApiRecord};

use crate::platform::thread_words::Tls;

/// Where this process's reservations and statistics go.
#[derive(Debug)]
pub(crate) enum Ledger {
    /// No region configured (or it could not be used): exact within this process only.
    Local(Box<InProcess>),
    /// The container's region (inline: one pointer less to chase per call).
    Region(RegionLedger),
}

/// Accounting of one process in the container's region (inside its leaked `Process`).
#[derive(Debug)]
pub(crate) struct RegionLedger {
    pub(crate) region: &'static Region,
    pub(crate) slot: Slot,
    /// Device 0's reservations with their cells looked up once (the device nearly every process
    /// on a shared GPU allocates on); other devices go through the region's lookups.
    device0: Option<Reserver<'static>>,
    /// Where the thread words are: its own copy of their offset, in a line every record reads
    /// anyway (a reference to the runtime's would make finding the words wait for this line
    /// first).
    tls: Tls,
}

impl RegionLedger {
    pub(crate) fn new(region: &'static Region, slot: Slot) -> RegionLedger {
        RegionLedger {
            device0: region.reserver(&slot, 0),
            region,
            slot,
            tls: Tls::new(),
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
    pub(crate) fn kept(&self, device: usize) -> Option<&Reserver<'static>> {
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
        // The thread's words point at this writer: they must not outlive it. (At thread exit:
        // a fresh offset cache, read from the GOT once, does.)
        Tls::new().words().clear_writer();
    }
}

thread_local! {
    /// Owns this thread's statistics writer (its destructor frees the shard when the thread
    /// exits). `const`-initialised. The hooks reach the writer through the pointer in the
    /// thread's words instead (`platform::thread_words`: no `__tls_get_addr`, no `RefCell` check).
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
    /// thread is being torn down): for what the runtime records besides calls (GPU time).
    #[inline]
    pub(crate) fn thread_writer(&self) -> Option<&'static ShardWriter<'static>> {
        self.writer()
    }

    /// This thread's writer for this ledger, claiming one the first time (`None` while the
    /// thread is being torn down). Nothing is passed to the out-of-line claim, so a record's
    /// values stay in registers on the common path.
    #[inline(always)]
    fn writer(&self) -> Option<&'static ShardWriter<'static>> {
        let me = std::ptr::from_ref(self).cast::<()>();
        match self.tls.words().writer_for(me) {
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
                    self.tls.words().set_writer(&c.writer, me.cast());
                }
            })
            .ok()?;
        self.tls.words().writer_for(me.cast())
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
        let call = region::Call {
            latency_ns: call.latency_ns,
            ok: call.ok,
            bytes_allocated: call.bytes_allocated,
            bytes_freed: call.bytes_freed,
            bytes_moved: call.bytes_moved,
        };
        self.with_writer(|w| w.record(api, call, hook_ns));
    }

    fn record_denied(&self, api: ApiId, bytes: u64) {
        self.with_writer(|w| w.record_denied(api, bytes));
    }

    fn add_hook_ns(&self, api: ApiId, ns: u64) {
        self.with_writer(|w| w.add_hook_ns(api, ns));
    }

    fn record_throttled(&self, api: ApiId, ns: u64) {
        self.with_writer(|w| w.add_throttled_ns(api, ns));
    }
}

impl RegionLedger {
    /// The shared-memory record a call of `api` is written into by this thread, without claiming
    /// a writer: a thread's first record finds none (the claim is out of line and may fail; the
    /// hints that ask run outside the hooks' shields).
    #[inline(always)]
    pub(crate) fn stats_record(&self, api: ApiId) -> Option<&'static ApiRecord> {
        let me = std::ptr::from_ref(self).cast::<()>();
        self.tls
            .words()
            .writer_for(me)
            .and_then(|w| w.record_of(api))
    }
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
    fn add_hook_ns(&self, api: ApiId, ns: u64) {
        dispatch!(self, l => l.add_hook_ns(api, ns))
    }
    fn record_throttled(&self, api: ApiId, ns: u64) {
        dispatch!(self, l => l.record_throttled(api, ns))
    }
}

impl Ledger {
    /// The region ledger, if this process accounts in a region.
    #[inline(always)]
    pub(crate) fn region(&self) -> Option<&RegionLedger> {
        match self {
            Ledger::Region(l) => Some(l),
            Ledger::Local(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_common::api::ApiId;
    use limiter_core::accounting::{Accounting as _, Call};
    use region::{Region, RegionConfig};

    use super::RegionLedger;

    /// The record the hints prefetch is the one the call is then written into, and looking it up
    /// never claims a writer (it runs outside the hooks' shields).
    #[test]
    fn the_prefetched_record_is_the_one_written() {
        let path = std::env::temp_dir().join(format!("vgpu-ledger-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(1)).unwrap();
        let region: &'static Region = Box::leak(Box::new(region));
        let ledger = RegionLedger::new(region, region.claim_slot().unwrap());
        let api = ApiId::from_name("cuMemAlloc_v2").unwrap();
        // A fresh thread has no writer yet: nothing to prefetch, and none claimed.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(ledger.stats_record(api).is_none());
                assert!(ledger.stats_record(api).is_none());
                let call = Call {
                    latency_ns: 1_000,
                    ok: true,
                    ..Call::default()
                };
                ledger.record(api, call, || 10);
                let record = ledger
                    .stats_record(api)
                    .expect("the writer claimed by the record");
                assert_eq!(record.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
                ledger.record(api, call, || 10);
                assert_eq!(record.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
                // Prefetching is harmless whatever the latency's bucket.
                for latency in [0, 1, 1_000_000, u64::MAX] {
                    record.prefetch(latency);
                }
            });
        });
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(region::control_path(&path));
    }
}
