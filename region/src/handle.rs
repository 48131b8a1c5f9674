//! The writer's handle of a mapped region. What it does is written where it belongs: creation
//! and joining in `init`, reservations in `region`, slots in `slots`, records in `stats`.

use std::fs::File;
use std::path::PathBuf;

use crate::mapping::Mapping;

/// A region mapped read-write by a writer (limiter) process. What every reservation and record
/// reads comes first (`repr(C)`): the mapping and the counts, in one cache line.
#[repr(C)]
pub struct Region {
    pub(crate) map: Mapping,
    pub(crate) slot_count: u32,
    pub(crate) device_count: u32,
    pub(crate) path: PathBuf,
    /// Kept open so the file can be grown if another process shrank it.
    pub(crate) _file: File,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("slots", &self.slot_count)
            .field("devices", &self.device_count)
            .finish()
    }
}
