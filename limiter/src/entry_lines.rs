//! The lines an allocation or a free needs before its driver call, prefetched as the hook is
//! entered.
//!
//! A hook that finds its caches cold (on the GPU machine, every allocation: the driver's own
//! work in between evicts them) otherwise fetches them one after the other: the process's
//! accounting, then from it the slot's line and the device's reservation word (an allocation),
//! or the address's bucket in the table of live allocations (a free). Their addresses do not
//! change for the life of a process, so they are kept in the hot line (`hot`), and all
//! prefetched at once on entry, overlapping the thread's and the process-wide state's misses.
//! Hints only: a stale address (a forked child before its first call) costs nothing wrong.

use std::sync::atomic::Ordering::Relaxed;

use crate::{alloc_table, hot::hot, process::Process};

/// Remembers the lines of `process` (called once it is built, again in a forked child).
/// Relaxed throughout: prefetch hints, never dereferenced.
pub fn publish(process: &Process) {
    let hot = hot();
    let (base, count) = process.ptrs.layout();
    hot.buckets.store(base, Relaxed);
    hot.bucket_count.store(count, Relaxed);
    // Device 0: the device of every allocation in a single-device process (the usual case).
    let reservation = process
        .region_slot()
        .and_then(|(region, slot)| region.reservation_lines(slot, 0));
    let [slot, container] = reservation.map_or([0, 0], |l| l.map(|p| p as usize));
    hot.slot_line.store(slot, Relaxed);
    hot.container_line.store(container, Relaxed);
}

/// On entering an allocation hook: the process, its slot's line and device 0's reservation
/// word (both to be written: fetched for ownership).
#[inline(always)]
pub fn before_alloc() {
    let hot = hot();
    hint_read(hot.process.load(Relaxed) as usize);
    hint_write(hot.slot_line.load(Relaxed));
    hint_write(hot.container_line.load(Relaxed));
}

/// On entering a free of device address `key`: the process and the address's bucket.
#[inline(always)]
pub fn before_free(key: u64) {
    let hot = hot();
    hint_read(hot.process.load(Relaxed) as usize);
    let count = hot.bucket_count.load(Relaxed);
    if count != 0 {
        let base = hot.buckets.load(Relaxed);
        hint_write(alloc_table::home_bucket_addr((base, count), key));
    }
}

#[inline(always)]
fn hint_read(addr: usize) {
    if addr != 0 {
        region::prefetch::line(addr as *const u8);
    }
}

#[inline(always)]
fn hint_write(addr: usize) {
    if addr != 0 {
        region::prefetch::line_for_write(addr as *const u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_addresses_match_the_table() {
        let table = alloc_table::AllocTable::with_buckets(64);
        let layout = table.layout();
        assert_eq!(layout.1, 64);
        for key in [0x7f00_0000_1000u64, 0x7f00_0020_0000, 1, u64::MAX] {
            let addr = alloc_table::home_bucket_addr(layout, key);
            assert!(
                addr >= layout.0 && addr < layout.0 + layout.1 * 64,
                "{key:#x}"
            );
        }
        // Hints on unknown (0) or stale addresses are harmless.
        before_alloc();
        before_free(0x1234);
    }
}
