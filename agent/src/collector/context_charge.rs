//! One process's context charge on a device, as a region shows it: the memory the limiter
//! charges a process for its context before its first allocation on the device
//! (`VGPU_CONTEXT_BYTES`, HAMi-core's context size). A limit below it denies every allocation,
//! which `top` and the detail view say.
//!
//! The limiter records a slot's context bytes once the charge is held (from the moment the
//! context exists), and a charge the limit has no room for as refused (the slot's
//! `context_refused`). A limiter that predates that flag shows a refused charge only in the
//! slot's denials: while a process holds no context on any device, each of its allocations is
//! refused at the context charge, so its denied bytes over its denials are the charge, exactly.

use region::{hami::HamiSnapshot, reader::RegionSnapshot};

/// The context charge of one process on `device` of a limiter region: the largest a slot holds,
/// else the largest a slot was refused (flagged, or else inferred from its denials).
pub fn vgpu(s: &RegionSnapshot, device: usize) -> Option<u64> {
    let largest = |of: fn(&region::reader::SlotSnapshot) -> &Vec<u64>| {
        s.slots
            .iter()
            .filter_map(|slot| of(slot).get(device).copied())
            .filter(|b| *b > 0)
            .max()
    };
    let held = largest(|slot| &slot.context_bytes);
    let refused = largest(|slot| &slot.context_refused);
    held.or(refused).or_else(|| {
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

#[cfg(test)]
mod tests {
    use region::{Region, RegionConfig, reader::RegionReader};

    use super::vgpu;

    #[test]
    fn a_held_charge_else_a_refused_one_is_the_contexts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.region");
        let mut config = RegionConfig::unlimited(2);
        config.memory_limit[1] = 256 << 20;
        config.slots = 4;
        let (region, _) = Region::open_or_create(&path, &config).unwrap();
        let slot = region.claim_slot().unwrap();
        let snapshot = || RegionReader::open(&path).unwrap().snapshot().unwrap();
        assert_eq!((vgpu(&snapshot(), 0), vgpu(&snapshot(), 1)), (None, None));
        // Device 0 holds its charge; device 1's limit had no room for it (the limiter's flag).
        region.set_context_bytes(&slot, 0, 544 << 20);
        region.set_context_refused(&slot, 1, 544 << 20);
        let s = snapshot();
        assert_eq!(
            (vgpu(&s, 0), vgpu(&s, 1)),
            (Some(544 << 20), Some(544 << 20))
        );
        assert_eq!(s.slots[0].context_bytes, [544 << 20, 0]);
    }
}
