//! What a region is created with ([`RegionConfig`]), and how opening it went ([`InitOutcome`]).

use agent_common::MAX_DEVICES;

use crate::error::RegionError;
use crate::layout::MAX_SLOTS;
use crate::reserve::MAX_RESERVABLE;

/// What the first initialiser writes into a region. Later processes whose configuration differs
/// get [`InitOutcome::ConfigMismatch`]: the first initialiser wins (as in HAMi-core).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionConfig {
    /// Devices in use, `1..=MAX_DEVICES`.
    pub devices: u32,
    /// Memory limit per device in bytes; 0 = unlimited (up to [`MAX_RESERVABLE`]); at most
    /// [`MAX_RESERVABLE`].
    pub memory_limit: [u64; MAX_DEVICES],
    /// SM limit per device in percent; 0 or 100 = unlimited.
    pub sm_limit: [u8; MAX_DEVICES],
    /// Process slots, `1..=MAX_SLOTS` (see [`crate::layout::DEFAULT_SLOTS`]).
    pub slots: u32,
}

impl RegionConfig {
    /// `devices` devices, no limits, the default slot count.
    pub fn unlimited(devices: u32) -> RegionConfig {
        RegionConfig {
            devices,
            memory_limit: [0; MAX_DEVICES],
            sm_limit: [0; MAX_DEVICES],
            slots: crate::layout::DEFAULT_SLOTS,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), RegionError> {
        let reason = if self.devices == 0 || self.devices as usize > MAX_DEVICES {
            format!("devices = {} (must be 1..={MAX_DEVICES})", self.devices)
        } else if self.slots == 0 || self.slots > MAX_SLOTS {
            format!("slots = {} (must be 1..={MAX_SLOTS})", self.slots)
        } else if let Some(d) = self.sm_limit.iter().position(|&p| p > 100) {
            format!("sm_limit[{d}] = {}% (must be 0..=100)", self.sm_limit[d])
        } else if let Some(d) = self.memory_limit.iter().position(|&l| l > MAX_RESERVABLE) {
            format!(
                "memory_limit[{d}] = {} bytes (must be at most {MAX_RESERVABLE}, 2^48 - 1)",
                self.memory_limit[d]
            )
        } else {
            return Ok(());
        };
        Err(RegionError::InvalidConfig { reason })
    }

    /// Equal as far as enforcement goes (0 and 100 % are both "no SM limit"; unused devices are
    /// ignored).
    pub(crate) fn same_effect(&self, other: &RegionConfig) -> bool {
        let n = self.devices as usize;
        let sm = |p: u8| if p == 0 { 100 } else { p };
        self.devices == other.devices
            && self.slots == other.slots
            && self.memory_limit[..n] == other.memory_limit[..n]
            && self.sm_limit[..n]
                .iter()
                .map(|&p| sm(p))
                .eq(other.sm_limit[..n].iter().map(|&p| sm(p)))
    }
}

/// The configuration this process asked for differs from the one the region was initialised
/// with; the region's (`effective`) applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMismatch {
    /// What this process asked for.
    pub requested: RegionConfig,
    /// What the region holds (the first initialiser's configuration).
    pub effective: RegionConfig,
}

/// How [`Region::open_or_create`](crate::Region::open_or_create) obtained a usable region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitOutcome {
    /// This process initialised the region.
    Created,
    /// The region was already initialised (or another process initialised it meanwhile) with
    /// this configuration.
    Joined,
    /// This process took over from an initialiser that died or stalled, and initialised it.
    TookOver {
        /// Pid of the initialiser that was taken over.
        stale_pid: u32,
    },
    /// Joined, but the region's configuration differs from the requested one.
    ConfigMismatch(Box<ConfigMismatch>),
}
