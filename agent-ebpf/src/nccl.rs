//! The NCCL probes: per-communicator call aggregation, and the communicators that
//! ncclCommInit* calls create (with NCCL's communicator id, hashed from the `ncclUniqueId` at
//! entry, so the ranks of one communicator in different processes share it) and ncclCommDestroy
//! marks destroyed.

use agent_common::{
    api::{
        COMM_ID_START, NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_WORDS, NcclOp, UniqueIdAt,
        comm_id_digest, comm_id_word, nccl_datatype_size,
    },
    maps::{
        ApiStats, Health, InflightKey, NCCL_INIT_ALL_MAX, NcclCommInfo, NcclCommKey, NcclInflight,
        NcclStatsKey,
    },
};
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_user_buf,
    },
    programs::{ProbeContext, RetProbeContext},
};

use crate::{
    maps::{NCCL_COMMS, NCCL_INFLIGHT, NCCL_STATS, ZERO_STATS},
    shared::{account, add, arg_at, cookie_of, count, quota_row, read_user_u64, regs_and_sp},
    span::{Call, maybe_span},
};

/// NCCL's communicator id of the `ncclUniqueId` at `addr` in user memory (`api::comm_id_of`);
/// 0 if it cannot be read. Runs once per communicator creation.
#[inline(always)]
fn comm_id_at(addr: u64) -> u64 {
    let mut id = [0u64; NCCL_UNIQUE_ID_WORDS];
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling into a buffer of
    // the length given (the id's 128 bytes, as 16 words); a bad address returns an error instead
    // of faulting.
    let read = unsafe {
        bpf_probe_read_user_buf(
            addr as *const u8,
            core::slice::from_raw_parts_mut(id.as_mut_ptr().cast::<u8>(), NCCL_UNIQUE_ID_BYTES),
        )
    };
    if addr == 0 || read.is_err() {
        count(Health::UserReadFailed);
        return 0;
    }
    let mut acc = COMM_ID_START;
    for w in id {
        // The words as NCCL reads them: little-endian, which is this machine's order.
        acc = comm_id_word(acc, u64::from_le(w));
    }
    comm_id_digest(acc)
}

#[inline(always)]
pub(crate) fn on_nccl_entry(ctx: &ProbeContext) {
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
        comm_id: 0,
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
            rec.comm_id = match cookie.nccl_unique_id() {
                Some(UniqueIdAt::ByValue) => comm_id_at(sp.wrapping_add(8)),
                Some(UniqueIdAt::Pointer(l)) => comm_id_at(arg_at(&regs, sp, l)),
                None => 0,
            };
        }
        NcclOp::InitAll => {
            rec.out_ptr = regs[0];
            rec.nranks = regs[1] as u32;
        }
        NcclOp::Call | NcclOp::Destroy => {}
    }
    // SAFETY: reads the monotonic clock; no memory is touched.
    rec.start_ns = unsafe { bpf_ktime_get_ns() };
    if NCCL_INFLIGHT.insert(&key, &rec, BPF_NOEXIST as u64).is_ok() {
        return;
    }
    // This thread's earlier call of the API is still in flight by the table: its return probe
    // was gone when it returned (a sampling window's edge). That call took a hit no call was
    // counted for, on its own communicator's row.
    // SAFETY: the earlier record is copied out before it is replaced.
    if let Some(earlier) = unsafe { NCCL_INFLIGHT.get(&key) }.copied() {
        unpaired_nccl_hit(key.pid_tgid, cookie.api(), earlier.comm);
    }
    if NCCL_INFLIGHT.insert(&key, &rec, BPF_ANY as u64).is_err() {
        count(Health::InflightDropped);
    }
}

/// Counts a hit no call was counted for on the row of its process, API and communicator (0 for a
/// return whose entry, and so whose communicator, was not seen: a row no communicator shows).
#[inline(always)]
fn unpaired_nccl_hit(pid_tgid: u64, api: u16, comm: u64) {
    // SAFETY: reads the current task's cgroup id; no memory is touched.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if let Some(row) = nccl_row(cgroup_id, (pid_tgid >> 32) as u32, api, comm) {
        // SAFETY: `row` is a live map value; its fields are only changed by atomic adds.
        unsafe { add(&raw mut (*row).unpaired, 1) };
    }
}

/// The aggregation row of a process's calls of an NCCL API on a communicator in a cgroup, made
/// if its cgroup's row quota allows (see `quota_row`).
#[inline(always)]
fn nccl_row(cgroup_id: u64, tgid: u32, api: u16, comm: u64) -> Option<*mut ApiStats> {
    let skey = NcclStatsKey {
        cgroup_id,
        tgid,
        api,
        _pad: 0,
        comm,
    };
    quota_row(
        &NCCL_STATS,
        &skey,
        &ZERO_STATS,
        cgroup_id,
        tgid,
        Health::NcclDropped,
    )
}

#[inline(always)]
fn comm_created(tgid: u32, comm: u64, rank: u32, nranks: u32, api: u16, comm_id: u64) {
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
        comm_id,
    };
    if NCCL_COMMS.insert(&key, &info, BPF_ANY as u64).is_err() {
        count(Health::NcclDropped);
    }
}

#[inline(always)]
pub(crate) fn on_nccl_return(ctx: &RetProbeContext) {
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
        unpaired_nccl_hit(pid_tgid, cookie.api(), 0);
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
                comm_created(tgid, c, rec.rank, rec.nranks, api, rec.comm_id);
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
                    comm_created(tgid, c, i, rec.nranks, api, 0);
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
    if let Some(row) = nccl_row(cgroup_id, tgid, api, comm) {
        account(row, ok, rec.bytes, now.saturating_sub(rec.start_ns));
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
