//! The agent's eBPF programs: entry and return uprobes on libcuda's exported driver API.
//!
//! One program pair per [`ApiKind`], in two flavours: `uprobe.multi` (one link for all symbols of a
//! library, used where the kernel has uprobe_multi) and plain `uprobe` (one perf link per symbol).
//! Every probe carries a [`ProbeCookie`] that names the API and where its size, out-pointer and
//! freed address are, so the programs are generic. Aggregation happens here, in the kernel: per
//! (cgroup, process, API) call and error counts, bytes and a log2 latency histogram, plus live
//! device memory per process. Userspace only reads the maps.
//!
//! NCCL (`libnccl.so.2`) has its own pair (`nccl_*`): its cookie also says where the element
//! count, datatype and communicator are (a register or a stack slot), and calls are aggregated
//! per (cgroup, process, API, communicator) in `NCCL_STATS`; communicators created by a
//! successful ncclCommInit* call are recorded with their rank and size in `NCCL_COMMS`.
//!
//! Span events: when userspace turns tracing on (`TRACE_ON`, a global set at load time), return
//! probes also write a [`SpanEvent`] to the `SPANS` ring buffer for every NCCL call, every call
//! slower than `TRACE_SLOW_NS`, and one in `TRACE_SAMPLE_EVERY` of the other calls (per CPU).
//! Where the API takes a stream (the cookie says where), the entry probe keeps it for the span.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use agent_common::{
    MemEffect, ProbeCookie,
    api::{ALLOC_SPACE_HANDLE, ALLOC_SPACE_PTR, ArgLoc, NcclOp, nccl_datatype_size},
    hist::{HIST_BUCKETS, bucket_of},
    maps::{
        ALLOC_SIZES_MAX_ENTRIES, ALLOCS_MAX_ENTRIES, AllocKey, AllocSizeKey, AllocSizeVal,
        AllocVal, ApiStats, Health, INFLIGHT_MAX_ENTRIES, Inflight, InflightKey, LIVE_MAX_ENTRIES,
        LiveMem, NCCL_COMMS_MAX_ENTRIES, NCCL_INFLIGHT_MAX_ENTRIES, NCCL_INIT_ALL_MAX,
        NCCL_STATS_MAX_ENTRIES, NcclCommInfo, NcclCommKey, NcclInflight, NcclStatsKey, SPAN_NCCL,
        SPAN_SAMPLED, SPAN_SLOW, SPANS_RING_BYTES, STATS_MAX_ENTRIES, SpanEvent, StatsKey,
    },
};
use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_get_current_comm,
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext},
};
use core::intrinsics::{AtomicOrdering, atomic_xadd};

/// Aggregated calls per (cgroup, process, API). LRU: rows of long-gone processes make room.
#[map]
static STATS: LruHashMap<StatsKey, ApiStats> = LruHashMap::with_max_entries(STATS_MAX_ENTRIES, 0);

/// Calls in flight, per thread and API. LRU: a thread that dies inside a call leaves no leak.
#[map]
static INFLIGHT: LruHashMap<InflightKey, Inflight> =
    LruHashMap::with_max_entries(INFLIGHT_MAX_ENTRIES, 0);

/// Live allocations. A plain hash (not LRU): an entry is never evicted behind the live-bytes
/// figure's back; when full, new allocations are counted in `HEALTH` and not tracked.
#[map]
static ALLOCS: HashMap<AllocKey, AllocVal> = HashMap::with_max_entries(ALLOCS_MAX_ENTRIES, 0);

/// Live device memory per process (the sum of its `ALLOCS` entries).
#[map]
static LIVE: HashMap<u32, LiveMem> = HashMap::with_max_entries(LIVE_MAX_ENTRIES, 0);

/// Successful allocations by process, API and log2 size class.
#[map]
static ALLOC_SIZES: LruHashMap<AllocSizeKey, AllocSizeVal> =
    LruHashMap::with_max_entries(ALLOC_SIZES_MAX_ENTRIES, 0);

/// Per-CPU counters of everything lost or inconsistent, indexed by [`Health`].
#[map]
static HEALTH: PerCpuArray<u64> = PerCpuArray::with_max_entries(Health::COUNT, 0);

/// Aggregated NCCL calls per (cgroup, process, API, communicator).
#[map]
static NCCL_STATS: LruHashMap<NcclStatsKey, ApiStats> =
    LruHashMap::with_max_entries(NCCL_STATS_MAX_ENTRIES, 0);

/// NCCL calls in flight, per thread and API.
#[map]
static NCCL_INFLIGHT: LruHashMap<InflightKey, NcclInflight> =
    LruHashMap::with_max_entries(NCCL_INFLIGHT_MAX_ENTRIES, 0);

/// Communicators created by successful ncclCommInit* calls, per process. LRU: communicators of
/// long-gone processes make room.
#[map]
static NCCL_COMMS: LruHashMap<NcclCommKey, NcclCommInfo> =
    LruHashMap::with_max_entries(NCCL_COMMS_MAX_ENTRIES, 0);

/// Sampled calls for spans (see the module documentation).
#[map]
static SPANS: RingBuf = RingBuf::with_byte_size(SPANS_RING_BYTES, 0);

/// Per-CPU call counter for the 1-in-N sampling.
#[map]
static SAMPLE_COUNTER: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Set by userspace at load time (`EbpfLoader::override_global`): 1 writes span events.
#[unsafe(no_mangle)]
static TRACE_ON: u64 = 0;
/// Calls at least this slow (ns) are always sampled (0: none by latency).
#[unsafe(no_mangle)]
static TRACE_SLOW_NS: u64 = 0;
/// One in this many other calls is sampled (0: none).
#[unsafe(no_mangle)]
static TRACE_SAMPLE_EVERY: u64 = 0;

/// A global as the loader set it (a volatile read: the compiler must not fold the default).
#[inline(always)]
fn global(g: &'static u64) -> u64 {
    // SAFETY: a read of an initialised static in the program's .rodata/.data section.
    unsafe { core::ptr::read_volatile(g) }
}

/// The fields of a span event that the return probes know.
struct Call {
    start_ns: u64,
    end_ns: u64,
    cgroup_id: u64,
    bytes: u64,
    comm: u64,
    stream: u64,
    pid_tgid: u64,
    result: u32,
    api: u16,
}

/// Writes a span event if the call is sampled; a full ring buffer is counted.
#[inline(always)]
fn maybe_span(c: &Call, nccl: bool) {
    if global(&TRACE_ON) == 0 {
        return;
    }
    let slow = global(&TRACE_SLOW_NS);
    let reason = if nccl {
        SPAN_NCCL
    } else if slow != 0 && c.end_ns.saturating_sub(c.start_ns) >= slow {
        SPAN_SLOW
    } else {
        let every = global(&TRACE_SAMPLE_EVERY);
        let Some(n) = SAMPLE_COUNTER.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: per-CPU slot, written only by this CPU while this program runs.
        let v = unsafe {
            *n += 1;
            *n
        };
        if every == 0 || v % every != 0 {
            return;
        }
        SPAN_SAMPLED
    };
    let Some(mut entry) = SPANS.reserve::<SpanEvent>(0) else {
        count(Health::RingFull);
        return;
    };
    let task = bpf_get_current_comm().unwrap_or([0; 16]);
    entry.write(SpanEvent {
        start_ns: c.start_ns,
        end_ns: c.end_ns,
        cgroup_id: c.cgroup_id,
        bytes: c.bytes,
        comm: c.comm,
        stream: c.stream,
        tgid: (c.pid_tgid >> 32) as u32,
        tid: c.pid_tgid as u32,
        result: c.result,
        api: c.api,
        reason,
        _pad: 0,
        task,
    });
    entry.submit(0);
}

/// A zeroed row to insert from: a 344-byte value does not fit the eBPF stack budget comfortably.
static ZERO_STATS: ApiStats = ApiStats::ZERO;
static ZERO_SIZES: AllocSizeVal = AllocSizeVal { count: 0, bytes: 0 };
static ZERO_LIVE: LiveMem = LiveMem {
    bytes: 0,
    allocations: 0,
};

#[inline(always)]
fn count(h: Health) {
    if let Some(p) = HEALTH.get_ptr_mut(h as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs (no preemption
        // inside a BPF program), so a plain read-modify-write is race-free.
        unsafe { *p += 1 };
    }
}

/// Atomic add on a map value field shared between CPUs.
#[inline(always)]
fn add(field: *mut u64, v: u64) {
    // SAFETY: `field` points into a map value returned by the kernel for this program run; BPF
    // atomic add is the only kind of write to these fields (userspace only reads), so concurrent
    // adds from other CPUs are safe. Relaxed: readers sum counters and need no ordering with other
    // memory.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(field, v) };
}

/// The first five integer arguments (x86-64 SysV: rdi, rsi, rdx, rcx, r8).
///
/// Volatile loads at constant offsets: with a variable argument index the compiler would compute
/// a pointer into the context, which the verifier rejects ("dereference of modified ctx ptr").
#[inline(always)]
fn args(ctx: &ProbeContext) -> [u64; 5] {
    let regs = ctx.regs;
    // SAFETY: `regs` is the pt_regs context the kernel passed to this program; each field is read
    // at a constant offset, which the verifier allows.
    unsafe {
        [
            core::ptr::read_volatile(&raw const (*regs).rdi),
            core::ptr::read_volatile(&raw const (*regs).rsi),
            core::ptr::read_volatile(&raw const (*regs).rdx),
            core::ptr::read_volatile(&raw const (*regs).rcx),
            core::ptr::read_volatile(&raw const (*regs).r8),
        ]
    }
}

#[inline(always)]
fn pick(args: &[u64; 5], n: u8) -> u64 {
    match n {
        0 => args[0],
        1 => args[1],
        2 => args[2],
        3 => args[3],
        4 => args[4],
        _ => 0,
    }
}

#[inline(always)]
fn cookie_of<C: EbpfContext>(ctx: &C) -> ProbeCookie {
    // SAFETY: the helper only reads the attach cookie of the running program's link.
    ProbeCookie(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) })
}

#[inline(always)]
fn on_entry(ctx: &ProbeContext) {
    let cookie = cookie_of(ctx);
    let key = InflightKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        api: cookie.api() as u32,
        _pad: 0,
    };
    let a = args(ctx);
    let mut rec = Inflight {
        start_ns: 0,
        arg: 0,
        out_ptr: 0,
        pitch_ptr: 0,
        height: 0,
        stream: 0,
    };
    if let Some(l) = cookie.stream() {
        let (regs, sp) = regs_and_sp(ctx);
        rec.stream = arg_at(&regs, sp, l);
    }
    if let Some(i) = cookie.size_arg() {
        rec.arg = pick(&a, i);
    }
    match cookie.effect() {
        MemEffect::AllocPtr | MemEffect::AllocHandle => rec.out_ptr = a[0],
        MemEffect::AllocPitch => {
            rec.out_ptr = a[0];
            rec.pitch_ptr = a[1];
            rec.height = a[3];
        }
        MemEffect::FreePtr | MemEffect::FreeHandle => rec.arg = a[0],
        MemEffect::None => {}
    }
    // Taken last so the latency excludes this program's own work.
    // SAFETY: reads the monotonic clock; no memory is touched.
    rec.start_ns = unsafe { bpf_ktime_get_ns() };
    if INFLIGHT.insert(&key, &rec, BPF_ANY as u64).is_err() {
        count(Health::InflightDropped);
    }
}

#[inline(always)]
fn read_user_u64(addr: u64) -> Option<u64> {
    if addr == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling; a bad address
    // returns an error instead of faulting.
    match unsafe { bpf_probe_read_user(addr as *const u64) } {
        Ok(v) => Some(v),
        Err(_) => {
            count(Health::UserReadFailed);
            None
        }
    }
}

#[inline(always)]
fn live_add(tgid: u32, bytes: u64, allocations: u64) {
    let mut p = LIVE.get_ptr_mut(&tgid);
    if p.is_none() {
        // NOEXIST: if another CPU created the row first, ours fails and we use theirs.
        let _ = LIVE.insert(&tgid, &ZERO_LIVE, BPF_NOEXIST as u64);
        p = LIVE.get_ptr_mut(&tgid);
    }
    if let Some(p) = p {
        // SAFETY: `p` is a live map value; fields are only changed by atomic adds.
        unsafe {
            add(&raw mut (*p).bytes, bytes);
            add(&raw mut (*p).allocations, allocations);
        }
    }
}

/// Counts a successful allocation in its size class.
#[inline(always)]
fn size_class(tgid: u32, api: u16, bytes: u64) {
    let log2 = if bytes == 0 {
        0
    } else {
        (63 - bytes.leading_zeros()) as u8
    };
    let key = AllocSizeKey {
        tgid,
        api,
        log2,
        _pad: 0,
    };
    let mut row = ALLOC_SIZES.get_ptr_mut(&key);
    if row.is_none() {
        // NOEXIST: if another CPU created the row first, ours fails and we use theirs.
        let _ = ALLOC_SIZES.insert(&key, &ZERO_SIZES, BPF_NOEXIST as u64);
        row = ALLOC_SIZES.get_ptr_mut(&key);
    }
    if let Some(row) = row {
        // SAFETY: `row` is a live map value; its fields are only changed by atomic adds.
        unsafe {
            add(&raw mut (*row).count, 1);
            add(&raw mut (*row).bytes, bytes);
        }
    }
}

/// Records a new live allocation. Bytes reach `LIVE` only once the `ALLOCS` entry exists.
#[inline(always)]
fn track(tgid: u32, space: u32, addr: u64, bytes: u64, api: u16) {
    let key = AllocKey { tgid, space, addr };
    // SAFETY: the value is copied out before any other map operation on this key.
    let stale = unsafe { ALLOCS.get(&key) }.map(|v| v.bytes);
    if ALLOCS
        .insert(
            &key,
            &AllocVal {
                bytes,
                api: api as u32,
                _pad: 0,
            },
            BPF_ANY as u64,
        )
        .is_err()
    {
        count(Health::AllocTableFull);
        return;
    }
    match stale {
        // The address was live in the table: its free was missed. Replace, don't double count.
        Some(old) => live_add(tgid, bytes.wrapping_sub(old), 0),
        None => live_add(tgid, bytes, 1),
    }
}

/// Forgets a freed allocation; returns its size if the table held it.
#[inline(always)]
fn untrack(tgid: u32, space: u32, addr: u64) -> u64 {
    let key = AllocKey { tgid, space, addr };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(bytes) = (unsafe { ALLOCS.get(&key) }).map(|v| v.bytes) else {
        count(Health::FreeUnknown);
        return 0;
    };
    // Only the remover that actually deleted the entry subtracts, so a racing duplicate free
    // cannot subtract twice.
    if ALLOCS.remove(&key).is_ok() {
        live_add(tgid, bytes.wrapping_neg(), u64::MAX);
        bytes
    } else {
        0
    }
}

#[inline(always)]
fn on_return(ctx: &RetProbeContext) {
    // SAFETY: reads the monotonic clock; no memory is touched.
    let now = unsafe { bpf_ktime_get_ns() };
    let cookie = cookie_of(ctx);
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = InflightKey {
        pid_tgid,
        api: cookie.api() as u32,
        _pad: 0,
    };
    // SAFETY: the record is copied out before the entry is removed.
    let Some(rec) = (unsafe { INFLIGHT.get(&key) }).copied() else {
        count(Health::ReturnWithoutEntry);
        return;
    };
    let _ = INFLIGHT.remove(&key);

    let tgid = (pid_tgid >> 32) as u32;
    // CUresult is a C int: only the low 32 bits of rax are defined.
    let result = ctx.ret::<u64>() as u32;
    let ok = result == 0;
    let mut bytes = if cookie.size_arg().is_some() {
        rec.arg
    } else {
        0
    };
    let api = cookie.api();
    match cookie.effect() {
        MemEffect::AllocPtr if ok => {
            size_class(tgid, api, rec.arg);
            if let Some(addr) = read_user_u64(rec.out_ptr) {
                track(tgid, ALLOC_SPACE_PTR, addr, rec.arg, api);
            }
        }
        MemEffect::AllocHandle if ok => {
            size_class(tgid, api, rec.arg);
            if let Some(handle) = read_user_u64(rec.out_ptr) {
                track(tgid, ALLOC_SPACE_HANDLE, handle, rec.arg, api);
            }
        }
        MemEffect::AllocPitch if ok => {
            if let (Some(addr), Some(pitch)) =
                (read_user_u64(rec.out_ptr), read_user_u64(rec.pitch_ptr))
            {
                bytes = pitch.wrapping_mul(rec.height);
                size_class(tgid, api, bytes);
                track(tgid, ALLOC_SPACE_PTR, addr, bytes, api);
            }
        }
        MemEffect::FreePtr if ok => bytes = untrack(tgid, ALLOC_SPACE_PTR, rec.arg),
        MemEffect::FreeHandle if ok => bytes = untrack(tgid, ALLOC_SPACE_HANDLE, rec.arg),
        _ => {}
    }

    // SAFETY: reads the current task's cgroup id; no memory is touched.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let skey = StatsKey {
        cgroup_id,
        tgid,
        api,
        _pad: 0,
    };
    let mut row = STATS.get_ptr_mut(&skey);
    if row.is_none() {
        let _ = STATS.insert(&skey, &ZERO_STATS, BPF_NOEXIST as u64);
        row = STATS.get_ptr_mut(&skey);
    }
    if let Some(row) = row {
        account(row, ok, bytes, now.saturating_sub(rec.start_ns));
    } else {
        count(Health::StatsDropped);
    }
    let call = Call {
        start_ns: rec.start_ns,
        end_ns: now,
        cgroup_id,
        bytes,
        comm: 0,
        stream: rec.stream,
        pid_tgid,
        result,
        api,
    };
    maybe_span(&call, false);
}

/// Adds one call to an aggregation row.
#[inline(always)]
fn account(row: *mut ApiStats, ok: bool, bytes: u64, latency: u64) {
    let bucket = bucket_of(latency);
    // SAFETY: `row` is a live map value; its fields are only changed by atomic adds.
    unsafe {
        add(&raw mut (*row).calls, 1);
        if !ok {
            add(&raw mut (*row).errors, 1);
        }
        add(&raw mut (*row).bytes, bytes);
        add(&raw mut (*row).total_ns, latency);
        if bucket < HIST_BUCKETS {
            add(&raw mut (*row).hist[bucket], 1);
        }
    }
}

/// The six integer argument registers (rdi, rsi, rdx, rcx, r8, r9) and rsp, at entry.
#[inline(always)]
fn regs_and_sp(ctx: &ProbeContext) -> ([u64; 6], u64) {
    let regs = ctx.regs;
    // SAFETY: `regs` is the pt_regs context the kernel passed to this program; each field is read
    // at a constant offset, which the verifier allows.
    unsafe {
        (
            [
                core::ptr::read_volatile(&raw const (*regs).rdi),
                core::ptr::read_volatile(&raw const (*regs).rsi),
                core::ptr::read_volatile(&raw const (*regs).rdx),
                core::ptr::read_volatile(&raw const (*regs).rcx),
                core::ptr::read_volatile(&raw const (*regs).r8),
                core::ptr::read_volatile(&raw const (*regs).r9),
            ],
            core::ptr::read_volatile(&raw const (*regs).rsp),
        )
    }
}

/// An argument at the function's first instruction: a register, or a stack slot above the
/// return address (read from user memory; 0 if that fails).
#[inline(always)]
fn arg_at(regs: &[u64; 6], sp: u64, loc: ArgLoc) -> u64 {
    match loc {
        ArgLoc::Rdi => regs[0],
        ArgLoc::Rsi => regs[1],
        ArgLoc::Rdx => regs[2],
        ArgLoc::Rcx => regs[3],
        ArgLoc::R8 => regs[4],
        ArgLoc::R9 => regs[5],
        ArgLoc::Stack1 => read_user_u64(sp.wrapping_add(8)).unwrap_or(0),
        ArgLoc::Stack2 => read_user_u64(sp.wrapping_add(16)).unwrap_or(0),
        ArgLoc::Stack3 => read_user_u64(sp.wrapping_add(24)).unwrap_or(0),
    }
}

#[inline(always)]
fn on_nccl_entry(ctx: &ProbeContext) {
    let cookie = cookie_of(ctx);
    let key = InflightKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        api: cookie.api() as u32,
        _pad: 0,
    };
    let (regs, sp) = regs_and_sp(ctx);
    let mut rec = NcclInflight {
        start_ns: 0,
        bytes: 0,
        comm: 0,
        out_ptr: 0,
        nranks: 0,
        rank: 0,
        stream: 0,
    };
    if let Some(l) = cookie.stream() {
        rec.stream = arg_at(&regs, sp, l);
    }
    if let (Some(c), Some(d)) = (cookie.nccl_count(), cookie.nccl_datatype()) {
        let elements = arg_at(&regs, sp, c);
        // ncclDataType_t is a C enum (int): only the low 32 bits are defined.
        match nccl_datatype_size(arg_at(&regs, sp, d) as u32) {
            Some(size) => rec.bytes = elements.wrapping_mul(size),
            None => count(Health::NcclUnknownDatatype),
        }
    }
    if let Some(l) = cookie.nccl_comm() {
        rec.comm = arg_at(&regs, sp, l);
    }
    match cookie.nccl_op() {
        NcclOp::InitOne => {
            rec.out_ptr = regs[0];
            rec.nranks = regs[1] as u32;
            rec.rank = regs[2] as u32;
        }
        NcclOp::InitAll => {
            rec.out_ptr = regs[0];
            rec.nranks = regs[1] as u32;
        }
        NcclOp::Call | NcclOp::Destroy => {}
    }
    // SAFETY: reads the monotonic clock; no memory is touched.
    rec.start_ns = unsafe { bpf_ktime_get_ns() };
    if NCCL_INFLIGHT.insert(&key, &rec, BPF_ANY as u64).is_err() {
        count(Health::InflightDropped);
    }
}

#[inline(always)]
fn comm_created(tgid: u32, comm: u64, rank: u32, nranks: u32, api: u16) {
    let key = NcclCommKey {
        tgid,
        _pad: 0,
        comm,
    };
    let info = NcclCommInfo {
        rank,
        nranks,
        init_api: api,
        destroyed: 0,
        _pad: 0,
    };
    if NCCL_COMMS.insert(&key, &info, BPF_ANY as u64).is_err() {
        count(Health::NcclDropped);
    }
}

#[inline(always)]
fn on_nccl_return(ctx: &RetProbeContext) {
    // SAFETY: reads the monotonic clock; no memory is touched.
    let now = unsafe { bpf_ktime_get_ns() };
    let cookie = cookie_of(ctx);
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = InflightKey {
        pid_tgid,
        api: cookie.api() as u32,
        _pad: 0,
    };
    // SAFETY: the record is copied out before the entry is removed.
    let Some(rec) = (unsafe { NCCL_INFLIGHT.get(&key) }).copied() else {
        count(Health::ReturnWithoutEntry);
        return;
    };
    let _ = NCCL_INFLIGHT.remove(&key);

    let tgid = (pid_tgid >> 32) as u32;
    // ncclResult_t is a C enum: only the low 32 bits of rax are defined; ncclSuccess is 0.
    let result = ctx.ret::<u64>() as u32;
    let ok = result == 0;
    let api = cookie.api();
    let mut comm = rec.comm;
    match cookie.nccl_op() {
        NcclOp::InitOne if ok => {
            if let Some(c) = read_user_u64(rec.out_ptr) {
                comm = c;
                comm_created(tgid, c, rec.rank, rec.nranks, api);
            }
        }
        NcclOp::InitAll if ok => {
            for i in 0..NCCL_INIT_ALL_MAX {
                if i >= rec.nranks {
                    break;
                }
                if let Some(c) = read_user_u64(rec.out_ptr.wrapping_add(8 * i as u64))
                    && c != 0
                {
                    comm_created(tgid, c, i, rec.nranks, api);
                }
            }
        }
        NcclOp::Destroy if ok => {
            let ckey = NcclCommKey {
                tgid,
                _pad: 0,
                comm,
            };
            if let Some(info) = NCCL_COMMS.get_ptr_mut(&ckey) {
                // SAFETY: a live map value; a racing writer can only store the same 1.
                unsafe { core::ptr::write_volatile(&raw mut (*info).destroyed, 1) };
            }
        }
        _ => {}
    }

    // SAFETY: reads the current task's cgroup id; no memory is touched.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let skey = NcclStatsKey {
        cgroup_id,
        tgid,
        api,
        _pad: 0,
        comm,
    };
    let mut row = NCCL_STATS.get_ptr_mut(&skey);
    if row.is_none() {
        let _ = NCCL_STATS.insert(&skey, &ZERO_STATS, BPF_NOEXIST as u64);
        row = NCCL_STATS.get_ptr_mut(&skey);
    }
    if let Some(row) = row {
        account(row, ok, rec.bytes, now.saturating_sub(rec.start_ns));
    } else {
        count(Health::NcclDropped);
    }
    let call = Call {
        start_ns: rec.start_ns,
        end_ns: now,
        cgroup_id,
        bytes: rec.bytes,
        comm,
        stream: rec.stream,
        pid_tgid,
        result,
        api,
    };
    maybe_span(&call, true);
}

/// Declares the entry/return pair of one API kind in both attach flavours.
macro_rules! kind_programs {
    ($entry:ident, $ret:ident, $entry_multi:ident, $ret_multi:ident) => {
        kind_programs!($entry, $ret, $entry_multi, $ret_multi; on_entry, on_return);
    };
    ($entry:ident, $ret:ident, $entry_multi:ident, $ret_multi:ident; $on_entry:ident, $on_return:ident) => {
        #[uprobe]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            $on_entry(&ctx);
            0
        }
        #[uretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            $on_return(&ctx);
            0
        }
        #[uprobe(multi)]
        pub fn $entry_multi(ctx: ProbeContext) -> u32 {
            $on_entry(&ctx);
            0
        }
        #[uretprobe(multi)]
        pub fn $ret_multi(ctx: RetProbeContext) -> u32 {
            $on_return(&ctx);
            0
        }
    };
}

kind_programs!(
    alloc_entry,
    alloc_return,
    alloc_entry_multi,
    alloc_return_multi
);
kind_programs!(free_entry, free_return, free_entry_multi, free_return_multi);
kind_programs!(sync_entry, sync_return, sync_entry_multi, sync_return_multi);
kind_programs!(copy_entry, copy_return, copy_entry_multi, copy_return_multi);
kind_programs!(
    launch_entry,
    launch_return,
    launch_entry_multi,
    launch_return_multi
);
kind_programs!(
    lifecycle_entry,
    lifecycle_return,
    lifecycle_entry_multi,
    lifecycle_return_multi
);
kind_programs!(
    nccl_entry,
    nccl_return,
    nccl_entry_multi,
    nccl_return_multi;
    on_nccl_entry,
    on_nccl_return
);
// The agent's own calibration target (see agent/src/probes/calibrate.rs).
kind_programs!(
    calib_entry,
    calib_return,
    calib_entry_multi,
    calib_return_multi
);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
