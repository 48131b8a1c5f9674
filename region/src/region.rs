//! The writer side: a region mapped read-write by a limiter process ([`Region`], defined in
//! `handle`): opening it, what it is configured with, and reservations of device memory.

use agent_common::MAX_DEVICES;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{InitOutcome, RegionConfig};
use crate::error::{RegionError, ReserveError};
use crate::handle::Region;
use crate::layout::{DeviceState, HEADER_SIZE, RegionHeader, SLOT_SIZE, SlotRecord};
use crate::reserve::{self, Kind, OpError, Stop};
use crate::slots::Slot;

/// Least time between two denial-triggered dead-slot sweeps of one container.
pub const SWEEP_INTERVAL_MS: u64 = 50;

impl Region {
    /// Opens the region at `path`, creating and initialising it if needed. See `init` and
    /// docs/region.md for the protocol.
    pub fn open_or_create(
        path: &Path,
        config: &RegionConfig,
    ) -> Result<(Region, InitOutcome), RegionError> {
        crate::init::open_or_create(path, config)
    }

    #[inline(always)]
    pub(crate) fn header(&self) -> &RegionHeader {
        self.map
            .get(0)
            .expect("mapping holds the header: checked at open")
    }

    #[inline(always)]
    pub(crate) fn device(&self, device: u32) -> Option<&DeviceState> {
        if device >= self.device_count {
            return None;
        }
        self.header().devices.get(device as usize)
    }

    #[inline(always)]
    pub(crate) fn slot_record(&self, index: u32) -> Option<&SlotRecord> {
        if index >= self.slot_count {
            return None;
        }
        self.map.get(HEADER_SIZE + index as usize * SLOT_SIZE)
    }

    /// The region file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of slots.
    pub fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.device_count
    }

    /// The configuration the region holds (the first initialiser's).
    pub fn config(&self) -> RegionConfig {
        crate::init::effective_config(self.header())
    }

    /// Memory limit of `device` in bytes (0 = unlimited, or no such device).
    pub fn limit(&self, device: u32) -> u64 {
        // Relaxed: written once before READY, which this process acquired at open.
        self.device(device)
            .map_or(0, |d| d.memory_limit.load(Ordering::Relaxed))
    }

    /// SM limit of `device` in percent (0 or 100 = unlimited).
    pub fn sm_limit(&self, device: u32) -> u8 {
        // Relaxed: as `limit`.
        self.device(device)
            .map_or(0, |d| d.sm_limit.load(Ordering::Relaxed).min(100) as u8)
    }

    /// The container's SM share of every device (the duty cycle its processes draw from; see
    /// [`crate::sm_share`]).
    pub fn sm_shares(&self) -> &[crate::layout::SmShare; MAX_DEVICES] {
        &self.header().sm
    }

    /// Bytes reserved container-wide on `device`.
    pub fn reserved(&self, device: u32) -> u64 {
        // Acquire: pairs with the AcqRel commits; a momentary value either way.
        self.device(device).map_or(0, |d| {
            reserve::word_bytes(d.reserved.load(Ordering::Acquire))
        })
    }

    /// Reserves `bytes` on `device` for the process owning `slot`, exactly: under any
    /// interleaving of any number of processes the container-wide reservation never passes the
    /// limit, and a SIGKILL at any instruction leaves it equal to what the slots hold once the
    /// dead slot is reclaimed (see `reserve`). When denied, dead processes' slots are reclaimed
    /// once and the reservation retried.
    #[inline]
    pub fn try_reserve(&self, slot: &Slot, device: u32, bytes: u64) -> Result<(), ReserveError> {
        if device >= self.device_count {
            return Err(ReserveError::NoSuchDevice {
                device,
                devices: self.device_count,
            });
        }
        match self.reserver(slot, device) {
            Some(r) => r.try_reserve(bytes),
            // A slot index past the region's: not a claim of it.
            None => Err(ReserveError::SlotLost {
                index: slot.index(),
            }),
        }
    }

    /// A reservation that was refused: when denied, dead processes' slots are reclaimed (at
    /// most once per sweep interval) and the reservation retried once.
    #[cold]
    #[inline(never)]
    fn reserve_failed(
        &self,
        slot: &Slot,
        device: u32,
        bytes: u64,
        limit: u64,
        first: OpError,
    ) -> Result<(), ReserveError> {
        let result = match first {
            OpError::Denied(_)
                if self.sweep_due() && self.reclaim_dead_slots().slots_reclaimed > 0 =>
            {
                self.owner_op(slot, device, Kind::Reserve, bytes, limit)
            }
            other => Err(other),
        };
        let dev = self.device(device).ok_or(ReserveError::NoSuchDevice {
            device,
            devices: self.device_count,
        })?;
        let index = slot.index();
        match result {
            Ok(applied) => {
                // Relaxed: a statistic (as in `try_reserve`).
                dev.peak_reserved
                    .fetch_max(applied.total, Ordering::Relaxed);
                Ok(())
            }
            Err(OpError::Denied(denied)) => {
                // Relaxed: a statistic.
                dev.denied.fetch_add(1, Ordering::Relaxed);
                Err(ReserveError::Denied { device, denied })
            }
            Err(OpError::Busy) => Err(ReserveError::SlotBusy { index }),
            Err(OpError::Lost | OpError::Stopped) => Err(ReserveError::SlotLost { index }),
        }
    }

    /// Releases `bytes` on `device` held by the process owning `slot`. Releases more than held
    /// are clamped to what the slot holds (so the counters never wrap).
    #[inline]
    pub fn release(&self, slot: &Slot, device: u32, bytes: u64) {
        if let Some(r) = self.reserver(slot, device) {
            r.release(bytes);
        }
    }

    #[inline]
    pub(crate) fn owner_op(
        &self,
        slot: &Slot,
        device: u32,
        kind: Kind,
        bytes: u64,
        limit: u64,
    ) -> Result<reserve::Applied, OpError> {
        self.owner_op_until(slot, device, kind, bytes, limit, Stop::Never)
    }

    /// [`Region::owner_op`] that a test can stop where a SIGKILL would.
    #[inline]
    pub(crate) fn owner_op_until(
        &self,
        slot: &Slot,
        device: u32,
        kind: Kind,
        bytes: u64,
        limit: u64,
        stop: Stop,
    ) -> Result<reserve::Applied, OpError> {
        let record = self.slot_record(slot.index()).ok_or(OpError::Lost)?;
        if !self.owns(slot, record) {
            return Err(OpError::Lost);
        }
        reserve::owner_op(
            self,
            slot.index(),
            device,
            kind,
            bytes,
            limit,
            || self.owns(slot, record),
            stop,
        )
    }

    /// The reservations of `slot` on `device`, with their cells looked up once (`None` for an
    /// index or device out of range).
    pub fn reserver(&self, slot: &Slot, device: u32) -> Option<Reserver<'_>> {
        let record = self.slot_record(slot.index())?;
        Some(Reserver {
            region: self,
            cells: reserve::OwnerCells::resolve(self, slot.index(), device)?,
            device: self.device(device)?,
            state: &record.header.state,
            slot: slot.duplicate(),
        })
    }

    /// Prefetches the lines a reservation or release by `slot` on `device` will touch: the
    /// slot's first line (state, intent, held words of devices 0..5), the held word's own line
    /// for later devices, and the device's container word.
    #[inline]
    pub fn prefetch_owner_op(&self, slot: &Slot, device: u32) {
        if let Some(r) = self.reserver(slot, device) {
            r.prefetch();
        }
    }

    /// The addresses of the lines a reservation or release by `slot` on `device` touches first
    /// (the slot's first line, the device's container word), for a caller that keeps them to
    /// prefetch before it has the region at hand. `None` for an index or device out of range.
    pub fn reservation_lines(&self, slot: &Slot, device: u32) -> Option<[*const u8; 2]> {
        let record = self.slot_record(slot.index())?;
        let dev = self.device(device)?;
        Some([
            (&raw const record.header.state).cast(),
            (&raw const dev.reserved).cast(),
        ])
    }

    /// Asks the agent to thaw the container: stores `generation`, the control block's
    /// generation that marked it frozen, as the region's thaw request.
    pub fn request_thaw(&self, generation: u64) {
        // Relaxed: a word on its own; the agent reads it with `pread` and acts on its value
        // alone, publishing nothing back through it.
        self.header()
            .thaw_request
            .store(generation, Ordering::Relaxed);
    }

    /// Publishes the idle time after which the container asks to be frozen (`None`: it does
    /// not ask), in ms.
    pub fn set_freeze_after(&self, after: Option<std::time::Duration>) {
        let ms = after.map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        // Relaxed: a word on its own, read by the agent with `pread`.
        self.header().freeze_after_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether a denial may trigger a dead-slot sweep now: at most one per
    /// [`SWEEP_INTERVAL_MS`] per container, taken by CAS so concurrent deniers do not all sweep.
    fn sweep_due(&self) -> bool {
        let last_sweep = &self.header().last_sweep_ms;
        let now = crate::procfs::boottime_ms();
        // Relaxed: a rate limit; the CAS makes one process the sweeper for this interval.
        let last = last_sweep.load(Ordering::Relaxed);
        (now < last || now - last >= SWEEP_INTERVAL_MS)
            && last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Bytes the process owning `slot` holds on `device`.
    pub fn held(&self, slot: &Slot, device: u32) -> u64 {
        let Some(record) = self.slot_record(slot.index()) else {
            return 0;
        };
        if device >= self.device_count || !self.owns(slot, record) {
            return 0;
        }
        // Acquire: pairs with the AcqRel applies (a momentary value of this process's counter).
        reserve::word_bytes(record.header.held[device as usize].load(Ordering::Acquire))
    }

    /// Records the context (and module) memory of the process on `device`, for display.
    pub fn set_context_bytes(&self, slot: &Slot, device: u32, bytes: u64) {
        if let (Some(record), true) = (self.slot_record(slot.index()), device < self.device_count)
            && self.owns(slot, record)
        {
            // Relaxed: a display value, read by the agent without ordering needs.
            record.header.context_bytes[device as usize].store(bytes, Ordering::Relaxed);
        }
    }

    /// Publishes in the process's slot that an allocation of `bytes` on `device` waits for the
    /// GPU to have room (`VGPU_OOM_WAIT`), and returns the wait's number for
    /// [`Region::end_oom_wait`]; 0 when the slot is no longer the process's (nothing published).
    pub fn begin_oom_wait(&self, slot: &Slot, device: u32, bytes: u64) -> u64 {
        let Some(record) = self.slot_record(slot.index()) else {
            return 0;
        };
        if !self.owns(slot, record) {
            return 0;
        }
        let h = &record.header;
        // Relaxed: the number and the device are ordered before the bytes by their Release
        // store below; the process's threads take numbers apart with the RMW alone.
        let seq = h
            .oom_wait_seq
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        h.oom_wait_device
            .store(u64::from(device), Ordering::Relaxed);
        // Release: makes the device and the number visible before the bytes that give them a
        // meaning; pairs with the Acquire fence after the agent's copy of the slot header
        // (`reader::read_slot`).
        h.oom_wait_bytes.store(bytes.max(1), Ordering::Release);
        seq
    }

    /// Clears the wait published by [`Region::begin_oom_wait`] (number `seq`), unless a later
    /// wait of another thread replaced it (that one clears its own).
    pub fn end_oom_wait(&self, slot: &Slot, seq: u64) {
        let Some(record) = self.slot_record(slot.index()) else {
            return;
        };
        let h = &record.header;
        // Relaxed: only compared with this thread's own number. A wait of another thread that
        // starts between the load and the store is hidden for the rest of it: the agent then
        // freezes nothing for it, as without `--freeze-on-demand`.
        if seq != 0 && self.owns(slot, record) && h.oom_wait_seq.load(Ordering::Relaxed) == seq {
            // Release: orders the wait's end after the process's use of the slot before it;
            // pairs with the same Acquire fence of the agent's reader as the start.
            h.oom_wait_bytes.store(0, Ordering::Release);
        }
    }

    /// Publishes the process's in-process freeze in its slot (`own_freeze`, layout 3.6) and the
    /// device bytes it backs or holds in host memory (`own_freeze_bytes`). Nothing when the slot
    /// is no longer the process's.
    pub fn publish_own_freeze(&self, slot: &Slot, own: crate::OwnFreeze, bytes: u64) {
        let Some(record) = self.slot_record(slot.index()) else {
            return;
        };
        if !self.owns(slot, record) {
            return;
        }
        let h = &record.header;
        // Relaxed: a figure; the state word's Release below orders it before the state.
        h.own_freeze_bytes.store(bytes, Ordering::Relaxed);
        // Release: the bytes and the process's work before the answer are visible with it;
        // pairs with the Acquire fence after the agent's copy of the slot header
        // (`reader::read_slot`).
        h.own_freeze.store(own.encode(), Ordering::Release);
    }

    /// Records that the context charge of `bytes` on `device` was refused to the process (the
    /// limit has no room for it): `context_bytes` then holds `bytes | CONTEXT_REFUSED` until a
    /// later charge succeeds.
    pub fn set_context_refused(&self, slot: &Slot, device: u32, bytes: u64) {
        self.set_context_bytes(slot, device, bytes | crate::layout::CONTEXT_REFUSED);
    }

    #[inline(always)]
    pub(crate) fn owns(&self, slot: &Slot, record: &SlotRecord) -> bool {
        // Acquire: after the slot's intent is taken, pairs with a reclaimer's state change
        // (published by its Release seal of the intent, which the lock's Acquire read).
        record.header.state.load(Ordering::Acquire) == slot.state_word()
    }
}

/// Yields, then sleeps, while another thread of the process holds the slot's intent. Out of line:
/// the hot path would otherwise load `yield_now`'s address from the GOT on every reservation.
#[cold]
#[inline(never)]
fn wait_longer(round: u32) -> bool {
    match round {
        0..=255 => std::thread::yield_now(),
        256..=5_255 => std::thread::sleep(std::time::Duration::from_micros(200)),
        _ => return false,
    }
    true
}

/// The region's cells for the reservation protocol.
/// One slot's reservations on one device ([`Region::reserver`]): what [`Region::try_reserve`]
/// and [`Region::release`] do, without looking the slot's and the device's cells up each time.
/// A process keeps one for the device it allocates on (every allocation and free on a shared GPU
/// goes through it, often with cold caches: fewer instructions, the same lines).
pub struct Reserver<'r> {
    region: &'r Region,
    cells: reserve::OwnerCells<'r, AtomicU64>,
    device: &'r DeviceState,
    /// The slot's state word (ownership: see [`Region::owns`]).
    state: &'r AtomicU64,
    slot: Slot,
}

impl std::fmt::Debug for Reserver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserver")
            .field("slot", &self.cells.slot)
            .field("device", &self.cells.device)
            .finish()
    }
}

impl Reserver<'_> {
    #[inline(always)]
    fn owned(&self) -> bool {
        // Acquire: as in `Region::owns`.
        self.state.load(Ordering::Acquire) == self.slot.state_word()
    }

    /// [`Region::try_reserve`] for this slot and device.
    #[unsafe(link_section = ".text.hot.vgpu")]
    #[inline]
    pub fn try_reserve(&self, bytes: u64) -> Result<(), ReserveError> {
        // Relaxed: written once before READY (acquired at open).
        let limit = self.device.memory_limit.load(Ordering::Relaxed);
        let result = if self.owned() {
            reserve::owner_op_on(
                self.region,
                &self.cells,
                Kind::Reserve,
                bytes,
                limit,
                || self.owned(),
                Stop::Never,
            )
        } else {
            Err(OpError::Lost)
        };
        match result {
            Ok(applied) => {
                // Relaxed: a statistic (as in `Region::try_reserve`).
                if applied.total > self.device.peak_reserved.load(Ordering::Relaxed) {
                    self.device
                        .peak_reserved
                        .fetch_max(applied.total, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(e) => self
                .region
                .reserve_failed(&self.slot, self.cells.device, bytes, limit, e),
        }
    }

    /// [`Region::release`] for this slot and device. A lost slot has nothing to release; a busy
    /// one keeps holding the bytes (both counters unchanged, so they stay equal): ignored like a
    /// release of a stale handle.
    #[unsafe(link_section = ".text.hot.vgpu")]
    #[inline]
    pub fn release(&self, bytes: u64) {
        if self.owned() {
            let _ = reserve::owner_op_on(
                self.region,
                &self.cells,
                Kind::Release,
                bytes,
                0,
                || self.owned(),
                Stop::Never,
            );
        }
    }

    /// [`Region::prefetch_owner_op`] for this slot and device.
    #[inline(always)]
    pub fn prefetch(&self) {
        crate::prefetch::line_for_write(self.state);
        crate::prefetch::line_for_write(self.cells.held);
        crate::prefetch::line_for_write(self.cells.container);
    }
}

impl reserve::Cells for Region {
    type A = AtomicU64;

    #[inline(always)]
    fn container(&self, device: u32) -> Option<&AtomicU64> {
        self.device(device).map(|d| &d.reserved)
    }

    #[inline(always)]
    fn intent(&self, slot: u32) -> Option<&AtomicU64> {
        self.slot_record(slot).map(|r| &r.header.intent)
    }

    #[inline(always)]
    fn intent_bytes(&self, slot: u32) -> Option<&AtomicU64> {
        self.slot_record(slot).map(|r| &r.header.intent_bytes)
    }

    #[inline(always)]
    fn held(&self, slot: u32, device: u32) -> Option<&AtomicU64> {
        if device >= self.device_count {
            return None;
        }
        self.slot_record(slot)
            .map(|r| &r.header.held[device as usize])
    }

    #[inline(always)]
    fn slot_bits(&self) -> u32 {
        reserve::slot_bits(self.slot_count)
    }

    #[inline(always)]
    fn device_count(&self) -> u32 {
        self.device_count
    }

    #[inline(always)]
    fn pause(&self, round: u32) -> bool {
        // Spin, yield, then sleep 200 us per round: about a second in all.
        if round < 64 {
            std::hint::spin_loop();
            true
        } else {
            wait_longer(round)
        }
    }
}
