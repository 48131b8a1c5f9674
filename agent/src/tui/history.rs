//! Short histories for sparklines, "memory over time" and "SM over time": bounded ring buffers
//! per GPU and per container and process, derived from successive snapshots. Rows that leave the
//! model are forgotten.

use std::collections::{HashMap, VecDeque};

use super::rows::{Util, container_row, process_figures, process_memory};
use crate::model::{ProcessKey, Snapshot};

/// Samples kept per series (two minutes at the default interval).
pub const CAPACITY: usize = 120;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series(VecDeque<u64>);

impl Series {
    pub fn push(&mut self, v: u64) {
        if self.0.len() == CAPACITY {
            self.0.pop_front();
        }
        self.0.push_back(v);
    }

    /// The last `n` samples, oldest first.
    pub fn last(&self, n: usize) -> Vec<u64> {
        let skip = self.0.len().saturating_sub(n);
        self.0.iter().skip(skip).copied().collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn max(&self) -> u64 {
        self.0.iter().copied().max().unwrap_or(0)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuHistory {
    pub utilization: Series,
    pub memory: Series,
    pub power_mw: Series,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub gpus: HashMap<u32, GpuHistory>,
    pub containers: HashMap<String, Series>,
    pub processes: HashMap<ProcessKey, Series>,
    /// SM busy percent per container and process, while measured.
    pub container_sm: HashMap<String, Series>,
    pub process_sm: HashMap<ProcessKey, Series>,
}

/// The percent to record, if measured.
fn measured(u: Util) -> Option<u64> {
    match u {
        Util::Pct(v) => Some(v.round() as u64),
        Util::NotAvailable | Util::Unknown => None,
    }
}

impl History {
    /// Adds one snapshot's samples.
    pub fn record(&mut self, snap: &Snapshot) {
        for g in &snap.gpus {
            let h = self.gpus.entry(g.index).or_default();
            h.utilization.push(g.utilization_pct.unwrap_or(0) as u64);
            h.memory.push(g.memory_used.unwrap_or(0));
            h.power_mw.push(g.power_mw.unwrap_or(0) as u64);
        }
        self.gpus
            .retain(|i, _| snap.gpus.iter().any(|g| g.index == *i));
        for c in &snap.containers {
            let f = container_row(snap, c).figures;
            self.containers
                .entry(c.key.clone())
                .or_default()
                .push(f.memory.unwrap_or(0));
            if let Some(sm) = measured(f.sm) {
                self.container_sm.entry(c.key.clone()).or_default().push(sm);
            }
        }
        let has_container = |k: &String| snap.containers.iter().any(|c| &c.key == k);
        self.containers.retain(|k, _| has_container(k));
        self.container_sm.retain(|k, _| has_container(k));
        for p in &snap.processes {
            self.processes
                .entry(p.key)
                .or_default()
                .push(process_memory(p).unwrap_or(0));
            if let Some(sm) = measured(process_figures(p).sm) {
                self.process_sm.entry(p.key).or_default().push(sm);
            }
        }
        let has_process = |k: &ProcessKey| snap.processes.iter().any(|p| p.key == *k);
        self.processes.retain(|k, _| has_process(k));
        self.process_sm.retain(|k, _| has_process(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;

    #[test]
    fn series_are_bounded_and_keep_the_newest() {
        let mut s = Series::default();
        for i in 0..(CAPACITY as u64 + 10) {
            s.push(i);
        }
        assert_eq!(s.len(), CAPACITY);
        assert_eq!(
            s.last(3),
            vec![
                CAPACITY as u64 + 7,
                CAPACITY as u64 + 8,
                CAPACITY as u64 + 9
            ]
        );
        assert_eq!(s.last(1000).len(), CAPACITY);
        assert_eq!(s.max(), CAPACITY as u64 + 9);
    }

    #[test]
    fn records_gpus_containers_and_processes_and_forgets_what_left() {
        let mut h = History::default();
        let snap = fixture::snapshot();
        h.record(&snap);
        h.record(&snap);
        assert_eq!(h.gpus[&0].utilization.last(2), vec![87, 87]);
        assert_eq!(h.containers[fixture::TRAIN_ID].last(1), vec![6 << 30]);
        assert_eq!(h.processes.len(), snap.processes.len());
        assert_eq!(
            h.container_sm[fixture::TRAIN_ID].last(2),
            vec![fixture::TRAIN_SM_PCT; 2]
        );
        assert!(
            !h.container_sm.contains_key(fixture::UNLIMITED_ID),
            "n/a is not recorded as 0"
        );
        h.record(&fixture::empty());
        assert!(h.containers.is_empty() && h.processes.is_empty());
        assert!(h.container_sm.is_empty() && h.process_sm.is_empty());
        assert_eq!(h.gpus[&0].utilization.len(), 3);
        h.record(&fixture::no_driver());
        assert!(h.gpus.is_empty());
    }
}
