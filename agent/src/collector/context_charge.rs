//! One process's context charge on a device, as a region shows it: the memory the limiter
//! charges a process for its context before its first allocation on the device
//! (`VGPU_CONTEXT_BYTES`, HAMi-core's context size). A limit below it denies every allocation,
//! which `top` and the detail view say.
//!
//! The limiter records a slot's context bytes once the charge is held. A charge that never fits
//! is not recorded, but it shows in the slot's denials: while a process holds no context on any
//! device, each of its allocations is refused at the context charge, so its denied bytes over its
//! denials are the charge, exactly.

use region::{hami::HamiSnapshot, reader::RegionSnapshot};

/// The context charge of one process on `device` of a limiter region: the largest a slot holds,
/// else the largest that a slot holding none was refused.
pub fn vgpu(s: &RegionSnapshot, device: usize) -> Option<u64> {
    let held = s
        .slots
        .iter()
        .filter_map(|slot| slot.context_bytes.get(device).copied())
        .filter(|b| *b > 0)
        .max();
    held.or_else(|| {
        s.slots
            .iter()
            .filter(|slot| slot.context_bytes.iter().all(|b| *b == 0))
            .filter_map(|slot| {
                let denied: u64 = slot.apis.iter().map(|a| a.denied).sum();
                let bytes: u64 = slot.apis.iter().map(|a| a.denied_bytes).sum();
                (denied > 0).then(|| bytes / denied)
            })
            .max()
    })
}

/// The context size HAMi-core records for its processes on `device`.
pub fn hami(h: &HamiSnapshot, device: usize) -> Option<u64> {
    h.processes
        .iter()
        .filter_map(|p| p.context_size.get(device).copied())
        .filter(|b| *b > 0)
        .max()
}
