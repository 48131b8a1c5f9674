//! What a read of a region returns: plain copies, validated, with what could not be read
//! consistently named rather than hidden.

use agent_common::api::ApiId;
use agent_common::hist::HIST_BUCKETS;

use super::file::Geometry;

/// Container-wide state of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSnapshot {
    /// Memory limit in bytes (0 = unlimited).
    pub memory_limit: u64,
    /// SM limit in percent (0 or 100 = unlimited; clamped to 100).
    pub sm_limit: u8,
    /// Bytes reserved container-wide.
    pub reserved: u64,
    /// Highest reservation seen.
    pub peak_reserved: u64,
    /// Reservations denied.
    pub denied: u64,
    /// Bytes returned by reclaiming dead processes' slots.
    pub reclaimed_bytes: u64,
    /// The container's QoS tier on the device and its allocation (`None`: no tier, or a word
    /// that does not decode to one).
    pub qos: Option<crate::sm_share::QosState>,
}

/// Per-API statistics of a process, merged over its consistent shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiStats {
    /// The API.
    pub api: ApiId,
    /// Calls.
    pub calls: u64,
    /// Failed calls.
    pub errors: u64,
    /// Sum of latencies, ns.
    pub latency_ns: u64,
    /// Limiter self-time, ns.
    pub hook_ns: u64,
    /// Bytes allocated.
    pub bytes_allocated: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
    /// Allocations denied.
    pub denied: u64,
    /// Bytes of denied allocations.
    pub denied_bytes: u64,
    /// Bytes copied (layout 3.2 and later; 0 before).
    pub bytes_moved: u64,
    /// Log2 latency histogram (`agent_common::hist`).
    pub histogram: [u64; HIST_BUCKETS],
}

/// GPU time the limiter measured with sampled event pairs (layout 3.3; zero before), summed over
/// a process's shards: of one device, or of one kernel name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuTimeStats {
    /// GPU time of all launches, estimated (each sample's time x the launches it stands for), ns.
    pub estimated_ns: u64,
    /// GPU time of the sampled launches, ns.
    pub sampled_ns: u64,
    /// Samples.
    pub samples: u64,
    /// Launches the samples stand for.
    pub launches: u64,
}

impl GpuTimeStats {
    /// Adds counters in `GpuTimeCounters` order.
    pub(super) fn add(&mut self, words: &[u64]) {
        for (t, &v) in [
            &mut self.estimated_ns,
            &mut self.sampled_ns,
            &mut self.samples,
            &mut self.launches,
        ]
        .into_iter()
        .zip(words)
        {
            *t = t.wrapping_add(v);
        }
    }
}

/// One kernel name's GPU time in a process (its entries of every shard merged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelStats {
    /// The entry's name hash (`crate::kernel_name_hash` of the whole name).
    pub name_hash: u64,
    /// The name's first bytes as the tenant's driver gave them (at most 64, NUL cut): untrusted,
    /// to be sanitised before display. Empty for the other kernels.
    pub name: Vec<u8>,
    /// Bytes of the whole name (more than `name` holds: cut).
    pub name_len: u64,
    /// The kernels that found no entry of their own, summed.
    pub other: bool,
    /// Their GPU time.
    pub time: GpuTimeStats,
}

/// Why a shard could not be read consistently (it is left out of the merged statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardProblemKind {
    /// The sequence stayed odd: its writer is stalled or died mid-update.
    Stuck,
    /// The sequence kept changing for every attempt (a very busy writer).
    Busy,
}

/// A shard left out of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardProblem {
    /// Shard index within the slot.
    pub shard: usize,
    /// What happened.
    pub kind: ShardProblemKind,
    /// Pid of the slot's owner.
    pub pid: u32,
    /// Thread id that owns the shard (0 for the overflow shard or a free shard).
    pub tid: u64,
    /// The last sequence value seen.
    pub seq: u64,
}

/// State of a slot as a reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotPhase {
    /// Being set up by its claimer.
    Claiming,
    /// Owned by a process.
    Live,
    /// A writer is returning a dead owner's holdings.
    Reclaiming,
}

/// One non-free slot.
/// An allocation waiting for device memory, as a slot says (the tenant's words, unchecked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomWait {
    /// The device index the tenant wrote (not checked against the region's devices).
    pub device: u64,
    /// Bytes it waits for (not 0).
    pub bytes: u64,
    /// The wait's number: tells one wait of the process from the next.
    pub seq: u64,
}

/// A process's in-process freeze, as its slot says (layout 3.6; the tenant's words, unchecked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnFreezeSlot {
    pub state: crate::OwnFreeze,
    /// Device bytes the limiter backs (running) or holds in host memory (frozen).
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// Slot index.
    pub index: u32,
    /// Phase.
    pub phase: SlotPhase,
    /// Owner pid in the owner's pid namespace (the reclaimer's pid while reclaiming).
    pub pid: u32,
    /// Owner start time (clock ticks since boot).
    pub start_time: u64,
    /// Owner's pid-namespace inode.
    pub pid_ns: u64,
    /// Whether the owner runs, when the reader shares its pid namespace (`None` otherwise).
    pub alive: Option<bool>,
    /// Command name.
    pub name: String,
    /// Bytes held per device (`device_count` entries).
    pub held: Vec<u64>,
    /// Context bytes held per device (`device_count` entries).
    pub context_bytes: Vec<u64>,
    /// Context charge refused per device (0: none; `device_count` entries): the limit had no
    /// room for it, so the process's allocations there are refused.
    pub context_refused: Vec<u64>,
    /// Records dropped because the overflow shard was busy.
    pub dropped_records: u64,
    /// The allocation the process waits for device memory for (`VGPU_OOM_WAIT`), if any
    /// (layout 3.5). The tenant's words, unchecked.
    pub oom_wait: Option<OomWait>,
    /// The process's in-process freeze (`VGPU_FREEZE_IN_PROCESS`), `None` when the path is off
    /// (layout 3.6).
    pub own_freeze: Option<OwnFreezeSlot>,
    /// Time throttled, ns, over consistent shards.
    pub throttled_ns: u64,
    /// Per-API statistics over consistent shards (APIs with any activity only).
    pub apis: Vec<ApiStats>,
    /// Shards left out.
    pub shard_problems: Vec<ShardProblem>,
    /// GPU time the limiter measured per device (`device_count` entries; layout 3.3, zero
    /// before).
    pub gpu_time: Vec<GpuTimeStats>,
    /// Sampled event pairs whose event calls failed.
    pub sample_errors: u64,
    /// Samples not taken (too many pending, or a capturing stream).
    pub samples_skipped: u64,
    /// GPU time per kernel name (layout 3.3), largest estimated time first.
    pub kernels: Vec<KernelStats>,
}

/// Counters of how hard the snapshot was to take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounters {
    /// Failed seqlock attempts that were retried.
    pub seqlock_retries: u64,
    /// Shards left out as stuck or busy.
    pub shards_skipped: u64,
    /// Slots re-read because their state changed during the read.
    pub slot_rereads: u64,
    /// Slots left out because their state kept changing.
    pub slots_skipped: u64,
}

/// Which part of a [`super::ReadBudget`] ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetLimit {
    /// The wall time.
    Time,
    /// The retries.
    Retries,
}

/// What a snapshot left unread because its [`super::ReadBudget`] ran out: the slots from
/// `first_slot` on were not read (their state words were, to count them); the slot the budget
/// ran out in is one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unread {
    /// What ran out.
    pub limit: BudgetLimit,
    /// The first slot not read (the one being read when the budget ran out).
    pub first_slot: u32,
    /// Non-free slots from `first_slot` on that were not read.
    pub slots: u32,
}

/// A consistent-per-shard view of a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSnapshot {
    /// Geometry.
    pub geometry: Geometry,
    /// Initialiser pid.
    pub creator_pid: u32,
    /// Initialiser's pid-namespace inode.
    pub creator_pid_ns: u64,
    /// Whether this reader runs in that pid namespace (only then is `alive` judged).
    pub same_pid_namespace: bool,
    /// Initialisation time, `CLOCK_REALTIME` ns.
    pub created_at_unix_ns: u64,
    /// Initialiser takeovers.
    pub init_takeovers: u64,
    /// The idle time, in ms, after which the container asks to be frozen (0: none).
    pub freeze_after_ms: u64,
    /// Per device (`device_count` entries).
    pub devices: Vec<DeviceSnapshot>,
    /// Non-free slots.
    pub slots: Vec<SlotSnapshot>,
    /// Read effort.
    pub counters: ReadCounters,
    /// What the read budget left unread (`None`: the whole region was read).
    pub unread: Option<Unread>,
}
