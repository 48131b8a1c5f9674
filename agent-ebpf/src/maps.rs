//! The maps userspace reads, the globals it sets at load time, and the zeroed rows that new map
//! entries are inserted from.

use agent_common::maps::{
    ALLOC_QUOTA_DEFAULT, ALLOC_SIZES_MAX_ENTRIES, ALLOCS_MAX_ENTRIES, AllocKey, AllocSizeKey,
    AllocSizeVal, AllocVal, ApiStats, CGROUP_ROWS_MAX_ENTRIES, Health, INFLIGHT_MAX_ENTRIES,
    Inflight, InflightKey, LIVE_MAX_ENTRIES, LOSSES_MAX_ENTRIES, LiveMem, NCCL_COMMS_MAX_ENTRIES,
    NCCL_INFLIGHT_MAX_ENTRIES, NCCL_STATS_MAX_ENTRIES, NcclCommInfo, NcclCommKey, NcclInflight,
    NcclStatsKey, ProbeLoss, ROW_QUOTA_DEFAULT, SPANS_RING_BYTES, STATS_MAX_ENTRIES, StatsKey,
};
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
};

/// Aggregated calls per (cgroup, process, API). A plain hash (not LRU): a row is never evicted
/// behind its counters' back; a new row counts against its cgroup's `ROW_QUOTA`, and one that
/// finds no room is counted (`HEALTH`, `LOSSES`). The agent removes exited processes' rows.
#[map]
pub(crate) static STATS: HashMap<StatsKey, ApiStats> =
    HashMap::with_max_entries(STATS_MAX_ENTRIES, 0);

/// Rows per cgroup in `STATS`, `NCCL_STATS` and `ALLOC_SIZES` together: added to by the probes
/// when they create a row, recounted by the agent when it removes rows.
#[map]
pub(crate) static CGROUP_ROWS: HashMap<u64, u64> =
    HashMap::with_max_entries(CGROUP_ROWS_MAX_ENTRIES, 0);

/// What the probes could not record, per process (created on the first loss).
#[map]
pub(crate) static LOSSES: HashMap<u32, ProbeLoss> =
    HashMap::with_max_entries(LOSSES_MAX_ENTRIES, 0);

/// Calls in flight, per thread and API. LRU: a thread that dies inside a call leaves no leak.
#[map]
pub(crate) static INFLIGHT: LruHashMap<InflightKey, Inflight> =
    LruHashMap::with_max_entries(INFLIGHT_MAX_ENTRIES, 0);

/// Live allocations. A plain hash (not LRU): an entry is never evicted behind the live-bytes
/// figure's back; when full, new allocations are counted in `HEALTH` and not tracked.
#[map]
pub(crate) static ALLOCS: HashMap<AllocKey, AllocVal> =
    HashMap::with_max_entries(ALLOCS_MAX_ENTRIES, 0);

/// Live device memory per process (the sum of its `ALLOCS` entries); `allocations` is also what
/// its share of `ALLOCS` (`ALLOC_QUOTA`) is checked against.
#[map]
pub(crate) static LIVE: HashMap<u32, LiveMem> = HashMap::with_max_entries(LIVE_MAX_ENTRIES, 0);

/// Successful allocations by process, API and log2 size class (under the row quota, as `STATS`).
#[map]
pub(crate) static ALLOC_SIZES: HashMap<AllocSizeKey, AllocSizeVal> =
    HashMap::with_max_entries(ALLOC_SIZES_MAX_ENTRIES, 0);

/// Per-CPU counters of everything lost or inconsistent, indexed by [`Health`].
#[map]
pub(crate) static HEALTH: PerCpuArray<u64> = PerCpuArray::with_max_entries(Health::COUNT, 0);

/// Aggregated NCCL calls per (cgroup, process, API, communicator) (under the row quota, as
/// `STATS`: a tenant naming ever new communicators cannot evict anyone's rows).
#[map]
pub(crate) static NCCL_STATS: HashMap<NcclStatsKey, ApiStats> =
    HashMap::with_max_entries(NCCL_STATS_MAX_ENTRIES, 0);

/// NCCL calls in flight, per thread and API.
#[map]
pub(crate) static NCCL_INFLIGHT: LruHashMap<InflightKey, NcclInflight> =
    LruHashMap::with_max_entries(NCCL_INFLIGHT_MAX_ENTRIES, 0);

/// Communicators created by successful ncclCommInit* calls, per process. LRU: communicators of
/// long-gone processes make room.
#[map]
pub(crate) static NCCL_COMMS: LruHashMap<NcclCommKey, NcclCommInfo> =
    LruHashMap::with_max_entries(NCCL_COMMS_MAX_ENTRIES, 0);

/// Sampled calls for spans (see the crate documentation).
#[map]
pub(crate) static SPANS: RingBuf = RingBuf::with_byte_size(SPANS_RING_BYTES, 0);

/// Per-CPU call counter for the 1-in-N sampling.
#[map]
pub(crate) static SAMPLE_COUNTER: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Set by userspace at load time (`EbpfLoader::override_global`): 1 writes span events.
#[unsafe(no_mangle)]
pub(crate) static TRACE_ON: u64 = 0;
/// Calls at least this slow (ns) are always sampled (0: none by latency).
#[unsafe(no_mangle)]
pub(crate) static TRACE_SLOW_NS: u64 = 0;
/// One in this many other calls is sampled (0: none).
#[unsafe(no_mangle)]
pub(crate) static TRACE_SAMPLE_EVERY: u64 = 0;
/// Live allocations tracked per process at most (its share of `ALLOCS`).
#[unsafe(no_mangle)]
pub(crate) static ALLOC_QUOTA: u64 = ALLOC_QUOTA_DEFAULT;
/// Rows per cgroup at most in `STATS`, `NCCL_STATS` and `ALLOC_SIZES` together.
#[unsafe(no_mangle)]
pub(crate) static ROW_QUOTA: u64 = ROW_QUOTA_DEFAULT;

/// A global as the loader set it (a volatile read: the compiler must not fold the default).
#[inline(always)]
pub(crate) fn global(g: &'static u64) -> u64 {
    // SAFETY: a read of an initialised static in the program's .rodata/.data section.
    unsafe { core::ptr::read_volatile(g) }
}

/// A zeroed row to insert from: a 344-byte value does not fit the eBPF stack budget comfortably.
pub(crate) static ZERO_STATS: ApiStats = ApiStats::ZERO;
pub(crate) static ZERO_SIZES: AllocSizeVal = AllocSizeVal { count: 0, bytes: 0 };
pub(crate) static ZERO_LIVE: LiveMem = LiveMem {
    bytes: 0,
    allocations: 0,
};
pub(crate) static ZERO_LOSS: ProbeLoss = ProbeLoss {
    allocs_untracked: 0,
    bytes_untracked: 0,
    calls_unaggregated: 0,
    _reserved: 0,
};
