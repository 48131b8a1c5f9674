//! Cache hints: what an allocation or a free prefetches, and where its code and data are laid
//! out, so that a call that finds its caches cold costs few dependent misses. Every hint of the
//! hooks is here; the hooks' logic only calls these functions at the points they name.
//!
//! **Why.** On the GPU machine every allocation and free enters the limiter with its caches and
//! TLB cold: with several processes on a GPU the driver serialises their calls and each thread
//! sleeps in the driver, so its lines are evicted by the time it returns (each process enters
//! the limiter every few hundred microseconds). What such a call costs is then the number of
//! distinct lines and pages it touches, and how many of them it can only find one after the
//! other (a line whose address comes from another line is a dependent miss). The common path is
//! laid out for that (`scripts/vm/lackey-stretches.sh` counts it; `cargo xtask bench pairs-cold`
//! times it on the simulated driver; docs/benchmarks.md):
//!
//! - **Code in one place.** The hooks `cuMemAlloc_v2` and `cuMemFree_v2` and the functions of
//!   their common path (the reservation, the record, the region ledger's reserve and release)
//!   carry `#[unsafe(link_section = ".text.hot.vgpu")]`; `build.rs` passes a linker script that
//!   gathers those sections into one page-aligned `.text.hot` (two pages for a pair). What they
//!   call from `limiter_core` (the allocation table's insert and remove, the context charge) is
//!   `#[inline(always)]` and lands there with them. Denials, panics, initialisation and
//!   contention are `#[cold]` functions outside it (the memory hooks' in
//!   `hooks/memory/unusual.rs`), and calls on the path are `#[inline]` (a local copy per codegen
//!   unit, called directly: calls to another unit or crate go through the GOT).
//! - **Data in one page.** The runtime's one static (`runtime::Runtime`) is in `.data.hot` (same
//!   script), addressed with `lea` (`platform::direct`) rather than through the GOT: Rust's
//!   x86_64 Linux targets emit no relaxable GOT relocations, so every static would otherwise cost
//!   a GOT line first. Its first line, the hot line, holds what every hook reads first; the
//!   state's fields every hook reads share its first line (a `const` assert keeps them there).
//! - **Entry lines** ([`before_alloc`], [`before_free`]): on entry, the lines needed before the
//!   driver call (the slot's line and device 0's reservation word for an allocation, the
//!   address's table bucket for a free) are prefetched together from addresses kept in the hot
//!   line, overlapping the thread's and the state's misses. Their addresses do not change for the
//!   life of a process (`runtime::process::Process::entry_lines`).
//! - **Wake lines** ([`WakeLines`]): the lines the call's remainder touches after the driver
//!   returns (the hot line, the state's, the thread words and control block, the process, the
//!   call's statistics record, and for a free that returns a charge the slot's line and device
//!   0's container word) are gathered *before* the call, when the hook has them at hand, into one
//!   line of its stack, and prefetched all at once when it returns (the record's histogram line
//!   from the latency): one dependent miss, then the rest overlapped, instead of chains through
//!   the hot line, the thread words and the writer. On the H100 that took 3.5 % off the
//!   8-process pair on average, within the run-to-run noise in two of four runs.
//! - **Ownership.** Lines about to be written are fetched for ownership (`prefetchw`), so that the
//!   write or compare-and-swap that follows does not first take the line shared.
//! - **Not code.** Prefetching the whole `.text.hot` section after a long driver call made the
//!   8-process pair 45-54 % slower on the H100 (the prefetches queue ahead of the demand misses);
//!   it is not done.
//!
//! Hints only: no address here is dereferenced, and a stale one (a forked child before its first
//! call) costs nothing wrong.

use std::sync::atomic::Ordering::Relaxed;

use agent_common::api::ApiId;
use limiter_core::alloc_table::{ADDRESS_BUCKETS, AllocTable};
use region::{layout::ApiRecord, prefetch};

use crate::{
    platform::thread_words,
    runtime::{
        self,
        ledger::Ledger,
        process::{Process, Space},
        state::State,
    },
};

/// Which of the hot line's entry lines is which.
const SLOT: usize = 0;
const CONTAINER: usize = 1;
const BUCKETS: usize = 2;

/// On entering an allocation hook: the process, its slot's line and device 0's reservation
/// word (both to be written: fetched for ownership).
#[inline(always)]
pub(crate) fn before_alloc() {
    let rt = runtime::get();
    let lines = rt.entry_lines();
    read(rt.process().map_or(0, |p| std::ptr::from_ref(p) as usize));
    write(lines[SLOT].load(Relaxed));
    write(lines[CONTAINER].load(Relaxed));
}

/// On entering a free of device address `key`: the process and the address's bucket.
#[inline(always)]
pub(crate) fn before_free(key: u64) {
    let rt = runtime::get();
    read(rt.process().map_or(0, |p| std::ptr::from_ref(p) as usize));
    let base = rt.entry_lines()[BUCKETS].load(Relaxed);
    if base != 0 {
        write(base + AllocTable::<ADDRESS_BUCKETS>::home_offset(key));
    }
}

/// Before a reservation or release on `device`: the lines it writes (device 0's, looked up once
/// by the ledger; another device's through the region).
#[inline(always)]
pub(crate) fn reservation(ledger: &Ledger, device: usize) {
    let Some(l) = ledger.region() else { return };
    if let Some(r) = l.kept(device) {
        r.prefetch();
    } else if let Ok(d) = u32::try_from(device) {
        l.region.prefetch_owner_op(&l.slot, d);
    }
}

/// Before an insertion of `key` into its table: its line.
#[inline(always)]
pub(crate) fn table_line(process: &Process, space: Space, key: u64) {
    write(process.key_line(space, key));
}

/// The lines the rest of an allocation or a free touches after its driver call: see the module
/// documentation. One line of the caller's stack.
#[repr(C, align(64))]
pub(crate) struct WakeLines {
    /// Lines to fetch for writing (a repeated address where there is nothing else to fetch).
    lines: [usize; 7],
    /// The call's statistics record: its histogram line depends on the latency.
    record: Option<&'static ApiRecord>,
}

const _: () = assert!(size_of::<WakeLines>() == 64);

impl WakeLines {
    /// Before an allocation's driver call: what keeping it (the table insert) and recording it
    /// touch.
    #[inline(always)]
    pub(crate) fn for_allocation(state: &State, process: &Process, api: ApiId) -> WakeLines {
        let ptrs = std::ptr::from_ref(&process.ptrs) as usize;
        Self::gather(state, process, api, [ptrs, ptrs + 64])
    }

    /// Before a free's driver call: what recording it and, if it `releases` a charge on device
    /// 0, the release touch (the container's line is shared with the other processes: it is not
    /// taken from them for a free that releases nothing).
    #[inline(always)]
    pub(crate) fn for_free(
        state: &State,
        process: &Process,
        api: ApiId,
        releases: bool,
    ) -> WakeLines {
        let extra = if releases {
            let lines = runtime::get().entry_lines();
            // Relaxed: addresses kept as hints.
            [lines[SLOT].load(Relaxed), lines[CONTAINER].load(Relaxed)]
        } else {
            [0, 0]
        };
        Self::gather(state, process, api, extra)
    }

    #[inline(always)]
    fn gather(state: &State, process: &Process, api: ApiId, extra: [usize; 2]) -> WakeLines {
        let rt = runtime::get();
        let hot = rt.hot_line();
        let nonzero = |a: usize| if a == 0 { hot } else { a };
        WakeLines {
            lines: [
                hot,
                std::ptr::from_ref(state) as usize,
                std::ptr::from_ref(rt.words()) as usize,
                nonzero(thread_words::thread_pointer()),
                std::ptr::from_ref(process) as usize,
                nonzero(extra[0]),
                nonzero(extra[1]),
            ],
            record: process.ledger.region().and_then(|l| l.stats_record(api)),
        }
    }

    /// Right after the driver call, which took `latency_ns`: fetches every line at once.
    #[inline(always)]
    pub(crate) fn fetch(&self, latency_ns: u64) {
        for &line in &self.lines {
            prefetch::line_for_write(line as *const u8);
        }
        if let Some(record) = self.record {
            record.prefetch(latency_ns);
        }
    }
}

#[inline(always)]
fn read(addr: usize) {
    if addr != 0 {
        prefetch::line(addr as *const u8);
    }
}

#[inline(always)]
fn write(addr: usize) {
    if addr != 0 {
        prefetch::line_for_write(addr as *const u8);
    }
}
