//! The allocation and free hooks off their common path: several devices, a denial and the pools'
//! retry, a panic before the driver call, pool allocations, failed driver calls, a key found
//! live, a pitched allocation's corrected charge. All out of line and out of `.text.hot`, so that
//! the common path's code stays in few cache lines (limiter/README.md, "Cold calls").

use std::time::{Duration, Instant};

use limiter_core::{
    accounting::{Accounting as _, Denied},
    charge::Charge,
    oom_wait::{OomWait, physical_oom_level},
};

use crate::{
    hooks::gate::{Hooked, shield},
    platform::{cuda::*, driver::Sym, log},
    runtime::{
        process::{Process, Space},
        state::State,
    },
};

/// `reserve` after a denial: settles the pools and retries once if that returned anything.
#[cold]
#[inline(never)]
pub(super) fn reserve_after_pools(
    state: &State,
    process: &Process,
    charge: Charge,
    denied: Denied,
) -> Result<(), Denied> {
    if process.pools.any_charged() && process.pools.settle_all(state.driver, &process.ledger) > 0 {
        process.ledger.try_reserve(charge.device, charge.bytes)
    } else {
        Err(denied)
    }
}

/// A panic before the driver call: the call goes through unaccounted, and is counted as an error
/// of the API (the limiter failed it) besides the process-wide panic counter.
#[cold]
#[inline(never)]
pub(super) fn call_unaccounted<F: Copy>(
    h: &Hooked<F>,
    sym: Sym,
    call: impl FnOnce(F) -> CUresult,
) -> CUresult {
    let clock = &h.state.clock;
    let t0 = clock.now();
    let r = call(h.real);
    let t1 = clock.now();
    shield(|| h.record(sym, t0, t1, false));
    r
}

/// An allocation refused at the limit: counted, and the caller gets
/// `CUDA_ERROR_OUT_OF_MEMORY` without the driver being called.
#[cold]
#[inline(never)]
pub(super) fn deny<F>(h: &Hooked<F>, sym: Sym, denied: Denied) -> CUresult {
    shield(|| {
        h.process.ledger.record_denied(sym.api(), denied.requested);
        let now = h.state.clock.now();
        h.record(sym, now, now, false);
        log::debug!(
            h.state.log_level(),
            "{}: denied: {denied}",
            sym.name().to_string_lossy()
        );
    });
    CUDA_ERROR_OUT_OF_MEMORY
}

/// An allocation the limit allows and the driver refused for lack of device memory (the GPU is
/// full: other containers or processes hold it). Reported at the level `CUDA_OVERSUBSCRIBE`
/// chooses; under `VGPU_OOM_WAIT` the call is made again on [`OomWait`]'s schedule until it
/// succeeds, fails otherwise or the timeout passes. No lock is held while it sleeps: the
/// reservation under the limit stays (the allocation is the tenant's own, within its limit) and
/// nothing else is taken. The time waited is recorded as time the limiter held the call back.
/// Returns the final result and when it came (clock ticks), or `None` if the wait's logic
/// panicked (the first result stands).
#[cold]
#[inline(never)]
pub(super) fn out_of_device_memory<F: Copy>(
    h: &Hooked<F>,
    sym: Sym,
    charge: Option<Charge>,
    call: impl Fn(F) -> CUresult,
) -> Option<(CUresult, u64)> {
    let state = h.state;
    let timeout = state.config.oom_wait;
    shield(|| {
        log::write(
            state.log_level(),
            physical_oom_level(state.config.oversubscribe),
            format_args!(
                "{}: the GPU has no room for {} bytes on device {} (allowed by the limit){}",
                sym.name().to_string_lossy(),
                charge.map_or(0, |c| c.bytes),
                charge.map_or(0, |c| c.device),
                match timeout {
                    Some(_) => "; waiting for memory to free (VGPU_OOM_WAIT)",
                    None => "",
                },
            ),
        );
    });
    let timeout = timeout?;
    // Cleared when the wait ends, however it ends (a panic unwinding through it included).
    let _published = charge.and_then(|c| shield(|| WaitPublished::begin(h.process, c)).flatten());
    let started = Instant::now();
    let elapsed_ns = || u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut wait = OomWait::start(0, timeout);
    let mut r = CUDA_ERROR_OUT_OF_MEMORY;
    while r == CUDA_ERROR_OUT_OF_MEMORY {
        let Some(sleep_ns) = shield(|| wait.after_failure(elapsed_ns()))? else {
            break;
        };
        std::thread::sleep(Duration::from_nanos(sleep_ns));
        r = call(h.real);
    }
    let waited = elapsed_ns();
    shield(|| h.process.ledger.record_throttled(sym.api(), waited));
    Some((r, state.clock.now()))
}

/// An allocation's wait for device memory, published in the process's slot while it lasts
/// (docs/region.md, `oom_wait_bytes`): what `vgpu-agent run --freeze-on-demand` reads to free
/// room by freezing idle containers. Only a process accounting in a region publishes.
struct WaitPublished {
    ledger: &'static crate::runtime::ledger::RegionLedger,
    seq: u64,
}

impl WaitPublished {
    fn begin(process: &'static Process, c: Charge) -> Option<WaitPublished> {
        let ledger = process.ledger.region()?;
        let device = u32::try_from(c.device).ok()?;
        let seq = ledger.region.begin_oom_wait(&ledger.slot, device, c.bytes);
        Some(WaitPublished { ledger, seq })
    }
}

impl Drop for WaitPublished {
    fn drop(&mut self) {
        self.ledger.region.end_oom_wait(&self.ledger.slot, self.seq);
    }
}

/// `settle_allocation` of a pool allocation (its pool is settled), or of a plain one that
/// failed or has no address (its reservation is returned).
#[cold]
#[inline(never)]
pub(super) fn settle_unusual(
    state: &State,
    process: &Process,
    space: Space,
    c: Charge,
    ok: bool,
    out: *const u64,
) {
    if c.pool == 0 {
        process.ledger.release(c.device, c.bytes);
        return;
    }
    process
        .pools
        .settle(state.driver, &process.ledger, c.pool, c.device, c.bytes, ok);
    if ok && !out.is_null() {
        // SAFETY: the driver succeeded, so it wrote the new address to the caller's `out`.
        let key = unsafe { out.read() };
        if let Some(stale) = process.keep(space, key, c) {
            release_stale(process, stale);
        }
    }
}

/// The driver reused a key we still held: the earlier free was not seen. Its bytes are gone.
#[cold]
#[inline(never)]
pub(super) fn release_stale(process: &Process, stale: Charge) {
    if stale.pool == 0 {
        process.ledger.release(stale.device, stale.bytes);
    }
}

/// After a free of a pool allocation (its pool is settled), or one the driver refused (the key
/// stays live: its charge goes back into the table). Returns the bytes freed.
#[cold]
#[inline(never)]
pub(super) fn settle_free_unusual(
    state: &State,
    process: &Process,
    space: Space,
    key: u64,
    c: Charge,
    r: CUresult,
) -> u64 {
    if r != CUDA_SUCCESS {
        process.keep(space, key, c);
        return 0;
    }
    process
        .pools
        .settle(state.driver, &process.ledger, c.pool, c.device, 0, true);
    c.bytes
}

/// Replaces the estimated charge of a pitched allocation by its real size; if the real size does not
/// fit, the allocation is freed and the caller gets `CUDA_ERROR_OUT_OF_MEMORY`.
pub(super) fn correct_pitch_charge(
    state: &State,
    process: &Process,
    addr: CUdeviceptr,
    actual: u64,
    estimate: u64,
    device: usize,
) -> CUresult {
    if actual == estimate || process.take(Space::Ptr, addr).is_none() {
        return CUDA_SUCCESS;
    }
    let fits = if actual > estimate {
        process
            .ledger
            .try_reserve(device, actual - estimate)
            .is_ok()
    } else {
        process.ledger.release(device, estimate - actual);
        true
    };
    if fits {
        let charge = Charge {
            device,
            bytes: actual,
            pool: 0,
        };
        process.keep(Space::Ptr, addr, charge);
        return CUDA_SUCCESS;
    }
    process.ledger.release(device, estimate);
    // The driver just allocated `addr`; the caller has not been told about it.
    state.driver.free(addr);
    process
        .ledger
        .record_denied(state.api(Sym::MemAllocPitchV2), actual);
    CUDA_ERROR_OUT_OF_MEMORY
}
