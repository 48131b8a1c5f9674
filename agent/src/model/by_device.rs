//! Device memory per device: a process's (what the limiter's region says it holds on each
//! device, and what NVML says it uses there), and a container's (its processes' summed), so
//! that a process or container using two GPUs is shown per GPU, not as one number.
//!
//! The limiter indexes devices by the CUDA ordinal inside the container, NVML by the host's
//! index. They name the same GPU when the container sees every GPU in PCI order (no
//! `CUDA_VISIBLE_DEVICES` subset; identical GPUs, or `CUDA_DEVICE_ORDER=PCI_BUS_ID`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Process, ProcessKey, Snapshot};

/// Device memory on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    pub device: u32,
    /// Bytes held in the limiter's region (context included); `None` without a limiter, or
    /// nothing held on this device.
    pub limiter: Option<u64>,
    /// NVML's per-process used memory (context included); `None` where NVML does not list it.
    pub nvml: Option<u64>,
}

fn add(into: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *into = Some(into.unwrap_or(0) + v);
    }
}

fn at(by: &mut BTreeMap<u32, DeviceMemory>, device: u32) -> &mut DeviceMemory {
    by.entry(device).or_insert(DeviceMemory {
        device,
        ..DeviceMemory::default()
    })
}

impl Process {
    /// Per device, in device order: the devices the process holds memory on in its region, and
    /// those NVML lists it on. An exited process holds none.
    pub fn memory_by_device(&self) -> Vec<DeviceMemory> {
        let mut by: BTreeMap<u32, DeviceMemory> = BTreeMap::new();
        if !self.alive {
            return vec![];
        }
        if let Some(l) = &self.limiter {
            for (d, held) in l.held.iter().enumerate().filter(|(_, h)| **h > 0) {
                add(&mut at(&mut by, d as u32).limiter, Some(*held));
            }
        }
        for n in &self.nvml {
            add(&mut at(&mut by, n.device).nvml, n.used_memory);
        }
        by.into_values().collect()
    }
}

impl Snapshot {
    /// Per device, the memory of these processes summed.
    pub fn memory_by_device(&self, keys: &[ProcessKey]) -> Vec<DeviceMemory> {
        let mut by: BTreeMap<u32, DeviceMemory> = BTreeMap::new();
        for p in keys.iter().filter_map(|k| self.process(*k)) {
            for m in p.memory_by_device() {
                let e = at(&mut by, m.device);
                add(&mut e.limiter, m.limiter);
                add(&mut e.nvml, m.nvml);
            }
        }
        by.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn per_device_from_the_region_and_nvml_summed_per_container() {
        let s = crate::tui::fixture::two_gpus::snapshot();
        let pipe = s.processes.iter().find(|p| p.key.pid == 7200).unwrap();
        let mb = 1 << 20;
        assert_eq!(
            pipe.memory_by_device(),
            [
                DeviceMemory {
                    device: 0,
                    limiter: Some(3 * GIB),
                    nvml: Some(3 * GIB + 16 * mb)
                },
                DeviceMemory {
                    device: 1,
                    limiter: Some(5 * GIB + 512 * mb),
                    nvml: Some(5 * GIB + 530 * mb)
                },
            ]
        );
        // The DDP pod: rank 0 on GPU0, rank 1 on GPU1; zero entries of a region's held vector
        // are not devices the process uses.
        let keys: Vec<ProcessKey> = s.processes[..2].iter().map(|p| p.key).collect();
        let by = s.memory_by_device(&keys);
        let limiter: Vec<(u32, Option<u64>)> = by.iter().map(|d| (d.device, d.limiter)).collect();
        assert_eq!(limiter, [(0, Some(6 * GIB)), (1, Some(9 * GIB))]);
        // An exited process holds nothing.
        let mut gone = pipe.clone();
        gone.alive = false;
        assert!(gone.memory_by_device().is_empty());
    }
}
