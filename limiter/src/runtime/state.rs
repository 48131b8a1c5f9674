//! The limiter's process-wide state, created by the first intercepted CUDA call and never before
//! (`runtime::Runtime::state_or_init`): the configuration, the bound driver, the clock, the
//! container's region and its control block, and the SM controller.
//!
//! If the configuration or the driver fails, one message goes to stderr and every intercepted
//! call from then on returns `CUDA_ERROR_NOT_INITIALIZED` without reaching the driver: a malformed
//! limit must not run unlimited. `CUDA_ERROR_NOT_INITIALIZED` was chosen over
//! `CUDA_ERROR_INVALID_VALUE` because it is what the driver itself answers before a successful
//! `cuInit`: runtimes and frameworks report "CUDA unavailable / initialisation error" instead of
//! blaming an argument of some later call.

use agent_common::MAX_DEVICES;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use agent_common::api::ApiId;
use limiter_core::{config::Config, gpu_time::SampleRate, sm::Controller};
use region::{InitOutcome, Region, RegionConfig, SmShare};

use super::{
    control::Control,
    own_freeze::OwnFreeze,
    qos::Qos,
    sm_feedback::{Feedback, Plant},
};
use crate::platform::{
    clock::LazyClock,
    driver::{Driver, Sym},
    guard::Panics,
    log::{self, Level},
    thread_words::Tls,
};

/// How often the hooks (other than launches) look at the control block for a limit change.
pub(crate) const CONTROL_POLL_PERIOD_NS: u64 = 10_000_000;

/// The process-wide state. `repr(C)`, what every hooked call reads first: with the region's
/// mapping and counts inline, a call that finds its caches cold fetches one or two lines of
/// the runtime's static, not a chain of heap objects. Aligned to a line, so that the fields every
/// hook reads (the clock to the panic switch, 42 bytes) share one.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct State {
    pub(crate) clock: LazyClock,
    pub(crate) driver: &'static Driver,
    /// Clock reading from which the next hooked call polls the control block.
    control_due: AtomicU64,
    /// Devices the driver reports (`cuDeviceGetCount`), 0 until known.
    device_count: AtomicU32,
    /// `VGPU_DEBUG_PANIC_IN`: the hook whose logic panics on purpose (tests).
    panic_in: Option<Sym>,
    /// `VGPU_DEBUG_HOOK_DELAY_NS`: a known self-time added to every launch hook (tests).
    pub(crate) hook_delay_ns: u64,
    /// The in-process freeze (`VGPU_FREEZE_IN_PROCESS`): every hooked call passes its gate.
    /// Leaked with the state (both live for the process).
    pub(crate) own_freeze: Option<&'static OwnFreeze>,
    /// The control block beside the region (run-time limit changes).
    control: Option<Control>,
    /// The container's region (it stays mapped for the life of the process, inside the runtime's
    /// static, and a forked child keeps the shared mapping). `None`: accounting stays in each
    /// process.
    region: Option<Region>,
    pub(crate) config: Config,
    /// The SM share's duty cycle per device (`limiter_core::sm`): launches read its switch.
    pub(crate) sm: Controller,
    /// The SM share of each device without a run-time override: the region's (the first
    /// initialiser's: one share per container), else the environment's.
    sm_base: [Option<u8>; MAX_DEVICES],
    /// The duty-cycle words of a process without a region (with one, the region's are used:
    /// the container's processes draw from one window per device).
    local_sm: Box<[SmShare; MAX_DEVICES]>,
    feedback: Feedback,
    /// The container's QoS tier and what its launches read of it.
    pub(crate) qos: Qos,
    /// The runtime's panic counter and thread words (process-wide services the state's users
    /// reach through it).
    pub(crate) panics: &'static Panics,
    pub(crate) tls: &'static Tls,
}

// The fields every hook reads share the state's first line.
const _: () = assert!(
    std::mem::offset_of!(State, panic_in) + size_of::<Option<Sym>>() <= 64
        && std::mem::offset_of!(State, device_count) < 64
        && std::mem::offset_of!(State, hook_delay_ns) + 8 <= 64
        && std::mem::offset_of!(State, own_freeze) + 8 <= 64
);

/// What the state is built from besides the configuration: the process-wide services the runtime
/// owns.
#[derive(Clone, Copy)]
pub(crate) struct Services {
    pub(crate) driver: &'static Driver,
    pub(crate) panics: &'static Panics,
    pub(crate) tls: &'static Tls,
}

impl State {
    /// The state of this process under `config`: opens (or creates) the container's region and
    /// its control block, and applies the SM shares and any change already in the block. The
    /// caller places it where it lives (for the process's life) and then calls
    /// [`State::start`].
    pub(crate) fn new(config: Config, clock: LazyClock, services: Services) -> State {
        let region = open_region(&config);
        let sm_base = match &region {
            Some(r) => {
                let effective = r.config();
                std::array::from_fn(|d| Some(effective.sm_limit[d]).filter(|&p| p != 0))
            }
            None => config.sm_limit,
        };
        let sm = Controller::new();
        sm.set_limits(&sm_base, config.sm_period_ms);
        let control = region
            .as_ref()
            .and_then(|r| Control::open(r, config.log_level));
        let qos = Qos::new(config.qos_tier, config.qos_board.clone());
        // A change written before this process started applies from its first call.
        if let Some(c) = &control {
            c.poll(&config, &sm_base, region.as_ref(), &sm, &qos);
        }
        // The next poll after that: a period of ticks counted as nanoseconds (the clock is not
        // converted yet, and would have to wait for its calibration); a TSC of at least 1 GHz
        // makes that at most the period. Later polls use the calibrated clock.
        let control_due = AtomicU64::new(clock.now().saturating_add(CONTROL_POLL_PERIOD_NS));
        State {
            clock,
            driver: services.driver,
            control_due,
            device_count: AtomicU32::new(0),
            panic_in: config
                .debug_panic_in
                .as_deref()
                .and_then(|n| Sym::hooked_by_name(n.as_bytes())),
            hook_delay_ns: config.debug_hook_delay_ns,
            own_freeze: config
                .freeze_in_process
                .then(|| &*Box::leak(Box::new(OwnFreeze::new()))),
            control,
            region,
            feedback: Feedback::new(config.sm_feedback),
            qos,
            config,
            sm,
            sm_base,
            local_sm: Box::new([const { SmShare::new() }; MAX_DEVICES]),
            panics: services.panics,
            tls: services.tls,
        }
    }

    /// Starts what runs beside the application once the state is in place: the QoS thread if
    /// the container has a tier, the SM feedback thread if some device is limited (again in a
    /// forked child).
    pub(crate) fn start(&'static self) {
        let plant = Plant {
            sm: &self.sm,
            windows: self.sm_windows(),
            region: self.region.as_ref(),
            driver: self.driver,
            log: self.config.log_level,
            panics: self.panics,
            tls: self.tls,
            gpu_time: self.config.gpu_time_sample != SampleRate::Off,
        };
        self.qos.ensure_started(plant);
        self.feedback.ensure_started(plant);
    }

    /// The configured log level.
    #[inline]
    pub(crate) fn log_level(&self) -> Level {
        self.config.log_level
    }

    /// The shared API id of a hooked symbol (a constant: see [`Sym::api`]).
    #[inline(always)]
    pub(crate) fn api(&self, sym: Sym) -> ApiId {
        sym.api()
    }

    /// Panics if `VGPU_DEBUG_PANIC_IN` names `sym` (called inside the hooks' shielded logic).
    #[inline]
    pub(crate) fn debug_panic(&self, sym: Sym) {
        if self.panic_in == Some(sym) {
            panic!("VGPU_DEBUG_PANIC_IN={}", sym.name().to_string_lossy());
        }
    }

    /// The container's region, if this process accounts in one.
    #[inline(always)]
    pub(crate) fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// The duty-cycle words of every device: the region's (the container's), else this
    /// process's own.
    #[inline]
    pub(crate) fn sm_windows(&self) -> &[SmShare; MAX_DEVICES] {
        match &self.region {
            Some(r) => r.sm_shares(),
            None => &self.local_sm,
        }
    }

    /// The control block beside the region, if there is one.
    pub(crate) fn control(&self) -> Option<&Control> {
        self.control.as_ref()
    }

    /// Applies a run-time limit change if the control block has one (see `control.rs`).
    #[inline(always)]
    pub(crate) fn poll_control(&'static self) {
        if let Some(c) = &self.control
            && c.poll(
                &self.config,
                &self.sm_base,
                self.region.as_ref(),
                &self.sm,
                &self.qos,
            )
        {
            self.start();
        }
    }

    /// [`State::poll_control`] at most once per [`CONTROL_POLL_PERIOD_NS`] per process: `now` is
    /// a reading of [`State::clock`]. The control block is a page of its own, a cache line and a
    /// TLB entry that a process entering the limiter with cold caches need not fetch every time.
    #[inline(always)]
    pub(crate) fn poll_control_due(&'static self, now: u64) {
        // Relaxed: a rate limit; threads that race both poll, which is harmless, and the poll
        // reads the block under its own seqlock.
        if now >= self.control_due.load(Ordering::Relaxed) {
            self.poll_control_shielded(now);
        }
    }

    /// [`State::poll_control`] inside the panic shield, out of line: the hooks call it outside
    /// their own shields, and its unwinding landing pad stays out of their hot code. Sets the
    /// next poll [`CONTROL_POLL_PERIOD_NS`] after `now`.
    #[cold]
    #[inline(never)]
    fn poll_control_shielded(&'static self, now: u64) {
        let period = self.clock.get().ticks(CONTROL_POLL_PERIOD_NS);
        // Relaxed: see `poll_control_due`.
        self.control_due
            .store(now.saturating_add(period), Ordering::Relaxed);
        self.panics.shield(|| self.poll_control());
    }

    /// Whether the driver has exactly one device, in which case every context is on device 0.
    /// Asked once (after `cuInit`, when the driver answers), then remembered: the device count of
    /// a process does not change.
    #[inline(always)]
    pub(crate) fn single_device(&self) -> bool {
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
        let n = self.driver.device_count();
        if n != 0 {
            // Relaxed: see `single_device`.
            self.device_count.store(n, Ordering::Relaxed);
        }
        n
    }

    /// The current context's device, 0 without one. With a single device that is 0 without
    /// asking the driver (a call into it per allocation, with its own cold cache lines).
    #[inline(always)]
    pub(crate) fn current_device(&self) -> usize {
        if self.single_device() {
            return 0;
        }
        self.context_device()
    }

    /// [`State::current_device`] with several devices: asks the driver. Out of line (a single
    /// device is the common case on a shared GPU).
    #[cold]
    #[inline(never)]
    fn context_device(&self) -> usize {
        self.driver.context_device().unwrap_or(0)
    }
}

/// The region configuration this process asks for: its limits on all [`MAX_DEVICES`] devices.
/// The device count is fixed rather than the driver's, so every process of a container asks for
/// the same geometry whatever `CUDA_VISIBLE_DEVICES` says (the region is created before `cuInit`
/// has run); indices are CUDA ordinals.
pub(crate) fn region_config(config: &Config) -> RegionConfig {
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
    let level = config.log_level;
    match Region::open_or_create(&path, &region_config(config)) {
        Ok((region, outcome)) => {
            if let InitOutcome::ConfigMismatch(m) = &outcome {
                log::write(
                    level,
                    Level::Warn,
                    format_args!(
                        "region {} was created with other limits (memory {:?}, SM {:?}); the region's apply, not ours ({:?}, SM {:?})",
                        path.display(),
                        &m.effective.memory_limit[..m.effective.devices as usize],
                        &m.effective.sm_limit[..m.effective.devices as usize],
                        &m.requested.memory_limit[..m.requested.devices as usize],
                        &m.requested.sm_limit[..m.requested.devices as usize],
                    ),
                );
            }
            log::debug!(level, "region {}: {outcome:?}", path.display());
            if config.freeze_after.is_some() {
                // The container's processes share its environment: each publishes the same TTL.
                region.set_freeze_after(config.freeze_after);
            }
            Some(region)
        }
        Err(e) => {
            log::write(
                level,
                Level::Error,
                format_args!("{e}; limits are enforced per process, not across the container"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_common::api::ApiId;

    use crate::platform::driver::Sym;

    /// Every hooked symbol has an id in the shared API table (append missing ones there), but
    /// the memsets, 2D/3D and array copies and stream memory operations: hooked only to look at
    /// the control block and pass the freeze's gate, not recorded (the table has no room for
    /// their 62 variants); and the virtual memory API's handle and access calls, hooked to
    /// translate the application's handles and record its access for the in-process freeze.
    #[test]
    fn hooked_symbols_have_api_ids() {
        for &s in Sym::ALL.iter().filter(|s| s.hooked()) {
            let name = s.name().to_str().unwrap();
            if name.starts_with("cuMemset")
                || name.starts_with("cuMemcpy2D")
                || name.starts_with("cuMemcpy3D")
                || name.starts_with("cuMemcpyAtoD")
                || name.starts_with("cuMemcpyDtoA")
                || name.starts_with("cuStreamWaitValue")
                || name.starts_with("cuStreamWriteValue")
                || name.starts_with("cuStreamBatchMemOp")
                || [
                    "cuMemSetAccess",
                    "cuMemRetainAllocationHandle",
                    "cuMemGetAllocationPropertiesFromHandle",
                    "cuMemExportToShareableHandle",
                    "cuMemMapArrayAsync",
                ]
                .contains(&name)
            {
                assert!(ApiId::from_name(name).is_none(), "{name}");
                continue;
            }
            assert!(
                ApiId::from_name(name).is_some(),
                "{name} is missing from agent_common::api::APIS"
            );
        }
    }
}
