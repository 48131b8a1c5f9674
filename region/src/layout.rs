//! The byte layout of a region file: `#[repr(C)]` structs of atomics, pinned by `const` asserts.
//!
//! Every field that another process may write is an atomic, so no code path (writer or reader)
//! ever makes a plain read of shared memory. `docs/region.md` documents each field; the test
//! `doc_offsets_match_layout` checks the table in that document against [`FIELD_OFFSETS`], so the
//! two cannot drift.
//!
//! A file is a [`RegionHeader`] (one 4 KiB page) followed by `slot_count` [`SlotRecord`]s. Each
//! slot holds [`SHARDS_PER_SLOT`] statistics [`Shard`]s: [`THREAD_SHARDS`] owned by one thread
//! each, and one overflow shard shared by the remaining threads under a try-only writer bit. A
//! shard is one [`ApiRecord`] per API, each under its own seqlock.
//!
//! Layout 3 is shaped for a process that enters the limiter with cold caches (several processes
//! on one GPU, whose calls the driver serialises): a reservation touches one line of the slot
//! (state, intent and the held words of devices 0..5 share the slot's first line), a recorded
//! call touches its API record's first line (sequence and counters) and one histogram line, on
//! one page (records are 512 bytes, 512-aligned). Layouts 1 and 2 (read, never written) are in
//! `layout_v2`.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

use agent_common::MAX_DEVICES;
use agent_common::api::API_SLOTS;
use agent_common::hist::HIST_BUCKETS;

use crate::layout_v2::{ApiCountersV2, ShardV2, SlotHeaderV2, SlotRecordV2};

/// `b"VGPUREGN"` read as a little-endian `u64`.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"VGPUREGN");
/// Layout major version. Writers use only this major; readers also read [`OLDEST_READABLE_MAJOR`]
/// and later majors up to this one. 2 packs a tag into `reserved` and `held` (see `reserve`); 3
/// moves the slot header's hot words into one line and gives every API record its own seqlock.
pub const LAYOUT_MAJOR: u32 = 3;
/// The oldest major version the reader still decodes (1: `reserved` and `held` are plain bytes).
pub const OLDEST_READABLE_MAJOR: u32 = 1;
/// Layout minor version: additions inside reserved fields; readers accept any minor. 1: the
/// container's SM share per device ([`SmShare`], in what was the header's tail). 2: the bytes
/// an API copied ([`ApiRecord::bytes_moved`], in what was the record's first spare word). 3: the
/// GPU time the limiter measured ([`GpuTimeRecord`], [`KernelEntry`], in the records of the
/// last [`GPU_TIME_RECORDS`] API ids of each shard, which no API had). 4: the idle time after
/// which the container asks to be frozen ([`RegionHeader::freeze_after_ms`]). 5: the device
/// memory a process's allocation waits for under `VGPU_OOM_WAIT` ([`SlotHeader::oom_wait_bytes`],
/// [`SlotHeader::oom_wait_device`], [`SlotHeader::oom_wait_seq`], in what were the slot header's
/// first spare words). 6: the in-process freeze of a process ([`SlotHeader::own_freeze`],
/// [`SlotHeader::own_freeze_bytes`], in what were the next two).
pub const LAYOUT_MINOR: u32 = 6;
/// Most slots a region may be created with (as HAMi-core's `SHARED_REGION_MAX_PROCESS_NUM`).
pub const MAX_SLOTS: u32 = 1024;
/// Slots of a region when the configuration does not say.
pub const DEFAULT_SLOTS: u32 = 128;
/// Statistics shards owned by one thread each.
pub const THREAD_SHARDS: usize = 8;
/// All shards of a slot: the thread shards plus the overflow shard.
pub const SHARDS_PER_SLOT: usize = THREAD_SHARDS + 1;
// A reader checks one `shards_per_slot` for every layout major.
const _: () = assert!(crate::layout_v2::SHARDS_PER_SLOT_V2 == SHARDS_PER_SLOT);
/// Index of the overflow shard, shared by threads that found no free thread shard.
pub const OVERFLOW_SHARD: usize = THREAD_SHARDS;
/// Size of the header page; slots start here.
pub const HEADER_SIZE: usize = 4096;

/// Per-device container-wide state in the header.
#[repr(C)]
pub struct DeviceState {
    /// Memory limit in bytes; 0 = unlimited. Written once by the initialiser.
    pub memory_limit: AtomicU64,
    /// Bytes reserved by all processes of the container (the enforced counter), bits 0..48, and
    /// the tag of the last operation committed on it, bits 48..64 (see `reserve`).
    pub reserved: AtomicU64,
    /// SM limit in percent; 0 or 100 = unlimited. Written once by the initialiser.
    pub sm_limit: AtomicU64,
    /// Highest value `reserved` has reached.
    pub peak_reserved: AtomicU64,
    /// Reservations denied on this device, by all processes.
    pub denied: AtomicU64,
    /// Bytes returned to `reserved` by reclaiming dead processes' slots.
    pub reclaimed_bytes: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 2],
}

/// One device's container-wide SM share (layout 3.1; zero in a 3.0 file, which reads as "no
/// window yet"): the duty cycle every process of the container draws its GPU time from and its
/// NVML correction. One cache line; the protocol is in `sm_share` and docs/region.md.
#[repr(C)]
#[derive(Debug)]
pub struct SmShareOf<A> {
    /// Start of the active window opened last (the first launch, or one after a gap), CLOCK_MONOTONIC
    /// ns; 0 = none. Only grows.
    pub window_start: A,
    /// A recent launch, CLOCK_MONOTONIC ns (refreshed at most every millisecond).
    pub last_launch: A,
    /// Launches wait until then (the next window starts then), CLOCK_MONOTONIC ns. Only grows.
    pub resume_at: A,
    /// Start of the window closed last.
    pub closed_start: A,
    /// Windows closed so far.
    pub closes: A,
    /// The duty cycle the windows use: `target percent << 16 | per mille`; 0 = the target's.
    pub duty: A,
    /// The process that runs the container's corrections (the SM share's feedback, the QoS
    /// allocation): `pid << 32 | CLOCK_BOOTTIME ms (low 32 bits)` of its last renewal; 0 = none.
    pub feedback_lease: A,
    /// The container's QoS tier on this device and its allocation now (`sm_share::qos_word`);
    /// 0 = no tier (zero in files before it was used, which read the same).
    pub qos: A,
}

/// [`SmShareOf`] in a region (or in process memory, for a process without one).
pub type SmShare = SmShareOf<AtomicU64>;

impl SmShare {
    /// All words zero: no window yet.
    pub const fn new() -> SmShare {
        SmShareOf {
            window_start: AtomicU64::new(0),
            last_launch: AtomicU64::new(0),
            resume_at: AtomicU64::new(0),
            closed_start: AtomicU64::new(0),
            closes: AtomicU64::new(0),
            duty: AtomicU64::new(0),
            feedback_lease: AtomicU64::new(0),
            qos: AtomicU64::new(0),
        }
    }
}

impl Default for SmShare {
    fn default() -> SmShare {
        SmShare::new()
    }
}

/// The first page of a region file.
#[repr(C)]
pub struct RegionHeader {
    /// Initialisation state machine word (see `init`): 0 = uninitialised (a zero-filled file),
    /// `INITIALISING(pid, start ms)`, `READY(pid)`. Published last with `Release`.
    pub init_state: AtomicU64,
    /// [`REGION_MAGIC`].
    pub magic: AtomicU64,
    /// `major << 32 | minor`.
    pub layout_version: AtomicU64,
    /// Bytes of the whole region: `HEADER_SIZE + slot_count * slot_stride`.
    pub total_size: AtomicU64,
    /// Number of slots.
    pub slot_count: AtomicU32,
    /// Shards per slot (must equal [`SHARDS_PER_SLOT`]).
    pub shards_per_slot: AtomicU32,
    /// Per-API entries per shard (must equal [`API_SLOTS`]).
    pub api_slots: AtomicU32,
    /// Histogram buckets per API (must equal [`HIST_BUCKETS`]).
    pub hist_buckets: AtomicU32,
    /// Entries of `devices` (must equal [`MAX_DEVICES`]).
    pub max_devices: AtomicU32,
    /// Devices in use (`<= max_devices`).
    pub device_count: AtomicU32,
    /// Bytes between slots (must equal `size_of::<SlotRecord>()`).
    pub slot_stride: AtomicU64,
    /// Offset of slot 0 (must equal [`HEADER_SIZE`]).
    pub slots_offset: AtomicU64,
    /// Bytes between shards (must equal `size_of::<Shard>()`).
    pub shard_stride: AtomicU64,
    /// Pid of the process that initialised the region, as seen in its pid namespace.
    pub creator_pid: AtomicU64,
    /// Inode of the initialiser's `/proc/self/ns/pid` (0 if unknown).
    pub creator_pid_ns: AtomicU64,
    /// `CLOCK_REALTIME` nanoseconds when initialisation completed.
    pub created_at_unix_ns: AtomicU64,
    /// Pid-namespace inode of the current `INITIALISING` owner, written right after its CAS.
    pub init_owner_pid_ns: AtomicU64,
    /// Times a dead or stalled initialiser was taken over.
    pub init_takeovers: AtomicU64,
    /// `CLOCK_BOOTTIME` ms of the last dead-slot sweep triggered by a denial (rate limit).
    pub last_sweep_ms: AtomicU64,
    /// A thaw request: the generation of the container's control block that marked it frozen,
    /// stored by a limiter whose CUDA call found the mark (the agent thaws the container when it
    /// equals the block's generation). 0 = none.
    pub thaw_request: AtomicU64,
    /// The idle time, in ms, after which the container asks the agent to freeze it (its
    /// limiter's `VGPU_FREEZE_AFTER`; 3.4, in what was the first spare word). 0 = none.
    pub freeze_after_ms: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 2],
    /// Per-device state; entries at and after `device_count` are zero.
    pub devices: [DeviceState; MAX_DEVICES],
    /// Zero: aligns `sm` to a cache line.
    pub sm_align: [AtomicU64; 4],
    /// Per-device SM share (3.1; zero in 3.0 files).
    pub sm: [SmShare; MAX_DEVICES],
    /// Pads the header to [`HEADER_SIZE`].
    pub tail: [AtomicU64; HEADER_TAIL_WORDS],
}

const HEADER_FIXED: usize =
    160 + MAX_DEVICES * size_of::<DeviceState>() + 32 + MAX_DEVICES * size_of::<SmShare>();
/// Words of padding at the end of the header page.
pub const HEADER_TAIL_WORDS: usize = (HEADER_SIZE - HEADER_FIXED) / 8;

/// The statistics of one API in one shard, under its own seqlock: a call is recorded in one
/// section that touches the first line (sequence and counters) and one histogram line.
#[repr(C)]
pub struct ApiRecord {
    /// Seqlock sequence: odd while a write section is open; sections completed = `seq / 2`.
    pub seq: AtomicU64,
    /// Calls recorded.
    pub calls: AtomicU64,
    /// Calls that returned an error.
    pub errors: AtomicU64,
    /// Sum of call latencies as the application saw them, ns.
    pub latency_ns: AtomicU64,
    /// Time spent inside the limiter's own hook code, ns.
    pub hook_ns: AtomicU64,
    /// Bytes allocated through this API.
    pub bytes_allocated: AtomicU64,
    /// Bytes freed through this API.
    pub bytes_freed: AtomicU64,
    /// Time the limiter held calls of this API back (SM limit; an allocation waiting for device
    /// memory under `VGPU_OOM_WAIT`), ns.
    pub throttled_ns: AtomicU64,
    /// Allocations denied by the limit.
    pub denied: AtomicU64,
    /// Bytes of the denied allocations.
    pub denied_bytes: AtomicU64,
    /// Log2 latency histogram (bucketed by `agent_common::hist::bucket_of`).
    pub hist: [AtomicU64; HIST_BUCKETS],
    /// Bytes copied by this API (minor 2; zero in regions of older writers).
    pub bytes_moved: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; API_RECORD_SPARE_WORDS],
}

/// Bytes of an [`ApiRecord`]: a power of two, so that no record straddles a page.
pub const API_RECORD_SIZE: usize = 512;
const API_RECORD_SPARE_WORDS: usize = API_RECORD_SIZE / 8 - 11 - HIST_BUCKETS;

/// Records at the end of a shard that hold GPU time instead of an API's statistics (layout 3.3):
/// [`GPU_DEVICE_RECORDS`] of [`GpuTimeRecord`] and [`KERNEL_RECORDS`] of [`KernelEntry`]s.
pub const GPU_TIME_RECORDS: usize = GPU_DEVICE_RECORDS + KERNEL_RECORDS;
/// API records per shard: ids `0..API_RECORDS` (the rest of [`API_SLOTS`] hold GPU time).
pub const API_RECORDS: usize = API_SLOTS - GPU_TIME_RECORDS;
/// Devices of one [`GpuTimeRecord`].
pub const GPU_DEVICES_PER_RECORD: usize = 8;
/// [`GpuTimeRecord`]s per shard (all [`MAX_DEVICES`]).
pub const GPU_DEVICE_RECORDS: usize = MAX_DEVICES / GPU_DEVICES_PER_RECORD;
/// Records holding [`KernelEntry`]s, [`KERNELS_PER_RECORD`] each.
pub const KERNEL_RECORDS: usize = 4;
/// [`KernelEntry`]s per 512-byte record.
pub const KERNELS_PER_RECORD: usize = API_RECORD_SIZE / size_of::<KernelEntry>();
/// Kernel entries per shard; the last one sums the kernels that found no entry of their own.
pub const KERNEL_ENTRIES: usize = KERNEL_RECORDS * KERNELS_PER_RECORD;
/// Bytes of a kernel's name kept in its entry (the rest is cut; the hash covers the whole name).
pub const KERNEL_NAME_BYTES: usize = 64;
/// The `name_hash` of the entry that sums the kernels that found no entry of their own.
pub const OTHER_KERNELS_HASH: u64 = u64::MAX;

/// Sampled GPU time of one device, as one thread's samples add up (all words only grow).
#[repr(C)]
pub struct GpuTimeCounters {
    /// GPU time of all launches, estimated: each sample's time times the launches it stands
    /// for, ns.
    pub estimated_ns: AtomicU64,
    /// GPU time of the sampled launches themselves (event pairs), ns.
    pub sampled_ns: AtomicU64,
    /// Samples taken (completed event pairs).
    pub samples: AtomicU64,
    /// Launches the samples stand for (each sample, the launches since the previous one).
    pub launches: AtomicU64,
}

/// The GPU time one thread measured, per device, under one seqlock (layout 3.3). Shaped like an
/// [`ApiRecord`] where older readers look: the sequence first and word 7 zero (they add that
/// word of every record to the throttled time).
#[repr(C)]
pub struct GpuTimeRecord {
    /// Seqlock sequence, as [`ApiRecord::seq`].
    pub seq: AtomicU64,
    /// Event calls that failed (the sample is dropped; in a shard's first record only).
    pub event_errors: AtomicU64,
    /// Samples not taken: too many pairs still pending, or the stream was being captured (in a
    /// shard's first record only).
    pub skipped: AtomicU64,
    /// Zero; for minor versions.
    pub spare_head: [AtomicU64; 4],
    /// Always zero (see the struct).
    pub zero: AtomicU64,
    /// Devices `8 * r .. 8 * r + 8` of record `r`.
    pub devices: [GpuTimeCounters; GPU_DEVICES_PER_RECORD],
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 24],
}

/// One kernel's sampled GPU time in one thread's shard, under its own seqlock (layout 3.3). An
/// entry is taken by the first kernel of its name (`name_hash` 0: free) and keeps it for the
/// life of the slot.
#[repr(C)]
pub struct KernelEntry {
    /// Seqlock sequence of the entry.
    pub seq: AtomicU64,
    /// FNV-1a hash of the whole name, never 0 or [`OTHER_KERNELS_HASH`]; 0 = free;
    /// [`OTHER_KERNELS_HASH`]: the kernels that found no entry.
    pub name_hash: AtomicU64,
    /// As [`GpuTimeCounters::estimated_ns`].
    pub estimated_ns: AtomicU64,
    /// As [`GpuTimeCounters::sampled_ns`].
    pub sampled_ns: AtomicU64,
    /// As [`GpuTimeCounters::samples`].
    pub samples: AtomicU64,
    /// As [`GpuTimeCounters::launches`].
    pub launches: AtomicU64,
    /// Bytes of the whole name (more than [`KERNEL_NAME_BYTES`]: cut).
    pub name_len: AtomicU64,
    /// Always zero (see [`GpuTimeRecord`]).
    pub zero: AtomicU64,
    /// The name's first [`KERNEL_NAME_BYTES`] bytes as the driver gave them, NUL padded (the
    /// tenant's bytes: readers sanitise them).
    pub name: [AtomicU64; KERNEL_NAME_BYTES / 8],
}

/// A single-writer statistics shard: one record per API id, then the GPU time.
#[repr(C)]
pub struct Shard {
    /// Records per API id.
    pub apis: [ApiRecord; API_RECORDS],
    /// GPU time per device (layout 3.3).
    pub gpu_time: [GpuTimeRecord; GPU_DEVICE_RECORDS],
    /// GPU time per kernel name (layout 3.3).
    pub kernels: [KernelEntry; KERNEL_ENTRIES],
}

/// The bit of a slot's `context_bytes` that marks the charge as refused, not held.
pub const CONTEXT_REFUSED: u64 = 1 << 63;

/// The fixed part of a slot.
#[repr(C)]
pub struct SlotHeader {
    /// Slot state word: `generation << 40 | phase << 32 | pid` (see `slots`).
    pub state: AtomicU64,
    /// The slot's reservation operation in flight: `state | kind << 2 | device << 4 |
    /// ticket << 8 | seq << 24` (see `reserve`). Zero = none.
    pub intent: AtomicU64,
    /// Bytes of the intent (reserve or release).
    pub intent_bytes: AtomicU64,
    /// Bytes this process holds per device (reserved and not released), bits 0..48, and the
    /// ticket of the last operation applied, bits 48..64 (see `reserve`). Devices 0..5 share the
    /// first line with `state` and the intent.
    pub held: [AtomicU64; MAX_DEVICES],
    /// Context (and module) bytes per device, as set by the limiter, for display; with
    /// [`CONTEXT_REFUSED`] set, the charge that was refused (the limit has no room for it).
    pub context_bytes: [AtomicU64; MAX_DEVICES],
    /// Owner's start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: AtomicU64,
    /// Inode of the owner's `/proc/self/ns/pid` (0 if unknown).
    pub pid_ns: AtomicU64,
    /// `CLOCK_REALTIME` nanoseconds at claim.
    pub claimed_at_unix_ns: AtomicU64,
    /// `CLOCK_BOOTTIME` milliseconds when the current reclaim started (0 = none).
    pub reclaim_started_ms: AtomicU64,
    /// Records dropped because the overflow shard's record was busy.
    pub dropped_records: AtomicU64,
    /// Owner's command name (`/proc/self/comm`), 16 bytes, NUL padded.
    pub name: [AtomicU64; 2],
    /// Bit `i` set once shard `i` has been written (so a reused slot zeroes only those).
    pub used_shards: AtomicU64,
    /// Thread shards: kernel tid of each shard's owning thread, 0 = free (the overflow shard's
    /// entry stays 0).
    pub shard_owner: [AtomicU64; SHARDS_PER_SLOT],
    /// Bytes an allocation of this process waits for under `VGPU_OOM_WAIT` (the GPU refused it;
    /// never a denial by the limit), 0 = none (3.5). Stored last, with `Release`, when the wait
    /// starts; set to 0 when it ends. The tenant's word: the agent only decides from it which
    /// idle containers it may freeze (`--freeze-on-demand`).
    pub oom_wait_bytes: AtomicU64,
    /// The device index of that allocation (3.5; meaningful while `oom_wait_bytes` is not 0).
    pub oom_wait_device: AtomicU64,
    /// Waits this process has started, the last one's number (3.5): it tells one wait from the
    /// next, so that the agent counts what it froze for each wait apart.
    pub oom_wait_seq: AtomicU64,
    /// The process's in-process freeze (3.6; `VGPU_FREEZE_IN_PROCESS`), an [`OwnFreeze`]
    /// encoded by [`OwnFreeze::encode`]: 0 = the path is off in this process. The tenant's word:
    /// the agent only uses it to choose the path and to see the freeze answered.
    pub own_freeze: AtomicU64,
    /// Device bytes the limiter backs so that it can move them itself (3.6): what an in-process
    /// freeze gives back while running, what is held in host memory while frozen.
    pub own_freeze_bytes: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 7],
}

/// One process slot: its header and its shards. Slots never move.
#[repr(C)]
pub struct SlotRecord {
    /// Identity, state and holdings.
    pub header: SlotHeader,
    /// Statistics shards.
    pub shards: [Shard; SHARDS_PER_SLOT],
}

/// Size of [`SlotRecord`].
pub const SLOT_SIZE: usize = size_of::<SlotRecord>();
/// Size of [`Shard`].
pub const SHARD_SIZE: usize = size_of::<Shard>();

/// Bytes of a region with `slots` slots.
pub const fn region_size(slots: u32) -> u64 {
    HEADER_SIZE as u64 + slots as u64 * SLOT_SIZE as u64
}

/// Bytes between slots in a region of layout major `major` (1 and 2: `layout_v2`).
pub const fn slot_stride_for(major: u32) -> usize {
    if major < 3 {
        crate::layout_v2::SLOT_SIZE_V2
    } else {
        SLOT_SIZE
    }
}

/// Bytes between shards in a region of layout major `major`.
pub const fn shard_stride_for(major: u32) -> usize {
    if major < 3 {
        crate::layout_v2::SHARD_SIZE_V2
    } else {
        SHARD_SIZE
    }
}

/// Bytes of a region of layout major `major` with `slots` slots.
pub const fn region_size_for(major: u32, slots: u32) -> u64 {
    HEADER_SIZE as u64 + slots as u64 * slot_stride_for(major) as u64
}

// Sizes and offsets are part of the protocol: a change here is a layout version change.
const _: () = assert!(size_of::<DeviceState>() == 64);
const _: () = assert!(size_of::<RegionHeader>() == HEADER_SIZE);
const _: () = assert!(size_of::<ApiRecord>() == API_RECORD_SIZE);
const _: () = assert!(size_of::<Shard>() == 49_152);
const _: () = assert!(size_of::<GpuTimeRecord>() == API_RECORD_SIZE);
const _: () = assert!(size_of::<KernelEntry>() == 128);
const _: () = assert!(MAX_DEVICES.is_multiple_of(GPU_DEVICES_PER_RECORD));
const _: () = assert!(agent_common::api::API_COUNT <= API_RECORDS);
// What older readers take for a record's sequence and its throttled time.
const _: () = assert!(offset_of!(GpuTimeRecord, zero) == offset_of!(ApiRecord, throttled_ns));
const _: () = assert!(offset_of!(KernelEntry, zero) == offset_of!(ApiRecord, throttled_ns));
const _: () = assert!(offset_of!(Shard, gpu_time) == API_RECORDS * API_RECORD_SIZE);
const _: () = assert!(size_of::<SlotHeader>() == 512);
const _: () = assert!(size_of::<SlotRecord>() == 442_880);
const _: () = assert!(offset_of!(RegionHeader, init_state) == 0);
const _: () = assert!(offset_of!(RegionHeader, magic) == 8);
const _: () = assert!(offset_of!(RegionHeader, layout_version) == 16);
const _: () = assert!(offset_of!(RegionHeader, total_size) == 24);
const _: () = assert!(offset_of!(RegionHeader, slot_count) == 32);
const _: () = assert!(offset_of!(RegionHeader, device_count) == 52);
const _: () = assert!(offset_of!(RegionHeader, slot_stride) == 56);
const _: () = assert!(offset_of!(RegionHeader, init_takeovers) == 112);
const _: () = assert!(offset_of!(RegionHeader, thaw_request) == 128);
const _: () = assert!(offset_of!(RegionHeader, freeze_after_ms) == 136);
const _: () = assert!(offset_of!(RegionHeader, devices) == 160);
// Each device's SM share is one cache line of its own (the mapping is page-aligned).
const _: () = assert!(size_of::<SmShare>() == 64);
const _: () = assert!(offset_of!(RegionHeader, sm) == 1216);
const _: () = assert!(offset_of!(RegionHeader, sm).is_multiple_of(64));
const _: () = assert!(offset_of!(RegionHeader, tail) == 2240);
// A reservation on devices 0..5 touches one line of its slot: state, intent, bytes, held word.
const _: () = assert!(offset_of!(SlotHeader, state) == 0);
const _: () = assert!(offset_of!(SlotHeader, intent) == 8);
const _: () = assert!(offset_of!(SlotHeader, intent_bytes) == 16);
const _: () = assert!(offset_of!(SlotHeader, held) == 24);
const _: () = assert!(offset_of!(SlotHeader, shard_owner) == 344);
const _: () = assert!(offset_of!(SlotHeader, oom_wait_bytes) == 416);
const _: () = assert!(offset_of!(SlotHeader, oom_wait_device) == 424);
const _: () = assert!(offset_of!(SlotHeader, oom_wait_seq) == 432);
const _: () = assert!(offset_of!(SlotHeader, own_freeze) == 440);
const _: () = assert!(offset_of!(SlotHeader, own_freeze_bytes) == 448);
const _: () = assert!(offset_of!(SlotHeader, spare) == 456);
const _: () = assert!(offset_of!(SlotRecord, shards) == 512);
// A call's section touches the record's first line (sequence and the counters a call bumps).
const _: () = assert!(offset_of!(ApiRecord, throttled_ns) + 8 == 64);
const _: () = assert!(offset_of!(ApiRecord, hist) == 80);
// Records never straddle a page: the header page, the slot stride and the slot header are
// multiples of the record size, and so is everything before a record inside a slot.
const _: () = assert!(HEADER_SIZE.is_multiple_of(API_RECORD_SIZE));
const _: () = assert!(SLOT_SIZE.is_multiple_of(API_RECORD_SIZE));
const _: () = assert!(SHARD_SIZE.is_multiple_of(API_RECORD_SIZE));
const _: () = assert!(4096usize.is_multiple_of(API_RECORD_SIZE));
// A region for 64 processes with 8 thread shards each stays far below 64 MiB of (sparse) file.
const _: () = assert!(region_size(64) < 32 << 20);
const _: () = assert!(region_size(DEFAULT_SLOTS) < 64 << 20);
const _: () = assert!(HEADER_FIXED <= HEADER_SIZE);

macro_rules! field_offsets {
    ($($ty:ident . $field:ident),* $(,)?) => {
        /// `(struct, field, offset, size)` for every field, as documented in `docs/region.md`.
        pub const FIELD_OFFSETS: &[(&str, &str, usize, usize)] = &[
            $((
                stringify!($ty),
                stringify!($field),
                offset_of!($ty, $field),
                size_of_field(|s: &$ty| &s.$field),
            )),*
        ];
    };
}

const fn size_of_field<S, F>(_: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

field_offsets!(
    RegionHeader.init_state,
    RegionHeader.magic,
    RegionHeader.layout_version,
    RegionHeader.total_size,
    RegionHeader.slot_count,
    RegionHeader.shards_per_slot,
    RegionHeader.api_slots,
    RegionHeader.hist_buckets,
    RegionHeader.max_devices,
    RegionHeader.device_count,
    RegionHeader.slot_stride,
    RegionHeader.slots_offset,
    RegionHeader.shard_stride,
    RegionHeader.creator_pid,
    RegionHeader.creator_pid_ns,
    RegionHeader.created_at_unix_ns,
    RegionHeader.init_owner_pid_ns,
    RegionHeader.init_takeovers,
    RegionHeader.last_sweep_ms,
    RegionHeader.thaw_request,
    RegionHeader.freeze_after_ms,
    RegionHeader.spare,
    RegionHeader.devices,
    RegionHeader.sm_align,
    RegionHeader.sm,
    RegionHeader.tail,
    DeviceState.memory_limit,
    DeviceState.reserved,
    DeviceState.sm_limit,
    DeviceState.peak_reserved,
    DeviceState.denied,
    DeviceState.reclaimed_bytes,
    DeviceState.spare,
    SmShare.window_start,
    SmShare.last_launch,
    SmShare.resume_at,
    SmShare.closed_start,
    SmShare.closes,
    SmShare.duty,
    SmShare.feedback_lease,
    SmShare.qos,
    SlotRecord.header,
    SlotRecord.shards,
    SlotHeader.state,
    SlotHeader.intent,
    SlotHeader.intent_bytes,
    SlotHeader.held,
    SlotHeader.context_bytes,
    SlotHeader.start_time,
    SlotHeader.pid_ns,
    SlotHeader.claimed_at_unix_ns,
    SlotHeader.reclaim_started_ms,
    SlotHeader.dropped_records,
    SlotHeader.name,
    SlotHeader.used_shards,
    SlotHeader.shard_owner,
    SlotHeader.oom_wait_bytes,
    SlotHeader.oom_wait_device,
    SlotHeader.oom_wait_seq,
    SlotHeader.own_freeze,
    SlotHeader.own_freeze_bytes,
    SlotHeader.spare,
    Shard.apis,
    Shard.gpu_time,
    Shard.kernels,
    GpuTimeRecord.seq,
    GpuTimeRecord.event_errors,
    GpuTimeRecord.skipped,
    GpuTimeRecord.spare_head,
    GpuTimeRecord.zero,
    GpuTimeRecord.devices,
    GpuTimeRecord.spare,
    GpuTimeCounters.estimated_ns,
    GpuTimeCounters.sampled_ns,
    GpuTimeCounters.samples,
    GpuTimeCounters.launches,
    KernelEntry.seq,
    KernelEntry.name_hash,
    KernelEntry.estimated_ns,
    KernelEntry.sampled_ns,
    KernelEntry.samples,
    KernelEntry.launches,
    KernelEntry.name_len,
    KernelEntry.zero,
    KernelEntry.name,
    ApiRecord.seq,
    ApiRecord.calls,
    ApiRecord.errors,
    ApiRecord.latency_ns,
    ApiRecord.hook_ns,
    ApiRecord.bytes_allocated,
    ApiRecord.bytes_freed,
    ApiRecord.throttled_ns,
    ApiRecord.denied,
    ApiRecord.denied_bytes,
    ApiRecord.hist,
    ApiRecord.bytes_moved,
    ApiRecord.spare,
    SlotRecordV2.header,
    SlotRecordV2.shards,
    SlotHeaderV2.state,
    SlotHeaderV2.start_time,
    SlotHeaderV2.pid_ns,
    SlotHeaderV2.claimed_at_unix_ns,
    SlotHeaderV2.reclaim_started_ms,
    SlotHeaderV2.dropped_records,
    SlotHeaderV2.name,
    SlotHeaderV2.held,
    SlotHeaderV2.context_bytes,
    SlotHeaderV2.used_shards,
    SlotHeaderV2.intent,
    SlotHeaderV2.intent_bytes,
    SlotHeaderV2.spare,
    ShardV2.seq,
    ShardV2.owner_tid,
    ShardV2.throttled_ns,
    ShardV2.write_sections,
    ShardV2.spare,
    ShardV2.apis,
    ShardV2.hist,
    ApiCountersV2.calls,
    ApiCountersV2.errors,
    ApiCountersV2.latency_ns,
    ApiCountersV2.hook_ns,
    ApiCountersV2.bytes_allocated,
    ApiCountersV2.bytes_freed,
    ApiCountersV2.denied,
    ApiCountersV2.denied_bytes,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row `| Struct | field | offset | size |` of the field tables in docs/region.md must
    /// match [`FIELD_OFFSETS`] exactly, and every field must be documented.
    #[test]
    fn doc_offsets_match_layout() {
        let doc = include_str!("../../docs/region.md");
        let mut rows = Vec::new();
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // ["", "`Struct`", "`field`", "offset", "size", "meaning", ""]
            if cells.len() >= 6
                && cells[1].starts_with('`')
                && cells[2].starts_with('`')
                && let (Ok(off), Ok(size)) = (cells[3].parse::<usize>(), cells[4].parse::<usize>())
            {
                rows.push((
                    cells[1].trim_matches('`').to_string(),
                    cells[2].trim_matches('`').to_string(),
                    off,
                    size,
                ));
            }
        }
        let expected: Vec<(String, String, usize, usize)> = FIELD_OFFSETS
            .iter()
            .map(|(s, f, o, z)| (s.to_string(), f.to_string(), *o, *z))
            .collect();
        assert_eq!(
            rows, expected,
            "docs/region.md field tables drifted from layout.rs"
        );
    }

    #[test]
    fn region_sizes() {
        assert_eq!(region_size(0), HEADER_SIZE as u64);
        assert_eq!(region_size(64), 4096 + 64 * 442_880);
        assert_eq!(region_size_for(2, 64), 4096 + 64 * 325_824);
        assert_eq!(region_size_for(3, 64), region_size(64));
    }
}
