//! Software prefetch: a hint that a cache line will be used soon, so that the misses of several
//! independent lines overlap instead of waiting for one another. Never faults, never changes
//! memory; a no-op where the target has no prefetch instruction.

/// Hints that the cache line holding `p` will be read or written soon.
#[inline(always)]
pub fn line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it accesses no memory architecturally and cannot fault,
    // whatever the address (SSE, part of the x86_64 baseline).
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints that the cache line holding `p` will be written soon: fetched for ownership
/// (PREFETCHW), so that the write or compare-and-swap that follows does not first take the line
/// shared and then upgrade it (a second coherence round trip when another process wrote it
/// last, as the container's reservation word is by every process allocating on the device).
#[inline(always)]
pub fn line_for_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW is a hint: it accesses no memory architecturally and cannot fault,
    // whatever the address. On x86_64 processors that predate it, its encoding (0F 0D /1)
    // executes as a no-op.
    unsafe {
        core::arch::asm!("prefetchw byte ptr [{p}]", p = in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
