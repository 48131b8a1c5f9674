//! The shared-memory accounting region: the protocol between the limiter (writer, in every GPU
//! process of a container) and the agent (reader). See `docs/region.md` for the layout, the
//! protocols and their crash windows.
//!
//! - Writers: [`Region::open_or_create`] (CAS initialisation, no file locks),
//!   [`Region::claim_slot`], [`Region::try_reserve`] / [`Region::release`] (exact limits),
//!   [`Region::shard_writer`] (lock-free per-thread statistics), [`Region::sm_shares`] (the
//!   container's SM duty cycle per device, [`sm_share`]).
//! - Readers: [`reader::RegionReader`] (read-only, validates everything) and
//!   [`hami::HamiReader`] (HAMi-core's v1 cache file).
//!
//! Model checking: `RUSTFLAGS="--cfg loom" cargo test -p region --release --lib loom`.

pub mod control;
mod control_file;
mod error;
pub mod hami;
mod holdings;
mod init;
pub mod layout;
mod layout_types;
pub mod layout_v2;
mod mapping;
mod pread;
pub mod prefetch;
pub mod procfs;
pub mod reader;
mod region;
mod reserve;
pub mod seqlock;
mod sigbus;
mod slots;
pub mod sm_share;
mod stats;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;

pub use control::{ControlError, ControlSettings, ControlSnapshot, control_path};
pub use control_file::{ControlReader, ControlWriter, read_control};
pub use error::{RegionError, ReserveError};
pub use holdings::Holding;
pub use init::{INIT_STALL_MS, INIT_WAIT_LIMIT, REGION_MODE};
pub use layout::{DEFAULT_SLOTS, MAX_SLOTS, SmShare};
pub use region::{ConfigMismatch, InitOutcome, Region, RegionConfig, Reserver, SWEEP_INTERVAL_MS};
pub use reserve::{Denied, MAX_RESERVABLE};
pub use slots::{RECLAIM_STALL_MS, ReclaimReport, Slot};
pub use stats::{Call, ShardWriter};
