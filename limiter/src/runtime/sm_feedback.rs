//! The SM share's feedback thread, `vgpu-sm`: for each limited device whose correction this
//! process runs, it measures the container's share every `SAMPLE_EVERY` and every `TICK` lets the
//! device's correction loop (`limiter_core::sm::feedback::Loop`) move the duty cycle the
//! container's windows use (the window's `duty` word).
//!
//! What it measures with (`VGPU_SM_FEEDBACK`): the GPU time the container's limiters sampled,
//! summed over the region's live slots (`limiter_core::sm::gpu_share`: true under sharing, no
//! lag), and NVML's per-process samples (`nvmlDeviceGetProcessUtilization`, those of the
//! container's processes: they go to whichever context ran once contexts share a GPU, and lag up
//! to 1 s). `auto` takes the GPU time once the container's limiters have sampled any (a span
//! with too few samples, an idle container, then holds the correction), NVML's samples until
//! then; `gpu-time` and `nvml` take only theirs. Each change of source is logged at Info.
//!
//! One thread per process, started when some device is limited and `VGPU_SM_FEEDBACK` is not
//! `off` (again in a forked child: threads do not survive fork). One process of the container runs
//! each device's correction: the holder of the window's lease (`region::sm_share`), renewed every
//! tick; the others' threads only try to take it, which they do once it lapses (its holder
//! exited or was killed), resuming from the duty cycle it left. Without a region the process is
//! its own container (its GPU time is not recorded without a region: NVML only). Without NVML
//! (library, `nvmlInit_v2` or the symbol missing) the thread logs once at Info and goes on with
//! the GPU time alone where it can, else exits: open loop. NVML reports host pids; processes in another pid
//! namespace never find theirs in the samples, and the correction stays off (logged once at
//! Info). The thread never touches the launch path: launches read the duty cycle from the window.

use agent_common::MAX_DEVICES;
use std::sync::atomic::{AtomicI32, Ordering};

use limiter_core::{
    config::SmFeedback,
    sm::{
        Controller, effective_permille,
        feedback::{LOOKBACK_US, Loop, SAMPLE_EVERY, TICK},
        gpu_share::{GpuShare, SlotReading},
    },
};
use region::{
    Region, SmShare,
    sm_share::{decode_duty, duty_word},
};

use crate::platform::{
    clock::Clock,
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

/// Ticks with samples of other processes but none of the container's before that is logged.
const FOREIGN_TICKS: u32 = 10;
/// NVML reads per correction tick.
const READS_PER_TICK: u32 = (TICK.as_millis() / SAMPLE_EVERY.as_millis()) as u32;
/// Log the loop's state at Info every this many ticks.
const LOG_EVERY: u32 = 4;

/// Whether this process runs the thread.
#[derive(Debug)]
pub(crate) struct Feedback {
    /// `VGPU_SM_FEEDBACK`.
    mode: SmFeedback,
    /// The pid whose process runs the thread (0: none): a forked child starts its own.
    started: AtomicI32,
}

/// What the thread works with: all of it lives as long as the process.
#[derive(Clone, Copy)]
pub(crate) struct Plant {
    pub(crate) sm: &'static Controller,
    /// The duty-cycle words of every device (the region's, or this process's own).
    pub(crate) windows: &'static [SmShare; MAX_DEVICES],
    /// The container's region: whose processes' samples count.
    pub(crate) region: Option<&'static Region>,
    pub(crate) driver: &'static Driver,
    pub(crate) log: Level,
    pub(crate) panics: &'static Panics,
    pub(crate) tls: &'static Tls,
    /// Whether the limiter samples GPU time (`VGPU_GPU_TIME_SAMPLE` not `off`).
    pub(crate) gpu_time: bool,
}

impl Feedback {
    pub(crate) fn new(mode: SmFeedback) -> Feedback {
        Feedback {
            mode,
            started: AtomicI32::new(0),
        }
    }

    /// Starts the thread if some device is limited, the loop is enabled and this process has
    /// none.
    pub(crate) fn ensure_started(&self, plant: Plant) {
        if self.mode == SmFeedback::Off || !plant.sm.active() {
            return;
        }
        let pid = os::pid();
        // Relaxed: only elects the one caller that spawns; nothing else is published through it.
        if self.started.swap(pid, Ordering::Relaxed) == pid {
            return;
        }
        let mode = self.mode;
        let spawned = std::thread::Builder::new()
            .name("vgpu-sm".into())
            .spawn(move || {
                plant.panics.shield(|| run(plant, mode));
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

/// Per device: the NVML handle, the loop (while this process holds the lease) and what was seen.
#[derive(Default)]
struct Device {
    handle: Option<Handle>,
    lp: Option<Loop>,
    last_seen: u64,
    closes: u64,
    foreign_ticks: u32,
    /// NVML has reported a process of the container at least once.
    seen_ours: bool,
    ticks: u32,
    /// The container's share from its sampled GPU time.
    gpu: GpuShare,
    /// The source of the last correction (for logging each change).
    source: Option<Source>,
}

/// Where a correction's measured share came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    GpuTime,
    Nvml,
}

impl Source {
    fn describe(self) -> &'static str {
        match self {
            Source::GpuTime => "the GPU time the container's limiters sample",
            Source::Nvml => "NVML's per-process samples",
        }
    }
}

/// The effective share (percent) a loop for `target` starts from, given the window's `duty`
/// word: its correction if it was made for this target, else the same ratio of effective to
/// target applied to the new target, else the target itself.
fn resumed_share(target: u8, duty: Option<(u8, u16)>) -> f64 {
    match duty {
        Some((t, pm)) if t != 0 && t != target && pm != 0 => {
            let ratio = f64::from(pm) / (f64::from(t) * 10.0);
            (f64::from(target) * ratio).clamp(f64::from(target) / 2.0, 100.0)
        }
        _ => f64::from(effective_permille(target, duty)) / 10.0,
    }
}

/// The container's GPU time on `device`: every live slot of the region (the SM feedback's and the
/// QoS allocation's measure of what the container used).
pub(crate) fn container_gpu_time(region: &region::Region, device: usize) -> Vec<SlotReading> {
    region
        .gpu_time(device as u32)
        .into_iter()
        .map(|s| SlotReading {
            slot: s.slot,
            pid: s.pid,
            start_time: s.start_time,
            estimated_ns: s.estimated_ns,
            samples: s.samples,
        })
        .collect()
}

fn run(plant: Plant, mode: SmFeedback) {
    // Anything this thread reaches through a hook passes straight to the driver.
    let _inside = Reentry::enter(plant.tls.words());
    // The GPU time is the region's: without one, or without sampling, there is none.
    let gpu_region = plant
        .region
        .filter(|_| plant.gpu_time && mode != SmFeedback::Nvml);
    let sampler = if mode == SmFeedback::GpuTime {
        None
    } else {
        match Sampler::open(find_real_dlsym().and_then(Nvml::open)) {
            Ok(s) => Some(s),
            Err(e) if gpu_region.is_some() => {
                log::write(
                    plant.log,
                    Level::Info,
                    format_args!("{e}; SM shares are corrected from the sampled GPU time alone"),
                );
                None
            }
            Err(e) => {
                log::write(
                    plant.log,
                    Level::Info,
                    format_args!("{e}; SM shares stay open-loop (no NVML feedback)"),
                );
                return;
            }
        }
    };
    if sampler.is_none() && gpu_region.is_none() {
        log::write(
            plant.log,
            Level::Info,
            format_args!(
                "VGPU_SM_FEEDBACK=gpu-time needs a region and GPU-time sampling \
                 (VGPU_GPU_TIME_SAMPLE not off); SM shares stay open-loop"
            ),
        );
        return;
    }
    let mut devices: Vec<Device> = (0..MAX_DEVICES).map(|_| Device::default()).collect();
    let mut buf = Vec::new();
    let mut logged_foreign = false;
    let mut logged_error = false;
    let start = std::time::Instant::now();
    let mut reads = 0u32;
    loop {
        std::thread::sleep(SAMPLE_EVERY);
        reads = reads.wrapping_add(1);
        // This read also corrects the duty cycle; the others only gather samples.
        let correct = reads.is_multiple_of(READS_PER_TICK);
        let now_ms = start.elapsed().as_millis() as u64;
        let now_ns = start.elapsed().as_nanos() as u64;
        // The lease's clock is every process's: CLOCK_MONOTONIC.
        let lease_ms = Clock::MONOTONIC.now() / 1_000_000;
        // A panic in one tick leaves the loop as it was; the next tick tries again.
        plant.panics.shield(|| {
            let pid = os::pid() as u32;
            let mut container: Option<Vec<u32>> = None;
            // Only the devices this process has: a limit set for every ordinal must not make it
            // correct (and query NVML for, by index: another GPU) ordinals it cannot see.
            let present = (plant.driver.device_count() as usize).min(MAX_DEVICES);
            for (d, dev) in devices.iter_mut().enumerate() {
                // What launches run at now: the user's share, or less under a QoS allocation.
                let target = plant.sm.target(d);
                let share = &plant.windows[d];
                if d >= present || target == 0 || !share.hold_lease(pid, lease_ms) {
                    // Not a device of this process, unlimited, or another process of the
                    // container corrects this device.
                    dev.lp = None;
                    continue;
                }
                if dev
                    .lp
                    .as_ref()
                    .is_none_or(|l| l.target() != f64::from(target))
                {
                    // A lease taken over resumes the correction its previous holder left in the
                    // window; a new target (the user's, or a QoS allocation that moved) starts
                    // from the same correction ratio, which is the contention's and not the
                    // target's.
                    let eff = resumed_share(target, decode_duty(share.duty()));
                    dev.lp = Some(Loop::resume(target, eff));
                    dev.closes = share.closes();
                }
                if let Some(region) = gpu_region {
                    dev.gpu.observe(now_ns, &container_gpu_time(region, d));
                }
                buf.clear();
                // Once the container's limiters have sampled GPU time, the correction measures
                // with it for good: NVML is not asked again (a per-process query takes up to
                // 100 ms on some drivers, 10 times a second).
                let asked = sampler.is_some() && !dev.gpu.sampled();
                if let Some(sampler) = sampler.as_ref().filter(|_| asked) {
                    if dev.handle.is_none() {
                        dev.handle = sampler.handle(plant.driver, d);
                    }
                    if let Some(handle) = dev.handle {
                        let since = dev.last_seen.saturating_sub(LOOKBACK_US);
                        if let Err(e) = sampler.samples(handle, since, &mut buf) {
                            buf.clear();
                            if !logged_error {
                                logged_error = true;
                                log::write(
                                    plant.log,
                                    Level::Info,
                                    format_args!(
                                        "{e}; the SM correction of device {d} holds meanwhile \
                                         where it has no GPU time"
                                    ),
                                );
                            }
                        }
                    }
                }
                let pids = container.get_or_insert_with(|| {
                    let mut pids = plant.region.map_or_else(Vec::new, |r| r.live_pids());
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                    pids
                });
                let ours: Vec<(u32, u64, u32)> = buf
                    .iter()
                    .filter(|s| pids.contains(&s.pid))
                    .map(|s| (s.pid, s.time_stamp, s.sm_util))
                    .collect();
                // The raw samples behind the measured share, for a correction that does not
                // settle on some driver (at most 8 a line: the log line is 512 bytes).
                if asked {
                    log::write(
                        plant.log,
                        Level::Debug,
                        format_args!(
                            "SM feedback device {d}: NVML since {} gave {} sample(s), the \
                             container's (pid, timestamp us, smUtil): {:?}",
                            dev.last_seen.saturating_sub(LOOKBACK_US),
                            buf.len(),
                            &ours[..ours.len().min(8)],
                        ),
                    );
                }
                // The container's newest sample, not everyone's (another process's newer sample
                // must not hide one of ours), less the look-back at the next query.
                dev.last_seen = ours.iter().map(|s| s.1).fold(dev.last_seen, u64::max);
                dev.seen_ours |= !ours.is_empty();
                let Some(lp) = dev.lp.as_mut() else { continue };
                if !correct {
                    lp.observe(&ours);
                    continue;
                }
                let closes = share.closes();
                let binding = closes != dev.closes;
                dev.closes = closes;
                let gpu_share = dev.gpu.share();
                // Only pids NVML has never reported are another namespace's; a tick without our
                // samples (NVML publishes them late, or the container idled) is not. It matters
                // only while there is no GPU time to measure with.
                if !dev.seen_ours && !buf.is_empty() && binding && !dev.gpu.sampled() {
                    dev.foreign_ticks += 1;
                    if dev.foreign_ticks == FOREIGN_TICKS && !logged_foreign {
                        logged_foreign = true;
                        log::write(
                            plant.log,
                            Level::Info,
                            format_args!(
                                "NVML reports other processes but never the container's pids \
                                 {pids:?} (another pid namespace?); the SM share of device {d} \
                                 stays open-loop while it has no sampled GPU time"
                            ),
                        );
                    }
                }
                let (eff, source) = if dev.gpu.sampled() {
                    lp.observe(&ours);
                    (
                        lp.tick_measured(now_ms, gpu_share, binding),
                        gpu_share.map(|_| Source::GpuTime),
                    )
                } else if sampler.is_some() {
                    let eff = lp.tick(now_ms, &ours, binding);
                    (eff, lp.measured().map(|_| Source::Nvml))
                } else {
                    (lp.tick_measured(now_ms, None, binding), None)
                };
                if source.is_some() && source != dev.source {
                    dev.source = source;
                    if let Some(src) = source {
                        log::write(
                            plant.log,
                            Level::Info,
                            format_args!(
                                "SM feedback device {d}: the container's share is measured from \
                                 {}",
                                src.describe()
                            ),
                        );
                    }
                }
                let word = duty_word(target, (eff * 10.0).round() as u16);
                let seen = share.duty();
                if seen != word {
                    // From the word just read: a concurrent write (a holder that has not yet
                    // noticed it lost the lease) is not overwritten; the next tick writes again.
                    share.set_duty(seen, word);
                }
                dev.ticks += 1;
                if dev.ticks % LOG_EVERY == 0 && lp.measured().is_some() {
                    log::write(
                        plant.log,
                        Level::Info,
                        format_args!(
                            "SM feedback device {d}: target {target}%, measured {:.1}% by {} ({} \
                             process{} of the container), effective {eff:.1}%",
                            lp.measured().unwrap_or(0.0),
                            match dev.source {
                                Some(Source::GpuTime) => "GPU time",
                                _ => "NVML",
                            },
                            pids.len(),
                            if pids.len() == 1 { "" } else { "es" },
                        ),
                    );
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::resumed_share;

    #[test]
    fn a_new_target_keeps_the_correction_ratio() {
        assert_eq!(resumed_share(30, None), 30.0);
        assert_eq!(
            resumed_share(30, Some((30, 780))),
            78.0,
            "its own correction"
        );
        // 30% needed 60% of duty (x2): 40% starts at 80%.
        assert_eq!(resumed_share(40, Some((30, 600))), 80.0);
        // Bounded as the loop bounds it.
        assert_eq!(resumed_share(80, Some((30, 900))), 100.0);
        assert_eq!(resumed_share(60, Some((30, 50))), 30.0);
    }
}
