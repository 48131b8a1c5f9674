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

mod cuda;
mod maps;
mod nccl;
mod shared;
mod span;

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use cuda::{on_entry, on_return};
use nccl::{on_nccl_entry, on_nccl_return};

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
