//! Errors of the writer side (`Region`) and of reservations. Reader errors live in `reader`
//! and `hami`.

use std::path::PathBuf;

use crate::reserve::Denied;

/// Errors opening, initialising or using a region as a writer.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// A system call on the region file failed.
    #[error("{call} on region file `{path}` failed")]
    Io {
        /// The failing call (`open`, `fchmod`, `ftruncate`, `mmap`, `fstat`).
        call: &'static str,
        /// The region file.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The configuration asks for something the layout cannot hold.
    #[error("invalid region configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// Another process is initialising the region and neither finished nor could be taken over
    /// in time.
    #[error("region `{path}` stayed in initialisation for {waited_ms} ms (owner pid {owner_pid})")]
    InitTimeout {
        /// The region file.
        path: PathBuf,
        /// Time waited.
        waited_ms: u64,
        /// Pid of the initialiser.
        owner_pid: u32,
    },
    /// The initialised region is not one this code can use (wrong magic, version or geometry).
    #[error("region `{path}` is not usable: {source}")]
    Invalid {
        /// The region file.
        path: PathBuf,
        /// The validation failure.
        #[source]
        source: crate::reader::ReadError,
    },
    /// Every slot is taken by a live process.
    #[error("all {slots} slots of region `{path}` are held by live processes")]
    SlotsFull {
        /// The region file.
        path: PathBuf,
        /// Slots in the region.
        slots: u32,
    },
}

/// Why `try_reserve` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The reservation would pass the device's limit.
    #[error(
        "device {device}: reserving {} bytes would pass the limit ({} of {} bytes reserved)",
        .denied.requested, .denied.reserved, .denied.limit
    )]
    Denied {
        /// The device.
        device: u32,
        /// Limit, reserved and requested bytes.
        denied: Denied,
    },
    /// The device index is not below the region's device count.
    #[error("device {device} does not exist (the region has {devices})")]
    NoSuchDevice {
        /// The device asked for.
        device: u32,
        /// Devices in the region.
        devices: u32,
    },
    /// The slot handle no longer owns its slot (it was retired, or reclaimed as dead).
    #[error("slot {index} is no longer owned by this handle")]
    SlotLost {
        /// Slot index.
        index: u32,
    },
    /// Another thread of this process kept the slot's reservation intent for longer than the
    /// wait bound (about a second: it stalled, or the region was overwritten). Nothing changed.
    #[error("slot {index}: another reservation of this process did not finish in time")]
    SlotBusy {
        /// Slot index.
        index: u32,
    },
}
