//! The SM share's feedback thread, `vgpu-sm`: every `TICK` it reads this process's samples of
//! `nvmlDeviceGetProcessUtilization` and lets each limited device's correction loop
//! (`limiter_core::sm::feedback::Loop`) move the duty cycle the controller's windows use.
//!
//! One thread per process, started when some device is limited and `VGPU_SM_FEEDBACK` is not `0`
//! (again in a forked child: threads do not survive fork). Without NVML (library, `nvmlInit_v2`
//! or the symbol missing) it logs once at Info and exits: open loop. NVML reports host pids; a
//! process in another pid namespace never finds its own pid in the samples, and its correction
//! stays off (logged once at Info). The thread never touches the launch path: launches read the
//! corrected duty cycle with one relaxed load.

use std::sync::atomic::{AtomicI32, Ordering};

use limiter_core::{
    config::MAX_DEVICES,
    sm::{
        Controller,
        feedback::{Loop, TICK},
    },
};

use crate::platform::{
    driver::{Driver, find_real_dlsym},
    guard::{Panics, Reentry},
    log::{self, Level},
    nvml::{
        Nvml,
        sampler::{Handle, Sampler},
    },
    os,
    thread_words::Tls,
};

/// Ticks with samples of other processes but none of ours before that is logged.
const FOREIGN_TICKS: u32 = 10;
/// Log the loop's state at Info every this many ticks.
const LOG_EVERY: u32 = 4;

/// Whether this process runs the thread.
#[derive(Debug)]
pub(crate) struct Feedback {
    /// `VGPU_SM_FEEDBACK`.
    enabled: bool,
    /// The pid whose process runs the thread (0: none): a forked child starts its own.
    started: AtomicI32,
}

/// What the thread works with: all of it lives as long as the process.
#[derive(Clone, Copy)]
pub(crate) struct Plant {
    pub(crate) sm: &'static Controller,
    pub(crate) driver: &'static Driver,
    pub(crate) log: Level,
    pub(crate) panics: &'static Panics,
    pub(crate) tls: &'static Tls,
}

impl Feedback {
    pub(crate) fn new(enabled: bool) -> Feedback {
        Feedback {
            enabled,
            started: AtomicI32::new(0),
        }
    }

    /// Starts the thread if some device is limited, the loop is enabled and this process has
    /// none.
    pub(crate) fn ensure_started(&self, plant: Plant) {
        if !self.enabled || !plant.sm.active() {
            return;
        }
        let pid = os::pid();
        // Relaxed: only elects the one caller that spawns; nothing else is published through it.
        if self.started.swap(pid, Ordering::Relaxed) == pid {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("vgpu-sm".into())
            .spawn(move || {
                plant.panics.shield(|| run(plant));
            });
        if let Err(e) = spawned {
            log::write(
                plant.log,
                Level::Warn,
                format_args!("cannot start the SM feedback thread ({e}); SM shares stay open-loop"),
            );
        }
    }
}

/// Per device: the NVML handle, the loop and what was seen.
#[derive(Default)]
struct Device {
    handle: Option<Handle>,
    lp: Option<Loop>,
    last_seen: u64,
    closes: u64,
    foreign_ticks: u32,
    /// NVML has reported this process at least once.
    seen_ours: bool,
    ticks: u32,
}

fn run(plant: Plant) {
    // Anything this thread reaches through a hook passes straight to the driver.
    let _inside = Reentry::enter(plant.tls.words());
    let sampler = match Sampler::open(find_real_dlsym().and_then(Nvml::open)) {
        Ok(s) => s,
        Err(e) => {
            log::write(
                plant.log,
                Level::Info,
                format_args!("{e}; SM shares stay open-loop (no NVML feedback)"),
            );
            return;
        }
    };
    let mut devices: Vec<Device> = (0..MAX_DEVICES).map(|_| Device::default()).collect();
    let mut buf = Vec::new();
    let mut logged_foreign = false;
    let mut logged_error = false;
    let start = std::time::Instant::now();
    loop {
        std::thread::sleep(TICK);
        let now_ms = start.elapsed().as_millis() as u64;
        // A panic in one tick leaves the loop as it was; the next tick tries again.
        plant.panics.shield(|| {
            let pid = os::pid() as u32;
            for (d, dev) in devices.iter_mut().enumerate() {
                let target = plant.sm.percent(d);
                if target == 0 {
                    dev.lp = None;
                    continue;
                }
                if dev
                    .lp
                    .as_ref()
                    .is_none_or(|l| l.target() != f64::from(target))
                {
                    dev.lp = Some(Loop::new(target));
                }
                if dev.handle.is_none() {
                    dev.handle = sampler.handle(plant.driver, d);
                }
                let Some(handle) = dev.handle else { continue };
                buf.clear();
                if let Err(e) = sampler.samples(handle, dev.last_seen, &mut buf) {
                    if !logged_error {
                        logged_error = true;
                        log::write(
                            plant.log,
                            Level::Info,
                            format_args!("{e}; the SM correction of device {d} holds meanwhile"),
                        );
                    }
                    continue;
                }
                let ours: Vec<(u64, u32)> = buf
                    .iter()
                    .filter(|s| s.pid == pid)
                    .map(|s| (s.time_stamp, s.sm_util))
                    .collect();
                // Our newest sample, not everyone's: another process's newer sample must not
                // hide one of ours that NVML publishes later.
                dev.last_seen = ours.iter().map(|s| s.0).fold(dev.last_seen, u64::max);
                let closes = plant.sm.closes(d);
                let binding = closes != dev.closes;
                dev.closes = closes;
                dev.seen_ours |= !ours.is_empty();
                // Only a pid NVML has never reported is another namespace's; a tick without
                // our samples (NVML publishes them late, or the process idled) is not.
                if !dev.seen_ours && !buf.is_empty() && binding {
                    dev.foreign_ticks += 1;
                    if dev.foreign_ticks == FOREIGN_TICKS && !logged_foreign {
                        logged_foreign = true;
                        log::write(
                            plant.log,
                            Level::Info,
                            format_args!(
                                "NVML reports other processes but never pid {pid} (another pid \
                                 namespace?); the SM share of device {d} stays open-loop"
                            ),
                        );
                    }
                }
                let Some(lp) = dev.lp.as_mut() else { continue };
                let eff = lp.tick(now_ms, &ours, binding);
                plant
                    .sm
                    .set_effective_permille(d, target, (eff * 10.0).round() as u16);
                dev.ticks += 1;
                if dev.ticks % LOG_EVERY == 0 && lp.measured().is_some() {
                    log::write(
                        plant.log,
                        Level::Info,
                        format_args!(
                            "SM feedback device {d}: target {target}%, measured {:.1}%, effective \
                             {eff:.1}%",
                            lp.measured().unwrap_or(0.0)
                        ),
                    );
                }
            }
        });
    }
}
