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

use agent_common::MAX_DEVICES;
use std::sync::atomic::{AtomicU64, Ordering};

use limiter_core::{config::Config, sm::Controller};
use region::{ControlError, ControlReader, ControlSettings, Region, control_path};

use super::qos::Qos;
use crate::platform::log::{self, Level};

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
                log::write(
                    config.log_level,
                    Level::Info,
                    format_args!(
                        "control block generation {}: SM {:?}, memory {:?}, QoS tier {}",
                        snap.generation,
                        &snap.settings.sm_percent[..4],
                        &snap.settings.memory_limit[..4],
                        qos.tier().map_or("none", |t| t.name()),
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
