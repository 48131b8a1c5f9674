//! Keys and values of the eBPF maps. `#[repr(C)]`, no implicit padding (explicit `_pad` fields), so
//! the kernel's byte layout and Rust's agree; sizes are pinned below.

use crate::hist::HIST_BUCKETS;

/// Aggregation key: one row per (cgroup, process, API).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatsKey {
    /// cgroup v2 id (`bpf_get_current_cgroup_id`) at the time of the call.
    pub cgroup_id: u64,
    pub tgid: u32,
    pub api: u16,
    pub _pad: u16,
}

/// Aggregated calls of one [`StatsKey`]. Updated with atomic adds from any CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiStats {
    pub calls: u64,
    /// Calls whose result was not `CUDA_SUCCESS`.
    pub errors: u64,
    /// Bytes named by the call's size argument (allocations: the size asked for).
    pub bytes: u64,
    /// Sum of entry-to-return latencies, ns.
    pub total_ns: u64,
    /// Calls that took a probe hit but were not counted in `calls`, at a sampling window's edge
    /// where a kind's entry and return probes are switched one after the other: a return whose
    /// entry was not seen (the entry probe gone, the return probe not yet), and an entry whose
    /// return never came (counted at the thread's next entry of the same API).
    pub unpaired: u64,
    /// Log2 latency histogram, see [`crate::hist`].
    pub hist: [u64; HIST_BUCKETS],
}

impl ApiStats {
    pub const ZERO: ApiStats = ApiStats {
        calls: 0,
        errors: 0,
        bytes: 0,
        total_ns: 0,
        unpaired: 0,
        hist: [0; HIST_BUCKETS],
    };
}

/// A call in flight on one thread, stored by the entry probe and consumed by the return probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InflightKey {
    /// `bpf_get_current_pid_tgid()`: tgid << 32 | thread id.
    pub pid_tgid: u64,
    pub api: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inflight {
    pub start_ns: u64,
    /// The size argument (bytes), or for frees the address or handle being freed.
    pub arg: u64,
    /// Out-pointer of an allocation (`CUdeviceptr *` or handle pointer).
    pub out_ptr: u64,
    /// `cuMemAllocPitch_v2`: the `size_t *pitch` out-pointer.
    pub pitch_ptr: u64,
    /// `cuMemAllocPitch_v2`: the height.
    pub height: u64,
    /// The `CUstream` argument, for APIs that take one (0 otherwise; 0 is also the NULL stream).
    pub stream: u64,
}

/// A live allocation: (process, address space, address or handle).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocKey {
    pub tgid: u32,
    /// [`crate::api::ALLOC_SPACE_PTR`] or [`crate::api::ALLOC_SPACE_HANDLE`].
    pub space: u32,
    pub addr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocVal {
    pub bytes: u64,
    pub api: u32,
    pub _pad: u32,
}

/// Live device memory of one process as the probes saw it. The entry is the sum of the
/// [`AllocKey`] entries of that process: both are updated by the same return probe, bytes are added
/// only when the allocation entry was inserted and subtracted only when it was found and removed,
/// so the figure can neither go negative nor keep bytes that the table no longer holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveMem {
    pub bytes: u64,
    pub allocations: u64,
}

/// NCCL aggregation key: one row per (cgroup, process, API, communicator).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NcclStatsKey {
    /// cgroup v2 id at the time of the call.
    pub cgroup_id: u64,
    pub tgid: u32,
    pub api: u16,
    pub _pad: u16,
    /// The `ncclComm_t` the call named (for a successful ncclCommInitRank*, the communicator it
    /// created); 0 for group calls, ncclCommInitAll and calls that named no communicator.
    pub comm: u64,
}

/// An NCCL call in flight on one thread (keyed by [`InflightKey`] in its own map).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclInflight {
    pub start_ns: u64,
    /// `count x size(datatype)`; 0 where the datatype is unknown.
    pub bytes: u64,
    /// The communicator argument.
    pub comm: u64,
    /// ncclCommInit*: the `ncclComm_t *` out-pointer (an array for ncclCommInitAll).
    pub out_ptr: u64,
    /// ncclCommInit*: number of ranks (ncclCommInitAll: ndev).
    pub nranks: u32,
    /// ncclCommInitRank*: this process's rank.
    pub rank: u32,
    /// The `cudaStream_t` argument of calls that take one.
    pub stream: u64,
    /// ncclCommInit* with an `ncclUniqueId`: NCCL's communicator id (`api::comm_id_of`), 0 if
    /// the id could not be read.
    pub comm_id: u64,
}

/// A communicator of a process: (process, `ncclComm_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NcclCommKey {
    pub tgid: u32,
    pub _pad: u32,
    pub comm: u64,
}

/// What the successful ncclCommInit* call that created a communicator said about it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclCommInfo {
    pub rank: u32,
    pub nranks: u32,
    /// The API id that created it.
    pub init_api: u16,
    /// 1 once ncclCommDestroy or ncclCommAbort succeeded on it.
    pub destroyed: u16,
    pub _pad: u32,
    /// NCCL's communicator id, the same in every rank (`api::comm_id_of` of the unique id it
    /// was created from); 0 when not known (ncclCommInitAll, an unreadable id).
    pub comm_id: u64,
}

/// How many entries of ncclCommInitAll's `comms` array the return probe reads (a bounded loop).
pub const NCCL_INIT_ALL_MAX: u32 = 8;

/// Indices of the per-CPU health counters (map `HEALTH`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// An entry probe could not store its in-flight record (map full).
    InflightDropped = 0,
    /// A return probe found no in-flight record (the entry was missed or evicted).
    ReturnWithoutEntry = 1,
    /// The allocation table was full: the allocation is counted but not tracked as live memory.
    AllocTableFull = 2,
    /// A stats row could not be created (map full): the call was not aggregated.
    StatsDropped = 3,
    /// A free named an address that the table does not hold (allocated before the agent started,
    /// or a failed free).
    FreeUnknown = 4,
    /// Reading user memory (an out-pointer) failed.
    UserReadFailed = 5,
    /// An NCCL call named a datatype that NCCL 2.28 does not define: counted with 0 bytes.
    NcclUnknownDatatype = 6,
    /// An NCCL aggregation row or communicator entry could not be created (map full).
    NcclDropped = 7,
    /// A sampled call's span event found the `SPANS` ring buffer full: the span is lost.
    RingFull = 8,
    /// A successful allocation of a process that already had its share of the allocation table
    /// (`ALLOC_QUOTA` live entries): counted for the process in `LOSSES`, not tracked.
    AllocQuota = 9,
    /// A call whose new stats row (`STATS`, `NCCL_STATS`, `ALLOC_SIZES`) its cgroup had no room
    /// for (`ROW_QUOTA` rows): counted for the process in `LOSSES`, not aggregated.
    RowQuota = 10,
}

impl Health {
    pub const COUNT: u32 = 11;
    pub const ALL: [Health; Health::COUNT as usize] = [
        Health::InflightDropped,
        Health::ReturnWithoutEntry,
        Health::AllocTableFull,
        Health::StatsDropped,
        Health::FreeUnknown,
        Health::UserReadFailed,
        Health::NcclUnknownDatatype,
        Health::NcclDropped,
        Health::RingFull,
        Health::AllocQuota,
        Health::RowQuota,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Health::InflightDropped => "inflight_dropped",
            Health::ReturnWithoutEntry => "return_without_entry",
            Health::AllocTableFull => "alloc_table_full",
            Health::StatsDropped => "stats_dropped",
            Health::FreeUnknown => "free_unknown",
            Health::UserReadFailed => "user_read_failed",
            Health::NcclUnknownDatatype => "nccl_unknown_datatype",
            Health::NcclDropped => "nccl_dropped",
            Health::RingFull => "ring_full",
            Health::AllocQuota => "alloc_quota",
            Health::RowQuota => "row_quota",
        }
    }
}

/// Why a call became a span event.
pub const SPAN_NCCL: u8 = 1;
pub const SPAN_SLOW: u8 = 2;
pub const SPAN_SAMPLED: u8 = 3;

/// One sampled call, written to the `SPANS` ring buffer by a return probe (NCCL collectives
/// always, calls slower than `TRACE_SLOW_NS`, and one in `TRACE_SAMPLE_EVERY` of the others).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanEvent {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at entry and return.
    pub start_ns: u64,
    pub end_ns: u64,
    pub cgroup_id: u64,
    pub bytes: u64,
    /// NCCL: the communicator (0 otherwise).
    pub comm: u64,
    /// The stream argument where the API takes one (`ApiSpec::stream`), else 0.
    pub stream: u64,
    pub tgid: u32,
    pub tid: u32,
    /// The call's result (CUresult or ncclResult_t).
    pub result: u32,
    pub api: u16,
    /// [`SPAN_NCCL`], [`SPAN_SLOW`] or [`SPAN_SAMPLED`].
    pub reason: u8,
    pub _pad: u8,
    /// The calling thread's name (`bpf_get_current_comm`).
    pub task: [u8; 16],
}

/// The ring buffer's size (a power of two pages).
pub const SPANS_RING_BYTES: u32 = 4 << 20;

/// Map sizes, shared so that userspace can report how full each one is.
pub const STATS_MAX_ENTRIES: u32 = 16_384;
pub const INFLIGHT_MAX_ENTRIES: u32 = 16_384;
pub const ALLOCS_MAX_ENTRIES: u32 = 262_144;
pub const LIVE_MAX_ENTRIES: u32 = 16_384;
pub const ALLOC_SIZES_MAX_ENTRIES: u32 = 16_384;

/// Successful allocations of one process and API by size class: `log2` is the floor of log2 of
/// the size in bytes (so class 20 holds [1 MiB, 2 MiB)). Shows how much memory goes through
/// small and large allocations, and through pools (async APIs) or directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocSizeKey {
    /// cgroup v2 id at the time of the call: the row counts against that cgroup's rows.
    pub cgroup_id: u64,
    pub tgid: u32,
    pub api: u16,
    pub log2: u8,
    pub _pad: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocSizeVal {
    pub count: u64,
    pub bytes: u64,
}
pub const NCCL_STATS_MAX_ENTRIES: u32 = 16_384;
pub const NCCL_INFLIGHT_MAX_ENTRIES: u32 = 16_384;
pub const NCCL_COMMS_MAX_ENTRIES: u32 = 4_096;
pub const LOSSES_MAX_ENTRIES: u32 = 16_384;
pub const CGROUP_ROWS_MAX_ENTRIES: u32 = 4_096;

/// Live allocations one process may have in `ALLOCS` (1/8 of the table) unless the agent sets
/// another share at load time (global `ALLOC_QUOTA`): one process cannot fill the table that all
/// processes share.
pub const ALLOC_QUOTA_DEFAULT: u64 = ALLOCS_MAX_ENTRIES as u64 / 8;
/// Rows one cgroup may have in `STATS`, `NCCL_STATS` and `ALLOC_SIZES` together (1/8 of one
/// map) unless set at load time (global `ROW_QUOTA`). Counted per cgroup in `CGROUP_ROWS` by the
/// probes when they create a row; the agent recounts it when it removes exited processes' rows.
pub const ROW_QUOTA_DEFAULT: u64 = STATS_MAX_ENTRIES as u64 / 8;

/// What the probes could not record for one process (map `LOSSES`, keyed by tgid): cumulative,
/// created only when something is lost.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeLoss {
    /// Successful allocations not tracked as live memory (the process's share of the allocation
    /// table used up, or the table full).
    pub allocs_untracked: u64,
    /// Their bytes.
    pub bytes_untracked: u64,
    /// Calls not aggregated: the new row they needed was refused (their cgroup's row quota used
    /// up, or the map full).
    pub calls_unaggregated: u64,
    pub _reserved: u64,
}

const _: () = {
    assert!(core::mem::size_of::<AllocSizeKey>() == 16);
    assert!(core::mem::size_of::<ProbeLoss>() == 32);
    assert!(core::mem::size_of::<AllocSizeVal>() == 16);
    assert!(core::mem::size_of::<StatsKey>() == 16);
    assert!(core::mem::size_of::<ApiStats>() == 40 + 8 * HIST_BUCKETS);
    assert!(core::mem::size_of::<InflightKey>() == 16);
    assert!(core::mem::size_of::<Inflight>() == 48);
    assert!(core::mem::size_of::<AllocKey>() == 16);
    assert!(core::mem::size_of::<AllocVal>() == 16);
    assert!(core::mem::size_of::<LiveMem>() == 16);
    assert!(core::mem::size_of::<NcclStatsKey>() == 24);
    assert!(core::mem::size_of::<NcclInflight>() == 56);
    assert!(core::mem::size_of::<NcclCommKey>() == 16);
    assert!(core::mem::size_of::<NcclCommInfo>() == 24);
    assert!(core::mem::size_of::<SpanEvent>() == 80);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: each type is #[repr(C)], made of integers only, with no implicit padding (sizes are
    // asserted above), so every bit pattern is valid and copying bytes is sound.
    unsafe impl aya::Pod for StatsKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ApiStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for InflightKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Inflight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for AllocKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for AllocVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveMem {}
    // SAFETY: as above.
    unsafe impl aya::Pod for AllocSizeKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for AllocSizeVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for NcclStatsKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for NcclInflight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for NcclCommKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for NcclCommInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SpanEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProbeLoss {}
}
