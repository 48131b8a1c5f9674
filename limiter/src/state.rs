//! The limiter's process-wide state, created by the first intercepted CUDA call and never before.
//!
//! Initialisation reads the configuration, binds the real driver, calibrates the clock, opens the
//! container's region (see `Config::region_path`) and registers the fork and exit handlers. If the
//! configuration or the driver fails, one message goes to stderr and every intercepted call from then on returns
//! `CUDA_ERROR_NOT_INITIALIZED` without reaching the driver: a malformed limit must not run
//! unlimited. `CUDA_ERROR_NOT_INITIALIZED` was chosen over `CUDA_ERROR_INVALID_VALUE` because it
//! is what the driver itself answers before a successful `cuInit`: runtimes and frameworks report
//! "CUDA unavailable / initialisation error" instead of blaming an argument of some later call.

use std::sync::{
    OnceLock,
    atomic::{AtomicU32, AtomicU64, Ordering},
};

use agent_common::api::ApiId;
use region::{InitOutcome, Region, RegionConfig};

use crate::{
    clock::LazyClock,
    config::{Config, MAX_DEVICES},
    cuda::{CUDA_ERROR_NOT_INITIALIZED, CUresult},
    guard::Reentry,
    hot::hot,
    log,
    real_driver::{self, Driver, Sym},
};

/// How often the hooks (other than launches) look at the control block for a limit change.
pub const CONTROL_POLL_PERIOD_NS: u64 = 10_000_000;

/// The process-wide state. `repr(C)`, what every hooked call reads first: with the region's
/// mapping and counts inline, a call that finds its caches cold fetches one or two lines of
/// this static, not a chain of heap objects. Aligned to a line, so that the fields every hook
/// reads (the clock to the panic switch, 42 bytes) share one.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct State {
    pub clock: LazyClock,
    pub driver: &'static Driver,
    /// Clock reading from which the next hooked call polls the control block.
    control_due: AtomicU64,
    /// Devices the driver reports (`cuDeviceGetCount`), 0 until known.
    device_count: AtomicU32,
    /// `VGPU_DEBUG_PANIC_IN`: the hook whose logic panics on purpose (tests).
    pub panic_in: Option<Sym>,
    /// `VGPU_DEBUG_HOOK_DELAY_NS`: a known self-time added to every launch hook (tests).
    pub hook_delay_ns: u64,
    /// The container's region (it stays mapped for the life of the process, inside this static,
    /// and a forked child keeps the shared mapping). `None`: accounting stays in each process.
    region: Option<Region>,
    /// The control block beside the region (run-time limit changes).
    pub control: Option<crate::control::Control>,
    pub config: Config,
}

// The fields every hook reads share the state's first line.
const _: () = assert!(
    std::mem::offset_of!(State, panic_in) + size_of::<Option<Sym>>() <= 64
        && std::mem::offset_of!(State, device_count) < 64
);

impl State {
    /// The shared API id of a hooked symbol (a constant: see [`Sym::api`]).
    #[inline(always)]
    pub fn api(&self, sym: Sym) -> ApiId {
        sym.api()
    }

    /// Panics if `VGPU_DEBUG_PANIC_IN` names `sym` (called inside the hooks' shielded logic).
    #[inline]
    pub fn debug_panic(&self, sym: Sym) {
        if self.panic_in == Some(sym) {
            panic!("VGPU_DEBUG_PANIC_IN={}", sym.name().to_string_lossy());
        }
    }

    /// The container's region, if this process accounts in one.
    #[inline(always)]
    pub fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// Applies a run-time limit change if the control block has one (see `control.rs`).
    #[inline(always)]
    pub fn poll_control(&self) {
        if let Some(c) = &self.control {
            c.poll(&self.config, self.region.as_ref());
        }
    }

    /// [`State::poll_control`] at most once per [`CONTROL_POLL_PERIOD_NS`] per process: `now` is
    /// a reading of [`State::clock`]. The control block is a page of its own, a cache line and a
    /// TLB entry that a process entering the limiter with cold caches need not fetch every time.
    #[inline(always)]
    pub fn poll_control_due(&self, now: u64) {
        // Relaxed: a rate limit; threads that race both poll, which is harmless, and the poll
        // reads the block under its own seqlock.
        if now >= self.control_due.load(Ordering::Relaxed) {
            self.poll_control_shielded(now);
        }
    }

    /// [`State::poll_control`] inside [`crate::guard::shield`], out of line: the hooks call it
    /// outside their own shields, and its unwinding landing pad stays out of their hot code.
    /// Sets the next poll [`CONTROL_POLL_PERIOD_NS`] after `now`.
    #[cold]
    #[inline(never)]
    fn poll_control_shielded(&self, now: u64) {
        let period = self.clock.get().ticks(CONTROL_POLL_PERIOD_NS);
        // Relaxed: see `poll_control_due`.
        self.control_due
            .store(now.saturating_add(period), Ordering::Relaxed);
        crate::guard::shield(|| self.poll_control());
    }

    /// Whether the driver has exactly one device, in which case every context is on device 0.
    /// Asked once (after `cuInit`, when the driver answers), then remembered: the device count of
    /// a process does not change.
    #[inline(always)]
    pub fn single_device(&self) -> bool {
        // Relaxed: a value that never changes once stored; a stale 0 only asks again.
        match self.device_count.load(Ordering::Relaxed) {
            1 => true,
            0 => self.learn_device_count() == 1,
            _ => false,
        }
    }

    #[cold]
    #[inline(never)]
    fn learn_device_count(&self) -> u32 {
        let Some(get) = self.driver.get::<crate::real_driver::sym::DeviceGetCount>() else {
            return 0;
        };
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        if unsafe { get(&mut n) } != crate::cuda::CUDA_SUCCESS || n <= 0 {
            return 0;
        }
        let n = n as u32;
        // Relaxed: see `single_device`.
        self.device_count.store(n, Ordering::Relaxed);
        n
    }
}

/// The region configuration this process asks for: its limits on all [`MAX_DEVICES`] devices.
/// The device count is fixed rather than the driver's, so every process of a container asks for
/// the same geometry whatever `CUDA_VISIBLE_DEVICES` says (the region is created before `cuInit`
/// has run); indices are CUDA ordinals.
pub fn region_config(config: &Config) -> RegionConfig {
    let mut rc = RegionConfig::unlimited(MAX_DEVICES as u32);
    for d in 0..MAX_DEVICES {
        rc.memory_limit[d] = config.memory_limit[d].unwrap_or(0);
        rc.sm_limit[d] = config.sm_limit[d].unwrap_or(0);
    }
    rc
}

/// Opens (or creates) the region; `None` (logged) if there is none or it cannot be used, in which
/// case each process enforces its limit alone.
fn open_region(config: &Config) -> Option<Region> {
    let path = config.region_path()?;
    match Region::open_or_create(&path, &region_config(config)) {
        Ok((region, outcome)) => {
            if let InitOutcome::ConfigMismatch(m) = &outcome {
                log::write(
                    log::Level::Warn,
                    format_args!(
                        "region {} was created with other limits (memory {:?}); the region's apply, not ours ({:?})",
                        path.display(),
                        &m.effective.memory_limit[..m.effective.devices as usize],
                        &m.requested.memory_limit[..m.requested.devices as usize],
                    ),
                );
            }
            log::debug!("region {}: {outcome:?}", path.display());
            Some(region)
        }
        Err(e) => {
            log::write(
                log::Level::Error,
                format_args!("{e}; limits are enforced per process, not across the container"),
            );
            None
        }
    }
}

#[unsafe(link_section = ".data.hot.vgpu")]
static STATE: OnceLock<Result<State, CUresult>> = OnceLock::new();

/// The state, initialised by the first caller. The guard proves the caller is inside the limiter,
/// so that a hooked call made by the driver while it loads on this thread does not re-enter here.
#[inline]
pub fn get(guard: &Reentry) -> Result<&'static State, CUresult> {
    match ready_fast() {
        Some(s) => Ok(s),
        None => get_slow(guard),
    }
}

/// The state if it is published in the hot line already: one load, nothing that can panic.
#[inline(always)]
pub fn ready_fast() -> Option<&'static State> {
    // Acquire: pairs with the Release store in `get_slow` (the state's fields are visible).
    let ready = hot().state.load(Ordering::Acquire);
    // SAFETY: a non-null pointer points into `STATE`, initialised and never changed again.
    unsafe { ready.as_ref() }
}

/// [`get`] before the state is published in the hot line: initialises it (the first caller),
/// or returns the initialisation's error.
#[cold]
#[inline(never)]
fn get_slow(guard: &Reentry) -> Result<&'static State, CUresult> {
    let state = STATE.get_or_init(|| init(guard)).as_ref().map_err(|&c| c)?;
    // Release: pairs with the Acquire load in `get`.
    hot()
        .state
        .store(std::ptr::from_ref(state).cast_mut(), Ordering::Release);
    Ok(state)
}

/// The state if initialised successfully, without initialising it.
pub fn ready() -> Option<&'static State> {
    STATE.get().and_then(|s| s.as_ref().ok())
}

fn init(guard: &Reentry) -> Result<State, CUresult> {
    let started = std::time::Instant::now();
    let cpu = crate::clock::thread_cpu_ns();
    // Calibrated until the first conversion (after this call's driver call), not spun out here.
    let clock = LazyClock::start();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            log::emit(
                log::Level::Error,
                format_args!(
                    "configuration error: {e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"
                ),
            );
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
    };
    log::set_level(config.log_level);
    let driver = match real_driver::bind(guard) {
        Ok(d) => d,
        Err(e) => {
            log::emit(
                log::Level::Error,
                format_args!("{e}; every CUDA call will fail with CUDA_ERROR_NOT_INITIALIZED"),
            );
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
    };
    let panic_in = config
        .debug_panic_in
        .as_deref()
        .and_then(|n| Sym::hooked_by_name(n.as_bytes()));
    let region = open_region(&config);
    crate::sm::CONTROLLER.set_limits(&config.sm_limit, config.sm_period_ms);
    crate::sm_feedback::ensure_started(config.sm_feedback);
    let control = region.as_ref().and_then(crate::control::Control::open);
    crate::process::register_handlers();
    // Start-up cost figures (`scripts/gpu/bench-limiter.sh` reads them): wall time, and the
    // thread's CPU time (the rest is waiting: descheduled, or for another process).
    log::write(
        log::Level::Info,
        format_args!(
            "initialised in {} us (cpu {} us): memory limits {:?}",
            started.elapsed().as_micros(),
            crate::clock::thread_cpu_ns().saturating_sub(cpu) / 1000,
            config.memory_limit
        ),
    );
    // The next poll after the one below: a period of ticks counted as nanoseconds (the clock
    // is not converted yet, and would have to wait for its calibration); a TSC of at least 1 GHz
    // makes that at most the period. Later polls use the calibrated clock.
    let control_due = AtomicU64::new(clock.now().saturating_add(CONTROL_POLL_PERIOD_NS));
    let state = State {
        clock,
        region,
        control,
        panic_in,
        hook_delay_ns: config.debug_hook_delay_ns,
        control_due,
        device_count: AtomicU32::new(0),
        config,
        driver,
    };
    // A change written before this process started applies from its first call.
    state.poll_control();
    Ok(state)
}

#[cfg(test)]
mod tests {
    use agent_common::api::ApiId;

    use crate::real_driver::Sym;

    /// Every hooked symbol has an id in the shared API table (append missing ones there).
    #[test]
    fn hooked_symbols_have_api_ids() {
        for &s in Sym::ALL.iter().filter(|s| s.hooked()) {
            let name = s.name().to_str().unwrap();
            assert!(
                ApiId::from_name(name).is_some(),
                "{name} is missing from agent_common::api::APIS"
            );
        }
    }
}
