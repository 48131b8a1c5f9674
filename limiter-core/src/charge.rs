//! What an allocation is charged (design principle 6, "a limit means what nvidia-smi shows"):
//!
//! - each allocation's size rounded up to the driver's granularity, [`charged_size`]: 2 MiB
//!   multiples from 2 MiB on, 512-byte multiples below (the driver packs small allocations into
//!   shared 2 MiB pages, so rounding those to 2 MiB would over-charge many small buffers);
//! - a pitched allocation is reserved as [`pitch_estimate`] before the driver chooses the pitch,
//!   then corrected to `pitch * height`;
//! - once per process and device, before its first allocation there, the context's memory
//!   ([`ContextCharges`]: `VGPU_CONTEXT_BYTES`), held until the process exits;
//! - stream-ordered pools: their reserved size, not their live allocations ([`crate::pools`]).

use agent_common::MAX_DEVICES;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::accounting::{Accounting, Denied};

/// The driver's allocation granularity for sizes from 2 MiB on.
pub(crate) const GRANULE: u64 = 2 << 20;
/// Alignment of smaller allocations.
pub(crate) const SMALL_ALIGN: u64 = 512;
/// Pitch alignment assumed when reserving for `cuMemAllocPitch_v2` before the driver chooses the
/// pitch: the reservation is then corrected to `pitch * height`.
pub(crate) const PITCH_ALIGN: u64 = 512;

/// What a live allocation charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub device: usize,
    pub bytes: u64,
    /// The stream-ordered pool the allocation came from (0: none). Pool allocations are charged
    /// through their pool's reserved size ([`crate::pools`]), not per allocation: `bytes` is then
    /// only recorded as a statistic.
    pub pool: u64,
}

/// What an allocation of `bytes` is charged: see the module documentation.
#[inline]
pub fn charged_size(bytes: u64) -> u64 {
    let align = if bytes >= GRANULE {
        GRANULE
    } else {
        SMALL_ALIGN
    };
    bytes.div_ceil(align).saturating_mul(align)
}

/// What a pitched allocation of `height` rows of `width` bytes is reserved before the driver
/// chooses its pitch.
pub fn pitch_estimate(width: u64, height: u64) -> u64 {
    charged_size(
        width
            .div_ceil(PITCH_ALIGN)
            .saturating_mul(PITCH_ALIGN)
            .saturating_mul(height),
    )
}

/// What a pitched allocation is charged once the driver chose `pitch`.
pub fn pitched_size(pitch: u64, height: u64) -> u64 {
    charged_size(pitch.saturating_mul(height))
}

/// Context charge states per device.
const NONE: u8 = 0;
const CHARGING: u8 = 1;
const CHARGED: u8 = 2;

/// A process's context charges: `bytes` per device, reserved once, before its first allocation
/// there, and held until the process exits (a context created without any allocation is not
/// charged). Denied if the context itself does not fit; the allocation is then refused too.
#[derive(Debug)]
pub struct ContextCharges {
    state: [AtomicU8; MAX_DEVICES],
    bytes: u64,
}

impl ContextCharges {
    /// No device charged yet; `bytes` per device from the first allocation there.
    pub fn new(bytes: u64) -> ContextCharges {
        ContextCharges {
            state: std::array::from_fn(|_| AtomicU8::new(NONE)),
            bytes,
        }
    }

    /// What a context is charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `device`'s context is charged.
    pub fn charged(&self, device: usize) -> bool {
        // Acquire: pairs with the Release store of CHARGED in `charge`.
        self.state
            .get(device)
            .is_some_and(|s| s.load(Ordering::Acquire) == CHARGED)
    }

    /// Charges `device`'s context in `ledger` unless it is charged already; `charged(bytes)` runs
    /// once, in the thread that charged it. Devices beyond the table are never charged.
    #[inline(always)]
    pub fn ensure(
        &self,
        device: usize,
        ledger: &impl Accounting,
        charged: impl FnOnce(u64),
    ) -> Result<(), Denied> {
        match self.state.get(device) {
            // Acquire: pairs with the Release store of CHARGED in `charge`.
            Some(s) if s.load(Ordering::Acquire) != CHARGED => {
                self.charge(device, s, ledger, charged)
            }
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn charge(
        &self,
        device: usize,
        state: &AtomicU8,
        ledger: &impl Accounting,
        charged: impl FnOnce(u64),
    ) -> Result<(), Denied> {
        loop {
            // Acquire: pairs with the Release store of CHARGED, after which the charge is held.
            match state.load(Ordering::Acquire) {
                CHARGED => return Ok(()),
                CHARGING => std::thread::yield_now(),
                _ => {
                    // Acquire/Relaxed: the winner alone reserves; losers wait for its outcome.
                    if state
                        .compare_exchange(NONE, CHARGING, Ordering::Acquire, Ordering::Relaxed)
                        .is_err()
                    {
                        continue;
                    }
                    let r = ledger.try_reserve(device, self.bytes);
                    // Release: pairs with the Acquire loads above and in `ensure`.
                    state.store(if r.is_ok() { CHARGED } else { NONE }, Ordering::Release);
                    if r.is_ok() {
                        charged(self.bytes);
                    }
                    return r;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Barrier,
        atomic::{AtomicU32, Ordering::Relaxed},
    };

    use super::*;
    use crate::{accounting::InProcess, config::Config};

    #[test]
    fn sizes_round_to_the_drivers_granularity() {
        assert_eq!(charged_size(0), 0);
        assert_eq!(charged_size(1), 512);
        assert_eq!(charged_size(512), 512);
        assert_eq!(charged_size(513), 1024);
        assert_eq!(charged_size(GRANULE - 1), GRANULE);
        assert_eq!(charged_size(GRANULE), GRANULE);
        assert_eq!(charged_size(GRANULE + 1), 2 * GRANULE);
        assert_eq!(charged_size(u64::MAX), u64::MAX);
        // 100 rows of 1000 bytes: 1024-byte rows estimated, 102,400 -> 102,400 (512-aligned).
        assert_eq!(pitch_estimate(1000, 100), 102_400);
        assert_eq!(pitched_size(1536, 100), 153_600);
        assert_eq!(pitch_estimate(u64::MAX, u64::MAX), charged_size(u64::MAX));
    }

    fn ledger(limit: u64) -> InProcess {
        let mut c = Config::default();
        c.memory_limit[0] = Some(limit);
        InProcess::new(&c)
    }

    #[test]
    fn a_context_is_charged_once_per_device_and_a_denial_charges_nothing() {
        let l = ledger(100);
        let contexts = ContextCharges::new(60);
        let mut seen = Vec::new();
        assert_eq!(contexts.ensure(0, &l, |b| seen.push(b)), Ok(()));
        assert_eq!(contexts.ensure(0, &l, |b| seen.push(b)), Ok(()));
        assert_eq!(seen, [60]);
        assert!(contexts.charged(0));
        assert_eq!(l.used(0), 60);
        // A second process's ledger would now deny; here a smaller limit denies the context.
        let small = ledger(50);
        let other = ContextCharges::new(60);
        assert!(other.ensure(0, &small, |_| panic!("denied")).is_err());
        assert!(!other.charged(0));
        assert_eq!(small.used(0), 0);
        // Devices outside the table are never charged.
        assert_eq!(
            contexts.ensure(MAX_DEVICES, &l, |_| panic!("outside")),
            Ok(())
        );
    }

    #[test]
    fn racing_threads_charge_a_context_once() {
        let l = ledger(1 << 40);
        let contexts = ContextCharges::new(7);
        let charged = AtomicU32::new(0);
        let start = Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    start.wait();
                    contexts
                        .ensure(3, &l, |_| {
                            charged.fetch_add(1, Relaxed);
                        })
                        .unwrap();
                });
            }
        });
        assert_eq!(charged.load(Relaxed), 1);
        assert_eq!(l.used(3), 7);
    }
}
