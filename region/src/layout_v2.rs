//! Slots of layout majors 1 and 2 (the header page is the same as in layout 3): read by
//! `RegionReader`, never written. Offsets are pinned here and documented in `docs/region.md`
//! (the `...V2` tables), and `layout::FIELD_OFFSETS` lists them with layout 3's.
//!
//! In these layouts a shard has one seqlock for all its APIs (`seq`), followed by a cache line of
//! counters per API and a histogram array per API; the slot header keeps its state word, held
//! words and intent in three different cache lines.

use std::mem::{offset_of, size_of};
use std::sync::atomic::AtomicU64;

use agent_common::api::API_SLOTS;
use agent_common::hist::HIST_BUCKETS;

use agent_common::MAX_DEVICES;

/// Shards per slot in layouts 1 and 2: 8 thread shards and the overflow shard, as in layout 3
/// (`layout` asserts that they agree). Written out here because these layouts never change.
pub(crate) const SHARDS_PER_SLOT_V2: usize = 9;

/// Per-API counters of one shard (one cache line).
#[repr(C)]
pub struct ApiCountersV2 {
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
    /// Allocations denied by the limit.
    pub denied: AtomicU64,
    /// Bytes of the denied allocations.
    pub denied_bytes: AtomicU64,
}

/// A single-writer statistics shard, guarded by one seqlock.
#[repr(C)]
pub struct ShardV2 {
    /// Seqlock sequence: odd while a write section is open.
    pub seq: AtomicU64,
    /// Thread shards: kernel tid of the owning thread, 0 = free. Overflow shard: unused (0).
    pub owner_tid: AtomicU64,
    /// Time the limiter throttled launches (SM limit), ns.
    pub throttled_ns: AtomicU64,
    /// Write sections completed.
    pub write_sections: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 4],
    /// Counters per API id.
    pub apis: [ApiCountersV2; API_SLOTS],
    /// Log2 latency histogram per API id.
    pub hist: [[AtomicU64; HIST_BUCKETS]; API_SLOTS],
}

/// The fixed part of a slot.
#[repr(C)]
pub struct SlotHeaderV2 {
    /// Slot state word: `generation << 40 | phase << 32 | pid`.
    pub state: AtomicU64,
    /// Owner's start time, clock ticks since boot.
    pub start_time: AtomicU64,
    /// Inode of the owner's `/proc/self/ns/pid` (0 if unknown).
    pub pid_ns: AtomicU64,
    /// `CLOCK_REALTIME` nanoseconds at claim.
    pub claimed_at_unix_ns: AtomicU64,
    /// `CLOCK_BOOTTIME` milliseconds when the current reclaim started (0 = none).
    pub reclaim_started_ms: AtomicU64,
    /// Records dropped because the overflow shard was busy.
    pub dropped_records: AtomicU64,
    /// Owner's command name, 16 bytes, NUL padded.
    pub name: [AtomicU64; 2],
    /// Bytes held per device (major 2: bits 0..48, a ticket above; major 1: plain bytes).
    pub held: [AtomicU64; MAX_DEVICES],
    /// Context (and module) bytes per device, for display.
    pub context_bytes: [AtomicU64; MAX_DEVICES],
    /// Bit `i` set once shard `i` has been written.
    pub used_shards: AtomicU64,
    /// The slot's reservation operation in flight (major 2).
    pub intent: AtomicU64,
    /// Bytes of the intent (major 2).
    pub intent_bytes: AtomicU64,
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 5],
}

/// One process slot of layouts 1 and 2.
#[repr(C)]
pub struct SlotRecordV2 {
    /// Identity, state and holdings.
    pub header: SlotHeaderV2,
    /// Statistics shards.
    pub shards: [ShardV2; SHARDS_PER_SLOT_V2],
}

/// Size of [`SlotRecordV2`].
pub const SLOT_SIZE_V2: usize = size_of::<SlotRecordV2>();
/// Size of [`ShardV2`].
pub const SHARD_SIZE_V2: usize = size_of::<ShardV2>();

const _: () = assert!(size_of::<ApiCountersV2>() == 64);
const _: () = assert!(SHARD_SIZE_V2 == 36_160);
const _: () = assert!(size_of::<SlotHeaderV2>() == 384);
const _: () = assert!(SLOT_SIZE_V2 == 325_824);
const _: () = assert!(offset_of!(ShardV2, apis) == 64);
const _: () = assert!(offset_of!(ShardV2, hist) == 6208);
const _: () = assert!(offset_of!(SlotHeaderV2, held) == 64);
const _: () = assert!(offset_of!(SlotHeaderV2, intent) == 328);
const _: () = assert!(offset_of!(SlotHeaderV2, intent_bytes) == 336);
const _: () = assert!(offset_of!(SlotHeaderV2, spare) == 344);
const _: () = assert!(offset_of!(SlotRecordV2, shards) == 384);
