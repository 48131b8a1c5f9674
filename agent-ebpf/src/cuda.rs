//! The CUDA driver API probes: what the entry probe keeps per call, and what the return probe
//! aggregates (stats, allocation sizes, live allocations and device memory per process).

use agent_common::{
    MemEffect,
    api::{ALLOC_SPACE_HANDLE, ALLOC_SPACE_PTR},
    maps::{AllocKey, AllocSizeKey, AllocVal, ApiStats, Health, Inflight, InflightKey, StatsKey},
};
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::{ProbeContext, RetProbeContext},
};

use crate::{
    maps::{
        ALLOC_QUOTA, ALLOC_SIZES, ALLOCS, INFLIGHT, LIVE, STATS, ZERO_LIVE, ZERO_SIZES, ZERO_STATS,
        global,
    },
    shared::{
        account, add, arg_at, args, cookie_of, count, lose, pick, quota_row, read_user_u64,
        regs_and_sp, row_of,
    },
    span::{Call, maybe_span},
};

#[inline(always)]
pub(crate) fn on_entry(ctx: &ProbeContext) {
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
    if INFLIGHT.insert(&key, &rec, BPF_NOEXIST as u64).is_ok() {
        return;
    }
    // This thread's earlier call of the API is still in flight by the table: its return probe
    // was gone when it returned (a sampling window's edge, the return probe detached first, or
    // not attached yet). That call took a hit no call was counted for.
    // SAFETY: only tests whether the entry exists; nothing is read from it.
    if unsafe { INFLIGHT.get(&key) }.is_some() {
        unpaired_hit(key.pid_tgid, cookie.api());
    }
    if INFLIGHT.insert(&key, &rec, BPF_ANY as u64).is_err() {
        count(Health::InflightDropped);
    }
}

#[inline(always)]
fn live_add(tgid: u32, bytes: u64, allocations: u64) {
    if let Some(p) = row_of(&LIVE, &tgid, &ZERO_LIVE) {
        // SAFETY: `p` is a live map value; fields are only changed by atomic adds.
        unsafe {
            add(&raw mut (*p).bytes, bytes);
            add(&raw mut (*p).allocations, allocations);
        }
    }
}

/// Counts a successful allocation in its size class.
#[inline(always)]
fn size_class(cgroup_id: u64, tgid: u32, api: u16, bytes: u64) {
    let log2 = if bytes == 0 {
        0
    } else {
        (63 - bytes.leading_zeros()) as u8
    };
    let key = AllocSizeKey {
        cgroup_id,
        tgid,
        api,
        log2,
        _pad: 0,
    };
    let row = quota_row(
        &ALLOC_SIZES,
        &key,
        &ZERO_SIZES,
        cgroup_id,
        tgid,
        Health::StatsDropped,
    );
    if let Some(row) = row {
        // SAFETY: `row` is a live map value; its fields are only changed by atomic adds.
        unsafe {
            add(&raw mut (*row).count, 1);
            add(&raw mut (*row).bytes, bytes);
        }
    }
}

/// Records a new live allocation. Bytes reach `LIVE` only once the `ALLOCS` entry exists. A
/// process holds at most `ALLOC_QUOTA` entries (its live allocations in `LIVE`), so that one
/// process cannot fill the table for all; an allocation past it, or one the full table has no
/// room for, is counted for its process (`LOSSES`) and in `HEALTH`, and not tracked.
#[inline(always)]
fn track(tgid: u32, space: u32, addr: u64, bytes: u64, api: u16) {
    let key = AllocKey { tgid, space, addr };
    // SAFETY: the value is copied out before any other map operation on this key.
    let stale = unsafe { ALLOCS.get(&key) }.map(|v| v.bytes);
    if stale.is_none() {
        let Some(live) = row_of(&LIVE, &tgid, &ZERO_LIVE) else {
            count(Health::AllocTableFull);
            lose(tgid, 1, bytes, 0);
            return;
        };
        // SAFETY: a live map value changed only by atomic adds; a stale read lets a few entries
        // past the quota (one per CPU racing), never many.
        let held = unsafe { core::ptr::read_volatile(&raw const (*live).allocations) };
        if held >= global(&ALLOC_QUOTA) {
            count(Health::AllocQuota);
            lose(tgid, 1, bytes, 0);
            return;
        }
    }
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
        lose(tgid, 1, bytes, 0);
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

/// Counts a return whose entry the probes missed on its process's row: the call took a hit
/// (the agent charges it) but has no latency to aggregate.
#[inline(always)]
fn unpaired_hit(pid_tgid: u64, api: u16) {
    // SAFETY: reads the current task's cgroup id; no memory is touched.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if let Some(row) = stats_row(cgroup_id, (pid_tgid >> 32) as u32, api) {
        // SAFETY: `row` is a live map value; its fields are only changed by atomic adds.
        unsafe { add(&raw mut (*row).unpaired, 1) };
    }
}

/// The aggregation row of a process's calls of an API in a cgroup, made if its cgroup's row
/// quota allows (see `quota_row`).
#[inline(always)]
fn stats_row(cgroup_id: u64, tgid: u32, api: u16) -> Option<*mut ApiStats> {
    let skey = StatsKey {
        cgroup_id,
        tgid,
        api,
        _pad: 0,
    };
    quota_row(
        &STATS,
        &skey,
        &ZERO_STATS,
        cgroup_id,
        tgid,
        Health::StatsDropped,
    )
}

#[inline(always)]
pub(crate) fn on_return(ctx: &RetProbeContext) {
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
        unpaired_hit(pid_tgid, cookie.api());
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
    // SAFETY: reads the current task's cgroup id; no memory is touched.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    match cookie.effect() {
        MemEffect::AllocPtr if ok => {
            size_class(cgroup_id, tgid, api, rec.arg);
            if let Some(addr) = read_user_u64(rec.out_ptr) {
                track(tgid, ALLOC_SPACE_PTR, addr, rec.arg, api);
            }
        }
        MemEffect::AllocHandle if ok => {
            size_class(cgroup_id, tgid, api, rec.arg);
            if let Some(handle) = read_user_u64(rec.out_ptr) {
                track(tgid, ALLOC_SPACE_HANDLE, handle, rec.arg, api);
            }
        }
        MemEffect::AllocPitch if ok => {
            if let (Some(addr), Some(pitch)) =
                (read_user_u64(rec.out_ptr), read_user_u64(rec.pitch_ptr))
            {
                bytes = pitch.wrapping_mul(rec.height);
                size_class(cgroup_id, tgid, api, bytes);
                track(tgid, ALLOC_SPACE_PTR, addr, bytes, api);
            }
        }
        MemEffect::FreePtr if ok => bytes = untrack(tgid, ALLOC_SPACE_PTR, rec.arg),
        MemEffect::FreeHandle if ok => bytes = untrack(tgid, ALLOC_SPACE_HANDLE, rec.arg),
        _ => {}
    }

    if let Some(row) = stats_row(cgroup_id, tgid, api) {
        account(row, ok, bytes, now.saturating_sub(rec.start_ns));
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
