//! Helpers shared by the CUDA and NCCL probes: health counters, atomic adds, argument, cookie
//! and user-memory reads, and the aggregation of one call into a stats row.

use agent_common::{
    ProbeCookie,
    api::ArgLoc,
    hist::{HIST_BUCKETS, bucket_of},
    maps::{ApiStats, Health},
};
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_attach_cookie, bpf_probe_read_user},
    maps::HashMap,
    programs::ProbeContext,
};
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use crate::maps::{CGROUP_ROWS, HEALTH, LOSSES, ROW_QUOTA, ZERO_LOSS, global};

#[inline(always)]
pub(crate) fn count(h: Health) {
    if let Some(p) = HEALTH.get_ptr_mut(h as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs (no preemption
        // inside a BPF program), so a plain read-modify-write is race-free.
        unsafe { *p += 1 };
    }
}

/// Atomic add on a map value field shared between CPUs.
#[inline(always)]
pub(crate) fn add(field: *mut u64, v: u64) {
    // SAFETY: `field` points into a map value returned by the kernel for this program run; BPF
    // atomic add is the only kind of write to these fields (userspace only reads), so concurrent
    // adds from other CPUs are safe. Relaxed: readers sum counters and need no ordering with other
    // memory.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(field, v) };
}

/// The row of `key` in a hash map, created (zeroed) if missing. NOEXIST: if another CPU created
/// it first, ours fails and we use theirs. `None`: the map is full.
#[inline(always)]
pub(crate) fn row_of<K, V>(map: &HashMap<K, V>, key: &K, zero: &V) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = map.insert(key, zero, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

/// Counts what a process lost (`LOSSES`): allocations not tracked and their bytes, calls not
/// aggregated.
#[inline(always)]
pub(crate) fn lose(tgid: u32, allocs: u64, bytes: u64, calls: u64) {
    if let Some(p) = row_of(&LOSSES, &tgid, &ZERO_LOSS) {
        // SAFETY: `p` is a live map value; its fields are only changed by atomic adds.
        unsafe {
            if allocs != 0 {
                add(&raw mut (*p).allocs_untracked, allocs);
                add(&raw mut (*p).bytes_untracked, bytes);
            }
            if calls != 0 {
                add(&raw mut (*p).calls_unaggregated, calls);
            }
        }
    }
}

/// The aggregation row of `key` in one of the quota'd maps (`STATS`, `NCCL_STATS`,
/// `ALLOC_SIZES`). A new row counts against its cgroup's rows (`CGROUP_ROWS`) and is refused once
/// the cgroup has `ROW_QUOTA` of them (counted `RowQuota`); a full map is counted as `full`. A
/// refused call is counted for its process in `LOSSES`. An existing row costs one lookup.
#[inline(always)]
pub(crate) fn quota_row<K, V>(
    map: &HashMap<K, V>,
    key: &K,
    zero: &V,
    cgroup_id: u64,
    tgid: u32,
    full: Health,
) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    let Some(rows) = row_of(&CGROUP_ROWS, &cgroup_id, &0u64) else {
        count(Health::RowQuota);
        lose(tgid, 0, 0, 1);
        return None;
    };
    // SAFETY: a live map value, changed only by atomic adds here and whole writes by the agent;
    // a stale read lets a few rows past the quota, never many (one per CPU racing).
    if unsafe { core::ptr::read_volatile(rows) } >= global(&ROW_QUOTA) {
        count(Health::RowQuota);
        lose(tgid, 0, 0, 1);
        return None;
    }
    if map.insert(key, zero, BPF_NOEXIST as u64).is_ok() {
        add(rows, 1);
    }
    match map.get_ptr_mut(key) {
        Some(p) => Some(p),
        None => {
            count(full);
            lose(tgid, 0, 0, 1);
            None
        }
    }
}

/// The first five integer arguments (x86-64 SysV: rdi, rsi, rdx, rcx, r8).
///
/// Volatile loads at constant offsets: with a variable argument index the compiler would compute
/// a pointer into the context, which the verifier rejects ("dereference of modified ctx ptr").
#[inline(always)]
pub(crate) fn args(ctx: &ProbeContext) -> [u64; 5] {
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
pub(crate) fn pick(args: &[u64; 5], n: u8) -> u64 {
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
pub(crate) fn cookie_of<C: EbpfContext>(ctx: &C) -> ProbeCookie {
    // SAFETY: the helper only reads the attach cookie of the running program's link.
    ProbeCookie(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) })
}

#[inline(always)]
pub(crate) fn read_user_u64(addr: u64) -> Option<u64> {
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

/// Adds one call to an aggregation row.
#[inline(always)]
pub(crate) fn account(row: *mut ApiStats, ok: bool, bytes: u64, latency: u64) {
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
pub(crate) fn regs_and_sp(ctx: &ProbeContext) -> ([u64; 6], u64) {
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
pub(crate) fn arg_at(regs: &[u64; 6], sp: u64, loc: ArgLoc) -> u64 {
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
