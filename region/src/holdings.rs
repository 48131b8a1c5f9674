//! What each live process of the container holds and the GPU time it measured, read from the
//! writer's own mapping: the limiter answers NVML's per-process list inside the container from
//! the first, and its SM correction measures the container's share from the second.

use std::sync::atomic::Ordering;

use crate::handle::Region;
use crate::layout::{GPU_DEVICES_PER_RECORD, SHARDS_PER_SLOT};
use crate::procfs::{self, Liveness};
use crate::reserve;
use crate::words::{PHASE_LIVE, slot_phase, slot_pid};

/// A live slot's owner and what it holds on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    /// Pid of the owner, in its own pid namespace.
    pub pid: u32,
    /// Inode of the owner's pid namespace (0 if unknown).
    pub pid_ns: u64,
    /// Bytes the owner holds on the device (allocations and its context charge).
    pub held: u64,
}

/// A live slot's GPU time on one device, summed over its shards (layout 3.3's records).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotGpuTime {
    /// The slot's index.
    pub slot: u32,
    /// Pid of the owner, in its own pid namespace.
    pub pid: u32,
    /// The owner's start time (`/proc/PID/stat` field 22): with the slot and pid, tells a new
    /// owner of the slot from the old one.
    pub start_time: u64,
    /// Estimated GPU time of all the owner's launches on the device, ns (only grows while the
    /// slot has this owner).
    pub estimated_ns: u64,
    /// Samples behind it.
    pub samples: u64,
}

impl Region {
    /// The GPU time each live slot of the caller's pid namespace measured on `device`, in slot
    /// order (empty for a device past the region's). Each shard's words only grow; they are read
    /// one at a time (no seqlock: a sample added between two words is in the next reading).
    pub fn gpu_time(&self, device: u32) -> Vec<SlotGpuTime> {
        if device >= self.device_count() {
            return Vec::new();
        }
        let (record, within) = (
            device as usize / GPU_DEVICES_PER_RECORD,
            device as usize % GPU_DEVICES_PER_RECORD,
        );
        let own_ns = tenant_fs::own_pid_namespace().unwrap_or(0);
        (0..self.slot_count())
            .filter_map(|i| Some((i, self.slot_record(i)?)))
            .filter_map(|(slot, r)| {
                let h = &r.header;
                // Acquire: pairs with the Release publication of LIVE after the owner's identity.
                let state = h.state.load(Ordering::Acquire);
                if slot_phase(state) != PHASE_LIVE {
                    return None;
                }
                // Relaxed: written before the Release publication of LIVE (acquired above).
                let pid_ns = h.pid_ns.load(Ordering::Relaxed);
                let start_time = h.start_time.load(Ordering::Relaxed);
                if !(pid_ns == own_ns || pid_ns == 0 || own_ns == 0) {
                    return None;
                }
                let (mut estimated_ns, mut samples) = (0u64, 0u64);
                for shard in &r.shards[..SHARDS_PER_SLOT] {
                    let c = &shard.gpu_time.get(record)?.devices[within];
                    // Relaxed: counters that only grow, read for a rate; a sample's words may be
                    // seen apart (one sample's time, corrected at the next reading).
                    estimated_ns =
                        estimated_ns.wrapping_add(c.estimated_ns.load(Ordering::Relaxed));
                    samples = samples.wrapping_add(c.samples.load(Ordering::Relaxed));
                }
                Some(SlotGpuTime {
                    slot,
                    pid: slot_pid(state),
                    start_time,
                    estimated_ns,
                    samples,
                })
            })
            .collect()
    }

    /// The pids of the live slots whose owners are in the caller's pid namespace (and alive), in
    /// slot order: the container's processes as the caller sees them (the SM correction sums
    /// their NVML samples). A momentary view.
    pub fn live_pids(&self) -> Vec<u32> {
        let own_ns = tenant_fs::own_pid_namespace().unwrap_or(0);
        (0..self.slot_count())
            .filter_map(|i| self.slot_record(i))
            .filter_map(|record| {
                let h = &record.header;
                // Acquire: pairs with the Release publication of LIVE after the owner's identity.
                let state = h.state.load(Ordering::Acquire);
                if slot_phase(state) != PHASE_LIVE {
                    return None;
                }
                // Relaxed: written before the Release publication of LIVE (acquired above).
                let pid_ns = h.pid_ns.load(Ordering::Relaxed);
                let start_time = h.start_time.load(Ordering::Relaxed);
                let pid = slot_pid(state);
                let ours = pid_ns == own_ns || pid_ns == 0 || own_ns == 0;
                (ours && procfs::liveness(pid, start_time) != Liveness::Dead).then_some(pid)
            })
            .collect()
    }

    /// The live slots holding memory on `device`, in slot order. Owners in the caller's pid
    /// namespace that died (and await reclaiming) are left out; owners in another namespace
    /// cannot be checked and are listed. A momentary view: slots may be claimed, retired or
    /// change their holdings while it is taken.
    pub fn holdings(&self, device: u32) -> Vec<Holding> {
        if device >= self.device_count() {
            return Vec::new();
        }
        let own_ns = tenant_fs::own_pid_namespace().unwrap_or(0);
        (0..self.slot_count())
            .filter_map(|i| self.slot_record(i))
            .filter_map(|record| {
                let h = &record.header;
                // Acquire: pairs with the Release publication of LIVE after the owner's identity
                // (pid namespace) was stored.
                let state = h.state.load(Ordering::Acquire);
                if slot_phase(state) != PHASE_LIVE {
                    return None;
                }
                // Relaxed: a momentary value of another process's counter, for display.
                let held = reserve::word_bytes(h.held[device as usize].load(Ordering::Relaxed));
                // Relaxed: written before the Release publication of LIVE (acquired above).
                let pid_ns = h.pid_ns.load(Ordering::Relaxed);
                let start_time = h.start_time.load(Ordering::Relaxed);
                let pid = slot_pid(state);
                let dead = (pid_ns == own_ns || pid_ns == 0 || own_ns == 0)
                    && procfs::liveness(pid, start_time) == Liveness::Dead;
                (held > 0 && !dead).then_some(Holding { pid, pid_ns, held })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Region, RegionConfig};

    #[test]
    fn live_slots_with_holdings_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RegionConfig::unlimited(2);
        config.memory_limit[0] = 1 << 30;
        let (region, _) = Region::open_or_create(&dir.path().join("r"), &config).unwrap();
        assert!(region.holdings(0).is_empty());
        let slot = region.claim_slot().unwrap();
        assert!(region.holdings(0).is_empty(), "nothing held yet");
        assert_eq!(region.live_pids(), [std::process::id()]);
        region.try_reserve(&slot, 0, 3 << 20).unwrap();
        let list = region.holdings(0);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].pid, std::process::id());
        assert_eq!(list[0].held, 3 << 20);
        assert!(region.holdings(1).is_empty(), "other device");
        assert!(region.holdings(7).is_empty(), "no such device");
        region.retire_slot(slot);
        assert!(
            region.holdings(0).is_empty(),
            "retired slots are not listed"
        );
        assert!(region.live_pids().is_empty());
    }

    #[test]
    fn each_live_slot_lists_the_gpu_time_of_its_shards() {
        use crate::stats::GpuSample;
        let dir = tempfile::tempdir().unwrap();
        let (region, _) =
            Region::open_or_create(&dir.path().join("r"), &RegionConfig::unlimited(2)).unwrap();
        let slot = region.claim_slot().unwrap();
        let listed = region.gpu_time(1);
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].estimated_ns, listed[0].samples), (0, 0));
        let writer = region.shard_writer(&slot);
        let sample = GpuSample {
            elapsed_ns: 1_000,
            launches: 4,
        };
        writer.record_gpu_sample(1, sample);
        writer.record_gpu_sample(1, sample);
        writer.record_gpu_sample(0, sample);
        let listed = region.gpu_time(1);
        assert_eq!(listed[0].pid, std::process::id());
        assert_eq!(listed[0].estimated_ns, 2 * sample.estimated_ns());
        assert_eq!(listed[0].samples, 2);
        assert_eq!(region.gpu_time(0)[0].samples, 1, "the other device's own");
        assert!(region.gpu_time(2).is_empty(), "no such device");
        drop(writer);
        region.retire_slot(slot);
        assert!(
            region.gpu_time(1).is_empty(),
            "retired slots are not listed"
        );
    }
}
