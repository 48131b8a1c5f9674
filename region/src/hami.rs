//! A read-only reader for HAMi-core's own shared region (`shared_region_t`, layout v1, magic
//! 19920718), so the agent can show containers that still run HAMi-core's `libvgpu.so`.
//!
//! Offsets are those of HAMi-core `8f3a89c` on x86_64 (`sizeof(shared_region_t) == 2008952`,
//! see `shared/research/hami-core.md` §2.2). The same rules as [`crate::reader`] apply: the file
//! is opened read-only and read with `pread(2)` into private buffers (never mapped, so a file
//! truncated meanwhile is a typed [`HamiError::Truncated`], never a `SIGBUS`), every count from
//! the file is clamped, and every failure is a typed error.

use std::path::{Path, PathBuf};

use crate::pread::{self, PreadError};
use agent_common::MAX_DEVICES;
use tenant_fs::{Access, TenantFile};

/// `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`.
pub const HAMI_MAGIC: i32 = 19_920_718;
/// `sizeof(shared_region_t)` of layout 1.2 on x86_64.
pub const HAMI_V1_SIZE: u64 = 2_008_952;
/// `SHARED_REGION_MAX_PROCESS_NUM`.
pub const HAMI_MAX_PROCS: usize = 1024;

const OFF_MAJOR: usize = 4;
const OFF_MINOR: usize = 8;
const OFF_DEVICE_NUM: usize = 56;
const OFF_UUIDS: usize = 64;
const UUID_LEN: usize = 96;
const OFF_LIMIT: usize = 1600;
const OFF_SM_LIMIT: usize = 1728;
const OFF_PROCS: usize = 1856;
const PROC_SIZE: usize = 1960;
const OFF_PROC_NUM: usize = 2_008_896;
const OFF_UTIL_SWITCH: usize = 2_008_900;
const OFF_RECENT_KERNEL: usize = 2_008_904;
const OFF_PRIORITY: usize = 2_008_908;
const OFF_LAST_KERNEL_TIME: usize = 2_008_912;
// Within a `shrreg_proc_slot_t`.
const SLOT_PID: usize = 0;
const SLOT_HOSTPID: usize = 4;
const SLOT_USED: usize = 8;
const DEVICE_MEMORY_SIZE: usize = 64;
const SLOT_MONITORUSED: usize = 1032;
const SLOT_DEVICE_UTIL: usize = 1160;
const DEVICE_UTIL_SIZE: usize = 48;
const SLOT_STATUS: usize = 1928;
const SLOT_SEQLOCK: usize = 1936;

const _: () = assert!(OFF_PROCS + HAMI_MAX_PROCS * PROC_SIZE == OFF_PROC_NUM);
const _: () = assert!(OFF_LAST_KERNEL_TIME + 8 + 32 == HAMI_V1_SIZE as usize);
const _: () = assert!(SLOT_USED + MAX_DEVICES * DEVICE_MEMORY_SIZE == SLOT_MONITORUSED);
const _: () = assert!(SLOT_DEVICE_UTIL + MAX_DEVICES * DEVICE_UTIL_SIZE == SLOT_STATUS);

/// Errors reading a HAMi-core region.
#[derive(Debug, thiserror::Error)]
pub enum HamiError {
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
    /// The file is shorter than the v1 layout.
    #[error("file is {len} bytes, HAMi-core v1 needs {needed}")]
    Truncated {
        /// File size.
        len: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// `initialized_flag` is not the magic (not initialised, or not a HAMi-core file).
    #[error("initialized_flag at offset 0 is {found} (expected {HAMI_MAGIC})")]
    NotInitialised {
        /// What the file holds.
        found: i32,
    },
    /// A major version other than 1.
    #[error("unsupported HAMi-core layout {major}.{minor} (this reader understands major 1)")]
    UnsupportedVersion {
        /// Major version in the file.
        major: u32,
        /// Minor version in the file.
        minor: u32,
    },
}

/// One HAMi-core process slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HamiProcess {
    /// Index in `procs[]`.
    pub slot: usize,
    /// Container pid.
    pub pid: i32,
    /// Host pid (0 until HAMi-core's detection succeeded).
    pub hostpid: i32,
    /// 1 running, 2 suspended.
    pub status: i32,
    /// `used[d].total` per device.
    pub used_total: Vec<u64>,
    /// `used[d].context_size` per device.
    pub context_size: Vec<u64>,
    /// `used[d].module_size` per device.
    pub module_size: Vec<u64>,
    /// `used[d].data_size` per device.
    pub data_size: Vec<u64>,
    /// NVML-observed usage per device (`monitorused`).
    pub monitor_used: Vec<u64>,
    /// SM utilisation per device (`device_util[d].sm_util`).
    pub sm_util: Vec<u64>,
    /// Whether the slot's seqlock gave a consistent read (false: stayed odd or kept changing).
    pub consistent: bool,
}

/// A view of a HAMi-core region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HamiSnapshot {
    /// `major_version`.
    pub major: u32,
    /// `minor_version`.
    pub minor: u32,
    /// `device_num`, clamped to 16.
    pub device_count: usize,
    /// Device UUIDs (lossy, NUL-trimmed).
    pub uuids: Vec<String>,
    /// Memory limit per device, bytes (0 = unlimited).
    pub limit: Vec<u64>,
    /// SM limit per device, percent.
    pub sm_limit: Vec<u64>,
    /// `proc_num` as stored (may be out of range in a corrupted file).
    pub proc_num_raw: i32,
    /// Occupied slots.
    pub processes: Vec<HamiProcess>,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `priority`.
    pub priority: i32,
    /// `last_kernel_time`, epoch seconds.
    pub last_kernel_time: u64,
}

/// A read-only reader for a HAMi-core v1 cache file (read with `pread`, never mapped).
pub struct HamiReader {
    file: std::fs::File,
    path: PathBuf,
}

impl std::fmt::Debug for HamiReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HamiReader")
            .field("path", &self.path)
            .finish()
    }
}

/// Process slots copied per `pread` while scanning for occupied ones (about 61 KiB).
const SCAN_SLOTS: usize = 32;
/// The bytes before `procs[]`: flag, versions, device count, UUIDs, limits.
const HEAD_LEN: usize = OFF_PROCS;
/// The bytes after `procs[]`: `proc_num` to the end of the struct.
const TAIL_LEN: usize = HAMI_V1_SIZE as usize - OFF_PROC_NUM;

/// The `i32` at `offset` of a private copy (0 past its end).
fn i32_at(bytes: &[u8], offset: usize) -> i32 {
    bytes
        .get(offset..offset.saturating_add(4))
        .map_or(0, |b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// The `u64` at `offset` of a private copy (0 past its end).
fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    bytes
        .get(offset..offset.saturating_add(8))
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// `count` values at `base`, `base + stride`, ... of a private copy.
fn per_device(bytes: &[u8], count: usize, base: usize, stride: usize) -> Vec<u64> {
    (0..count)
        .map(|d| u64_at(bytes, base + d * stride))
        .collect()
}

impl HamiReader {
    /// Opens and validates a HAMi-core cache file read-only, by a path the operator gave
    /// ([`tenant_fs::open_no_links`]).
    pub fn open(path: &Path) -> Result<HamiReader, HamiError> {
        HamiReader::from_file(tenant_fs::open_no_links(path, Access::Read)?)
    }

    /// Validates a HAMi-core cache file opened through [`tenant_fs`] (read-only).
    pub fn from_file(file: TenantFile) -> Result<HamiReader, HamiError> {
        let path = file.path().to_path_buf();
        let len = file.current_len()?;
        let file = file.into_file();
        if len < HAMI_V1_SIZE {
            return Err(HamiError::Truncated {
                len,
                needed: HAMI_V1_SIZE,
            });
        }
        let reader = HamiReader { file, path };
        let mut head = [0u8; 12];
        reader.read_bytes(0, &mut head)?;
        validate(&head)?;
        Ok(reader)
    }

    fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<(), HamiError> {
        pread::read_bytes(&self.file, offset as u64, buf).map_err(|e| match e {
            PreadError::Short { len, needed } => HamiError::Truncated { len, needed },
            PreadError::Io(source) => HamiError::Io {
                call: "pread",
                path: self.path.clone(),
                source,
            },
        })
    }

    /// Reads the region.
    pub fn snapshot(&self) -> Result<HamiSnapshot, HamiError> {
        let len = self
            .file
            .metadata()
            .map_err(|source| HamiError::Io {
                call: "fstat",
                path: self.path.clone(),
                source,
            })?
            .len();
        if len < HAMI_V1_SIZE {
            return Err(HamiError::Truncated {
                len,
                needed: HAMI_V1_SIZE,
            });
        }
        let mut head = vec![0u8; HEAD_LEN];
        self.read_bytes(0, &mut head)?;
        let (major, minor) = validate(&head)?;
        let device_count = (u64_at(&head, OFF_DEVICE_NUM) as usize).min(MAX_DEVICES);
        let uuids = (0..device_count)
            .map(|d| {
                let start = OFF_UUIDS + d * UUID_LEN;
                let bytes = &head[start..start + UUID_LEN];
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..end]).into_owned()
            })
            .collect();
        let mut tail = [0u8; TAIL_LEN];
        self.read_bytes(OFF_PROC_NUM, &mut tail)?;
        let at_tail = |offset: usize| offset - OFF_PROC_NUM;
        // Never index by proc_num: slots past it can be live after HAMi-core's compaction bugs
        // (#191), and a corrupted value could be anything. Scan the whole fixed array instead,
        // a chunk of slots per pread; occupied slots have pid != 0 and status != 0 and are then
        // read again, alone, under their seqlock.
        let mut processes = Vec::new();
        let mut chunk = vec![0u8; SCAN_SLOTS * PROC_SIZE];
        let mut slot_copy = vec![0u8; PROC_SIZE];
        for first in (0..HAMI_MAX_PROCS).step_by(SCAN_SLOTS) {
            self.read_bytes(OFF_PROCS + first * PROC_SIZE, &mut chunk)?;
            for (k, bytes) in chunk.as_chunks::<PROC_SIZE>().0.iter().enumerate() {
                if i32_at(bytes, SLOT_PID) == 0 || i32_at(bytes, SLOT_STATUS) == 0 {
                    continue;
                }
                if let Some(p) = self.read_proc(first + k, device_count, &mut slot_copy)? {
                    processes.push(p);
                }
            }
        }
        Ok(HamiSnapshot {
            major,
            minor,
            device_count,
            uuids,
            limit: per_device(&head, device_count, OFF_LIMIT, 8),
            sm_limit: per_device(&head, device_count, OFF_SM_LIMIT, 8),
            proc_num_raw: i32_at(&tail, at_tail(OFF_PROC_NUM)),
            processes,
            utilization_switch: i32_at(&tail, at_tail(OFF_UTIL_SWITCH)),
            recent_kernel: i32_at(&tail, at_tail(OFF_RECENT_KERNEL)),
            priority: i32_at(&tail, at_tail(OFF_PRIORITY)),
            last_kernel_time: u64_at(&tail, at_tail(OFF_LAST_KERNEL_TIME)),
        })
    }

    /// Copies process slot `slot` under HAMi-core's seqlock, best-effort and bounded: its writers
    /// race each other and a killed writer leaves it odd forever, so an inconsistent slot is
    /// shown flagged, never waited on. `None` if the slot emptied meanwhile.
    fn read_proc(
        &self,
        slot: usize,
        device_count: usize,
        copy: &mut [u8],
    ) -> Result<Option<HamiProcess>, HamiError> {
        let base = OFF_PROCS + slot * PROC_SIZE;
        let mut copied = false;
        let outcome = crate::seqlock::read_copied(
            || {
                let mut seq = [0u8; 8];
                self.read_bytes(base + SLOT_SEQLOCK, &mut seq)?;
                Ok::<u64, HamiError>(u64::from_le_bytes(seq))
            },
            || {
                self.read_bytes(base, copy)?;
                copied = true;
                Ok(u64_at(copy, SLOT_SEQLOCK))
            },
        )?;
        if !copied {
            self.read_bytes(base, copy)?;
        }
        let bytes = &*copy;
        let (pid, status) = (i32_at(bytes, SLOT_PID), i32_at(bytes, SLOT_STATUS));
        if pid == 0 || status == 0 {
            return Ok(None);
        }
        let used = SLOT_USED;
        let dev = |base: usize, stride: usize| per_device(bytes, device_count, base, stride);
        Ok(Some(HamiProcess {
            slot,
            pid,
            hostpid: i32_at(bytes, SLOT_HOSTPID),
            status,
            context_size: dev(used, DEVICE_MEMORY_SIZE),
            module_size: dev(used + 8, DEVICE_MEMORY_SIZE),
            data_size: dev(used + 16, DEVICE_MEMORY_SIZE),
            used_total: dev(used + 32, DEVICE_MEMORY_SIZE),
            monitor_used: dev(SLOT_MONITORUSED, 8),
            sm_util: dev(SLOT_DEVICE_UTIL + 16, DEVICE_UTIL_SIZE),
            consistent: matches!(outcome, crate::seqlock::SeqRead::Consistent { .. }),
        }))
    }
}

/// Checks the flag and the major version in a copy of the first 12 bytes (or more).
fn validate(head: &[u8]) -> Result<(u32, u32), HamiError> {
    let flag = i32_at(head, 0);
    if flag != HAMI_MAGIC {
        return Err(HamiError::NotInitialised { found: flag });
    }
    let (major, minor) = (
        i32_at(head, OFF_MAJOR) as u32,
        i32_at(head, OFF_MINOR) as u32,
    );
    if major != 1 {
        return Err(HamiError::UnsupportedVersion { major, minor });
    }
    Ok((major, minor))
}
