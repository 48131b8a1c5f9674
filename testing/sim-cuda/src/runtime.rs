//! What every entry point does before its own work: configuration, delay, failure injection,
//! the initialisation check and logging. Lock-free after the first call of each symbol.

use crate::config::config;
use crate::types::*;
use agent_common::api::ApiId;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The process's first call, and `CLOCK_MONOTONIC` then (to convert the shared device's times).
static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Nanoseconds since [`EPOCH`] at which all launched work will have finished.
static BUSY_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Entry points that work before `cuInit`, as in the real driver.
const NO_INIT: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetExportTable",
];

/// The call gate of the checkpoint lock (`checkpoint.rs`): while it is closed, every entry point
/// waits before its own work, as the driver's `cuCheckpointProcessLock` blocks the process's CUDA
/// calls. Only in processes that can be checkpointed (a shared device): elsewhere a call pays
/// one relaxed load.
static GATE_ON: AtomicBool = AtomicBool::new(false);
/// Whether the gate is closed. SeqCst with [`IN_FLIGHT`]: a call counts itself in, then looks at
/// the gate; the lock closes the gate, then waits for the count to reach 0. Either the call sees
/// the gate closed, or the lock sees the call in flight.
static GATE_CLOSED: AtomicBool = AtomicBool::new(false);
/// Calls past the gate and not yet returned.
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// Where waiting calls sleep until the gate opens.
static GATE_WAIT: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// Turns the call gate on (before the first checkpoint request can arrive).
pub fn enable_gate() {
    GATE_ON.store(true, Ordering::SeqCst);
}

/// Closes the gate and waits up to `timeout` for the calls in flight to return; reopens it and
/// returns false if they do not.
pub fn close_gate(timeout: Duration) -> bool {
    GATE_CLOSED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + timeout;
    while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        if Instant::now() >= deadline {
            open_gate();
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// Opens the gate and wakes the calls waiting at it.
pub fn open_gate() {
    let _guard = GATE_WAIT.0.lock().unwrap_or_else(|e| e.into_inner());
    GATE_CLOSED.store(false, Ordering::SeqCst);
    GATE_WAIT.1.notify_all();
}

/// Runs `body` past the gate.
#[inline(always)]
fn through_gate(body: impl FnOnce() -> CUresult) -> CUresult {
    // Relaxed: set once at cuInit, before any lock can be asked for.
    if !GATE_ON.load(Ordering::Relaxed) {
        return body();
    }
    loop {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        if !GATE_CLOSED.load(Ordering::SeqCst) {
            break;
        }
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        let mut guard = GATE_WAIT.0.lock().unwrap_or_else(|e| e.into_inner());
        while GATE_CLOSED.load(Ordering::SeqCst) {
            guard = GATE_WAIT.1.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }
    let r = body();
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    r
}

pub fn set_initialized() {
    INITIALIZED.store(true, Ordering::Release);
}

fn epoch() -> &'static (Instant, u64) {
    EPOCH.get_or_init(|| (Instant::now(), crate::shared::monotonic_ns()))
}

/// Nanoseconds since the process's first call.
pub fn now_ns() -> u64 {
    epoch().0.elapsed().as_nanos() as u64
}

/// Waits for `d`: a busy-wait for the last 60 us (all of it below 50 us), a sleep before that, so
/// that short delays are accurate and long ones do not burn a core.
pub fn wait(d: Duration) {
    if d.is_zero() {
        return;
    }
    let deadline = Instant::now() + d;
    if d >= Duration::from_micros(50) {
        std::thread::sleep(d - Duration::from_micros(60).min(d));
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// Waits until the simulated device time `until_ns` (see [`now_ns`]).
pub fn wait_until_ns(until_ns: u64) {
    let now = now_ns();
    if until_ns > now {
        wait(Duration::from_nanos(until_ns - now));
    }
}

/// Records a launch: the device is busy for `SIMCUDA_LAUNCH_US` more after all earlier work
/// (of this process, or with `SIMCUDA_SHARED_DEVICE` of every process sharing the device; then
/// this process's work ends when its own last launch does).
pub fn launch_work() {
    launch_work_ns(config().launch.as_nanos() as u64);
}

/// The device time of a launch of the kernel named `name`: its `SIMCUDA_KERNEL_US` rule, else
/// `SIMCUDA_LAUNCH_US`.
pub fn kernel_ns(name: Option<&[u8]>) -> u64 {
    let c = config();
    name.and_then(|n| c.kernels.iter().find(|r| r.name.as_bytes() == n))
        .map_or(c.launch, |r| r.value)
        .as_nanos() as u64
}

/// Records a launch that keeps the device busy for `launch` ns (see [`launch_work`]).
pub fn launch_work_ns(launch: u64) {
    if launch == 0 {
        return;
    }
    if let Some(device) = crate::shared::device() {
        let end = device.launch(launch).saturating_sub(epoch().1);
        BUSY_UNTIL.fetch_max(end, Ordering::AcqRel);
        return;
    }
    let now = now_ns();
    let mut cur = BUSY_UNTIL.load(Ordering::Acquire);
    loop {
        match BUSY_UNTIL.compare_exchange_weak(
            cur,
            cur.max(now) + launch,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(v) => cur = v,
        }
    }
}

/// The time at which all work this process launched so far will have finished.
pub fn busy_until() -> u64 {
    BUSY_UNTIL.load(Ordering::Acquire)
}

/// The time at which the device reaches an event recorded now: when all work launched before it
/// has finished. On a shared device that is every process's work queued so far (the device runs
/// it in launch order), so a pair of events around a launch times that launch alone, as a GPU's
/// events do when another context's work runs before it.
pub fn event_reached_ns() -> u64 {
    match crate::shared::device() {
        Some(device) => device
            .busy_until()
            .saturating_sub(epoch().1)
            .max(busy_until()),
        None => busy_until(),
    }
}

/// Waits until all launched work has finished.
pub fn sync_device() {
    wait_until_ns(busy_until());
}

thread_local! {
    /// Duration of this thread's last call of a symbol with a sweep or a delay, ns.
    static LAST_CALL_NS: Cell<u64> = const { Cell::new(0) };
}

/// Duration of the calling thread's last call of a symbol that sweeps (`SIMCUDA_SWEEP`) or
/// waits (`SIMCUDA_DELAY_US`), in ns, measured inside the library from the start of its common
/// prologue to the end of the sweep: a benchmark subtracts it from the time it measured around
/// the call to get what was spent outside the driver (in a preloaded limiter, say), and a test
/// of attribution compares it with the time attributed to the driver (it includes whatever the
/// machine took from the call while it waited, as the attributed time does).
pub fn last_call_ns() -> u64 {
    LAST_CALL_NS.with(Cell::get)
}

/// The sweep buffer: as large as the largest `SIMCUDA_SWEEP` rule, every page written once (an
/// untouched page would read as the shared zero page and evict nothing), small pages only (a
/// huge page would leave the caller's TLB entries alone).
fn sweep_buffer() -> &'static [u64] {
    static BUFFER: OnceLock<&'static [u64]> = OnceLock::new();
    BUFFER.get_or_init(|| {
        let bytes = config().sweeps.iter().map(|r| r.value).max().unwrap_or(0) as usize;
        let words = bytes.div_ceil(8).max(1);
        let buf: &'static mut [u64] = Vec::leak(vec![0u64; words]);
        // SAFETY: advice on memory this function owns (leaked, never freed); failure is harmless.
        unsafe { libc::madvise(buf.as_mut_ptr().cast(), words * 8, libc::MADV_NOHUGEPAGE) };
        for (i, w) in buf.iter_mut().enumerate() {
            *w = i as u64;
        }
        buf
    })
}

/// Reads one word of every cache line of the first `bytes` of the sweep buffer.
fn sweep(bytes: u64) {
    let buf = sweep_buffer();
    let lines = (bytes as usize / 64).min(buf.len() / 8);
    let mut sum = 0u64;
    for line in 0..lines {
        // SAFETY: `line * 8 < buf.len()`, an initialised word of a live buffer.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(buf.as_ptr().add(line * 8)) });
    }
    std::hint::black_box(sum);
}

struct SymCfg {
    /// `SIMCUDA_SWEEP` bytes for this symbol (0: none, and the call is not timed).
    sweep: u64,
    delay: Duration,
    fail_every: u64,
    needs_init: bool,
    log: bool,
}

/// Per-entry-point state: a static in every exported function.
pub struct Sym {
    name: &'static str,
    cfg: OnceLock<SymCfg>,
    calls: AtomicU64,
}

impl Sym {
    pub const fn new(name: &'static str) -> Sym {
        Sym {
            name,
            cfg: OnceLock::new(),
            calls: AtomicU64::new(0),
        }
    }

    fn cfg(&self) -> &SymCfg {
        self.cfg.get_or_init(|| {
            let c = config();
            let kind = ApiId::from_name(self.name)
                .and_then(|id| id.spec())
                .map(|s| s.kind.name());
            SymCfg {
                sweep: c.sweep_for(self.name, kind),
                delay: c.delay_for(self.name, kind),
                fail_every: c.fail_every(self.name, kind),
                needs_init: c.require_init && !NO_INIT.contains(&self.name),
                log: c.log,
            }
        })
    }

    /// Runs the common part of a call, then `body` unless the call fails early, then the sweep
    /// if the symbol has one (a call with a sweep or a delay is timed, see [`last_call_ns`]).
    #[inline(always)]
    pub fn call(&self, body: impl FnOnce() -> CUresult) -> CUresult {
        let cfg = self.cfg();
        if cfg.sweep == 0 && cfg.delay.is_zero() {
            return self.call_untimed(cfg, body);
        }
        let t0 = Instant::now();
        let r = self.call_untimed(cfg, body);
        sweep(cfg.sweep);
        LAST_CALL_NS.with(|c| c.set(t0.elapsed().as_nanos() as u64));
        r
    }

    #[inline(always)]
    fn call_untimed(&self, cfg: &SymCfg, body: impl FnOnce() -> CUresult) -> CUresult {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        // The delay is time inside the driver: a checkpoint lock waits for it.
        let r = through_gate(|| {
            wait(cfg.delay);
            if cfg.fail_every != 0 && n.is_multiple_of(cfg.fail_every) {
                CUDA_ERROR_UNKNOWN
            } else if cfg.needs_init && !INITIALIZED.load(Ordering::Acquire) {
                CUDA_ERROR_NOT_INITIALIZED
            } else {
                body()
            }
        });
        if cfg.log {
            eprintln!("simcuda: {} #{n} -> {r}", self.name);
        }
        r
    }
}
