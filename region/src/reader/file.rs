//! The region file as the reader sees it: [`RegionReader`] (the reading itself is in the parent
//! and `shards`), the [`Geometry`] a header validates to, what can go wrong ([`ReadError`]),
//! and the `pread` primitives every part of a read goes through.

use std::fs::File;
use std::path::PathBuf;

use crate::pread::{self, PreadError};

/// Errors reading a region. Each names what was wrong; none is a panic.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened as a tenant's file may be (a link, not a regular file, ...).
    #[error(transparent)]
    Open(#[from] tenant_fs::TenantFsError),
    /// Opening, sizing or mapping the file failed.
    #[error("{call} on `{path}` failed")]
    Io {
        /// The failing call.
        call: &'static str,
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than the layout requires.
    #[error("file is {len} bytes, the layout needs {needed}")]
    Truncated {
        /// File size.
        len: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The header has not been published as ready (still initialising, or not a region).
    #[error("region is not initialised (state word {state:#x})")]
    NotReady {
        /// The `init_state` word.
        state: u64,
    },
    /// The magic number is wrong.
    #[error("bad magic {found:#x} at offset {offset} (expected {expected:#x})")]
    BadMagic {
        /// Offset of the magic.
        offset: u64,
        /// What the file holds.
        found: u64,
        /// What was expected.
        expected: u64,
    },
    /// The layout's major version is not one this reader understands.
    #[error(
        "unsupported layout version {major}.{minor} (this reader understands major {supported})"
    )]
    UnsupportedVersion {
        /// Major version in the file.
        major: u32,
        /// Minor version in the file.
        minor: u32,
        /// The major this reader understands.
        supported: u32,
    },
    /// A header field holds a value the layout does not allow.
    #[error("header field `{field}` at offset {offset} is {found}, expected {expected}")]
    BadField {
        /// Field name.
        field: &'static str,
        /// Its offset in the file.
        offset: u64,
        /// What the file holds.
        found: u64,
        /// What is allowed.
        expected: String,
    },
}

/// The validated geometry of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Slots.
    pub slot_count: u32,
    /// Devices in use.
    pub device_count: u32,
    /// Bytes of the region.
    pub total_size: u64,
    /// Layout major version (1, 2 or 3: see [`crate::layout::LAYOUT_MAJOR`]).
    pub major: u32,
    /// Layout minor version.
    pub minor: u32,
}

/// A read-only view of a region file (read with `pread`, never mapped).
pub struct RegionReader {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) geometry: Geometry,
}

impl std::fmt::Debug for RegionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionReader")
            .field("path", &self.path)
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl RegionReader {
    pub(super) fn pread_error(&self, e: PreadError) -> ReadError {
        match e {
            PreadError::Short { len, needed } => ReadError::Truncated { len, needed },
            PreadError::Io(source) => ReadError::Io {
                call: "pread",
                path: self.path.clone(),
                source,
            },
        }
    }

    pub(super) fn read_pod<T: crate::layout_types::RegionPod>(
        &self,
        offset: u64,
        dst: &mut T,
    ) -> Result<(), ReadError> {
        pread::read_pod(&self.file, offset, dst).map_err(|e| self.pread_error(e))
    }

    pub(super) fn read_u64(&self, offset: u64) -> Result<u64, ReadError> {
        pread::read_u64(&self.file, offset).map_err(|e| self.pread_error(e))
    }

    pub(super) fn read_words(&self, offset: u64, words: &mut [u64]) -> Result<(), ReadError> {
        pread::read_words(&self.file, offset, words).map_err(|e| self.pread_error(e))
    }
}
