//! Run-time limit changes: the limiter's side of the control block (`region::control`).
//!
//! At initialisation the limiter maps `<region>.ctl` read-only (creating it zero-filled if absent)
//! and applies what it holds. Afterwards every launch, and every other hooked call at most once
//! per `state::CONTROL_POLL_PERIOD_NS` (10 ms) per process, compares the mapped generation word
//! with the last one applied (a relaxed load and a compare: no clock, no write); a new generation
//! is read under the block's seqlock, validated, and applied once by the thread that notices it
//! first: SM shares to the process's controller (the container's windows follow the new share at
//! every process's next launch), memory limits into the region's
//! `DeviceState.memory_limit` (the limiter, not the agent, writes the region). A value the block
//! does not override keeps the environment's.
//!
//! A generation that marks the container freezing or frozen (`vgpu-agent freeze --container`)
//! is answered before the call that noticed it reaches the driver: the limiter stores that
//! generation as the region's thaw request and waits, sleeping, until the block no longer marks
//! it (the agent, seeing the request of a frozen container, thaws it and then clears the mark),
//! at most [`THAW_WAIT`] in all; a new generation that still marks it is requested in turn. The
//! driver blocks a frozen process's CUDA calls until it is unlocked, so waiting here, where the
//! agent sees the request, is what keeps a call from waiting for a thaw nobody asked for; past
//! the bound the call goes on into the driver, which holds it until a thaw as it would without
//! the limiter (the limiter itself never waits without a bound).

use agent_common::MAX_DEVICES;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use limiter_core::{config::Config, sm::Controller};
use region::{ControlError, ControlReader, ControlSettings, FreezeMark, Region, control_path};

use super::qos::Qos;
use crate::platform::log::{self, Level};

/// The longest a call that found its container frozen waits for the agent's thaw before it goes
/// on into the driver (which then holds it until the thaw, as it does without the limiter).
pub(crate) const THAW_WAIT: Duration = Duration::from_secs(10);
/// How often a call waiting for the thaw looks at the control block.
const THAW_POLL: Duration = Duration::from_millis(1);

/// The mapped control block and the generation last applied.
#[derive(Debug)]
pub(crate) struct Control {
    reader: ControlReader,
    applied: AtomicU64,
}

impl Control {
    /// Maps the control block beside `region`; `None` (logged at `log`) if it cannot be mapped,
    /// in which case limits stay as configured at start.
    pub(crate) fn open(region: &Region, log: Level) -> Option<Control> {
        let path = control_path(region.path());
        match ControlReader::open_or_create(&path) {
            Ok(reader) => Some(Control {
                reader,
                applied: AtomicU64::new(0),
            }),
            Err(e) => {
                log::write(
                    log,
                    Level::Warn,
                    format_args!("{e}; run-time limit changes will not reach this process"),
                );
                None
            }
        }
    }

    /// Applies a new generation if there is one, to the SM controller `sm` and the `region`;
    /// returns whether it did. `sm_base` is the SM share of each device without an override (the
    /// region's, else the environment's). The cost when there is none: two relaxed loads and a
    /// compare.
    #[inline(always)]
    pub(crate) fn poll(
        &self,
        config: &Config,
        sm_base: &[Option<u8>; MAX_DEVICES],
        region: Option<&Region>,
        sm: &Controller,
        qos: &Qos,
    ) -> bool {
        // Relaxed: a change noticed one call later is fine; `apply` reads the block under its
        // seqlock (Acquire) before using any field.
        let generation = self.reader.generation_word().load(Ordering::Relaxed);
        generation != self.applied.load(Ordering::Relaxed)
            && self.apply(generation, config, sm_base, region, sm, qos)
    }

    #[cold]
    #[inline(never)]
    fn apply(
        &self,
        generation: u64,
        config: &Config,
        sm_base: &[Option<u8>; MAX_DEVICES],
        region: Option<&Region>,
        sm: &Controller,
        qos: &Qos,
    ) -> bool {
        let seen = self.applied.load(Ordering::Relaxed);
        // Relaxed: the CAS only elects one applier per generation; the data comes from the
        // seqlocked read below.
        if seen == generation
            || self
                .applied
                .compare_exchange(seen, generation, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        match self.reader.snapshot() {
            Ok(Some(snap)) => {
                apply_settings(&snap.settings, config.sm_period_ms, sm_base, region, sm);
                qos.set_override(snap.settings.qos);
                // With the in-process path on, the process freezes itself at that mark (its
                // watcher) and the gate holds the calls: nothing to wait for here.
                let own = snap.settings.freeze == FreezeMark::InProcess && config.freeze_in_process;
                if snap.settings.freeze != FreezeMark::Running && !own {
                    self.wait_for_thaw(generation, region, config.log_level);
                }
                log::write(
                    config.log_level,
                    Level::Info,
                    format_args!(
                        "control block generation {}: SM {:?}, memory {:?}, QoS tier {}, frozen {}",
                        snap.generation,
                        &snap.settings.sm_percent[..4],
                        &snap.settings.memory_limit[..4],
                        qos.tier().map_or("none", |t| t.name()),
                        snap.settings.freeze != FreezeMark::Running,
                    ),
                );
                true
            }
            Ok(None) => false,
            // A write in progress: try again at a later call.
            Err(ControlError::Busy { .. }) => {
                self.applied.store(seen, Ordering::Relaxed);
                false
            }
            Err(e) => {
                log::write(
                    config.log_level,
                    Level::Warn,
                    format_args!(
                        "{}: {e}; keeping the current limits",
                        self.reader.path().display()
                    ),
                );
                false
            }
        }
    }
}

impl Control {
    /// The freeze mark and its generation, if the generation differs from `*seen` (which then
    /// becomes it); `None` without a change, or while a write is in progress (looked at again
    /// next time).
    pub(crate) fn freeze_mark_since(&self, seen: &mut u64) -> Option<(u64, FreezeMark)> {
        // Relaxed: compared only; the mark is read under the block's seqlock (Acquire).
        let generation = self.reader.generation_word().load(Ordering::Relaxed);
        if generation == *seen {
            return None;
        }
        match self.reader.snapshot() {
            Ok(Some(snap)) => {
                *seen = snap.generation;
                Some((snap.generation, snap.settings.freeze))
            }
            Ok(None) => {
                *seen = generation;
                None
            }
            Err(_) => None,
        }
    }

    /// Asks the agent to thaw the container (the region's thaw request: the generation that
    /// marks it) and waits until the control block no longer marks it, at most [`THAW_WAIT`].
    /// Without a region nobody can be asked: the call goes on at once.
    #[cold]
    #[inline(never)]
    fn wait_for_thaw(&self, marked: u64, region: Option<&Region>, log_level: Level) {
        let Some(region) = region else { return };
        let started = Instant::now();
        let mut current = marked;
        region.request_thaw(current);
        loop {
            // Relaxed: the generation is only compared; a new one is read under the block's
            // seqlock (Acquire) before its mark is used.
            let now = self.reader.generation_word().load(Ordering::Relaxed);
            if now != current {
                match self.reader.snapshot() {
                    Ok(Some(snap)) if snap.settings.freeze != FreezeMark::Running => {
                        current = snap.generation;
                        region.request_thaw(current);
                    }
                    // A write in progress: look again after the sleep.
                    Err(ControlError::Busy { .. }) => {}
                    _ => break,
                }
            }
            if started.elapsed() >= THAW_WAIT {
                log::write(
                    log_level,
                    Level::Warn,
                    format_args!(
                        "the container is frozen and no agent thawed it within {} s; the call goes on into the driver, which holds it until a thaw",
                        THAW_WAIT.as_secs()
                    ),
                );
                return;
            }
            std::thread::sleep(THAW_POLL);
        }
        log::write(
            log_level,
            Level::Info,
            format_args!("thawed after {} ms", started.elapsed().as_millis()),
        );
    }
}

/// Applies overrides on top of the SM shares `sm_base` and the region's memory limits.
fn apply_settings(
    settings: &ControlSettings,
    sm_period_ms: u64,
    sm_base: &[Option<u8>; MAX_DEVICES],
    region: Option<&Region>,
    sm: &Controller,
) {
    let shares: [Option<u8>; MAX_DEVICES] =
        std::array::from_fn(|d| settings.sm_percent[d].or(sm_base[d]));
    sm.set_limits(&shares, sm_period_ms);
    let Some(region) = region else { return };
    for d in 0..MAX_DEVICES {
        if let Some(p) = settings.sm_percent[d] {
            region.set_sm_limit(d as u32, p);
        }
        if let Some(bytes) = settings.memory_limit[d] {
            region.set_memory_limit(d as u32, bytes);
        }
    }
}
