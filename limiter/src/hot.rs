//! The one cache line of statics that every hook reads first.
//!
//! A hook that finds its caches cold pays for every line it touches, and more for a line that it
//! only learns the address of from another (a dependent miss). The pointers every hook starts
//! from therefore share one line, in the library's `.data.hot` section (page-aligned by
//! `build.rs`), reached without the GOT ([`direct!`]): the process-wide state, this process's
//! accounting, the thread words' TLS offset, and the addresses that `entry_lines` prefetches.

use std::sync::atomic::{AtomicIsize, AtomicPtr, AtomicUsize};

use crate::{process::Process, state::State};

/// See the module documentation. Each field says what pairs with what.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Hot {
    /// The process-wide state once initialised successfully, else null. Published with Release
    /// after `state::STATE` holds it; read with Acquire (the pairing makes its fields visible).
    pub state: AtomicPtr<State>,
    /// This process's accounting; null before its first CUDA call and in a freshly forked child.
    /// Published with Release after the `Process` is fully built, read with Acquire.
    pub process: AtomicPtr<Process>,
    /// The thread words' offset from the thread pointer (`thread_words`), 0 until read.
    /// Relaxed: every thread computes the same value.
    pub tls_offset: AtomicIsize,
    /// What `entry_lines` prefetches (0 = unknown): the slot's first line, device 0's
    /// reservation word, the live-allocation table's buckets and their count. Relaxed: hints.
    pub slot_line: AtomicUsize,
    pub container_line: AtomicUsize,
    pub buckets: AtomicUsize,
    pub bucket_count: AtomicUsize,
}

const _: () = assert!(size_of::<Hot>() == 64);

#[unsafe(link_section = ".data.hot.vgpu")]
static HOT: Hot = Hot {
    state: AtomicPtr::new(std::ptr::null_mut()),
    process: AtomicPtr::new(std::ptr::null_mut()),
    tls_offset: AtomicIsize::new(0),
    slot_line: AtomicUsize::new(0),
    container_line: AtomicUsize::new(0),
    buckets: AtomicUsize::new(0),
    bucket_count: AtomicUsize::new(0),
};

/// The hot line.
#[inline(always)]
pub fn hot() -> &'static Hot {
    direct!(HOT)
}
