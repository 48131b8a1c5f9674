//! Counters that never go backwards. The kernel's aggregation rows are cumulative, and a row
//! leaves its map only when the agent removes an exited process's rows; but should a row vanish
//! or start again from zero behind the agent's back (a map that evicts, a row removed and
//! re-created), the figures shown would go backwards and fake a reset. [`Floors`] keeps the
//! last value of every row it read: a row whose counters went back is counted as reset (for its
//! process) and shown as what it had before plus what the new row holds; a row that vanished is
//! shown as it was last read. Everything of a process is forgotten with it.

use std::{collections::HashMap, hash::Hash};

use agent_common::maps::{AllocSizeKey, AllocSizeVal, ApiStats, NcclStatsKey, StatsKey};

/// A cumulative row: whether it went back since an earlier reading, and the sum of two.
pub trait Cumulative: Copy {
    fn went_back_from(&self, earlier: &Self) -> bool;
    fn plus(&self, o: &Self) -> Self;
}

impl Cumulative for ApiStats {
    fn went_back_from(&self, e: &ApiStats) -> bool {
        self.calls < e.calls
            || self.errors < e.errors
            || self.bytes < e.bytes
            || self.total_ns < e.total_ns
            || self.unpaired < e.unpaired
            || self.hist.iter().zip(&e.hist).any(|(a, b)| a < b)
    }

    fn plus(&self, o: &ApiStats) -> ApiStats {
        let mut r = *self;
        r.calls += o.calls;
        r.errors += o.errors;
        r.bytes += o.bytes;
        r.total_ns += o.total_ns;
        r.unpaired += o.unpaired;
        for (a, b) in r.hist.iter_mut().zip(&o.hist) {
            *a += b;
        }
        r
    }
}

impl Cumulative for AllocSizeVal {
    fn went_back_from(&self, e: &AllocSizeVal) -> bool {
        self.count < e.count || self.bytes < e.bytes
    }

    fn plus(&self, o: &AllocSizeVal) -> AllocSizeVal {
        AllocSizeVal {
            count: self.count + o.count,
            bytes: self.bytes + o.bytes,
        }
    }
}

/// The process a row belongs to.
pub trait OfProcess {
    fn tgid(&self) -> u32;
}

impl OfProcess for StatsKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
}

impl OfProcess for NcclStatsKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
}

impl OfProcess for AllocSizeKey {
    fn tgid(&self) -> u32 {
        self.tgid
    }
}

/// What was read of one row: the last raw value, and what earlier lives of the row had.
#[derive(Clone, Copy, Debug)]
struct Seen<V> {
    last: V,
    before: Option<V>,
}

/// The floors of one map's rows.
#[derive(Debug)]
pub struct MapFloors<K, V> {
    rows: HashMap<K, Seen<V>>,
}

impl<K, V> Default for MapFloors<K, V> {
    fn default() -> Self {
        MapFloors {
            rows: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + Hash + OfProcess, V: Cumulative> MapFloors<K, V> {
    /// Turns a reading into one that never goes back: rows that went back get their earlier
    /// lives added (each time counted in `resets` for the row's process); rows that vanished are
    /// put back as last read.
    pub fn apply(&mut self, reading: &mut Vec<(K, V)>, resets: &mut HashMap<u32, u64>) {
        let mut present: HashMap<K, ()> = HashMap::with_capacity(reading.len());
        for (k, v) in reading.iter_mut() {
            present.insert(*k, ());
            let raw = *v;
            let seen = self.rows.entry(*k).or_insert(Seen {
                last: raw,
                before: None,
            });
            if raw.went_back_from(&seen.last) {
                *resets.entry(k.tgid()).or_default() += 1;
                seen.before = Some(match seen.before {
                    Some(b) => b.plus(&seen.last),
                    None => seen.last,
                });
            }
            seen.last = raw;
            if let Some(b) = seen.before {
                *v = raw.plus(&b);
            }
        }
        for (k, seen) in &self.rows {
            if !present.contains_key(k) {
                let shown = match seen.before {
                    Some(b) => seen.last.plus(&b),
                    None => seen.last,
                };
                reading.push((*k, shown));
            }
        }
    }

    pub fn forget(&mut self, tgids: &[u32]) {
        self.rows.retain(|k, _| !tgids.contains(&k.tgid()));
    }
}

/// The floors of every aggregation map, and the resets seen per process.
#[derive(Debug, Default)]
pub struct Floors {
    pub stats: MapFloors<StatsKey, ApiStats>,
    pub nccl: MapFloors<NcclStatsKey, ApiStats>,
    pub sizes: MapFloors<AllocSizeKey, AllocSizeVal>,
    /// Rows found gone back per process, cumulative.
    pub resets: HashMap<u32, u64>,
}

impl Floors {
    pub fn forget(&mut self, tgids: &[u32]) {
        self.stats.forget(tgids);
        self.nccl.forget(tgids);
        self.sizes.forget(tgids);
        self.resets.retain(|t, _| !tgids.contains(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, api: u16) -> StatsKey {
        StatsKey {
            cgroup_id: 9,
            tgid,
            api,
            _pad: 0,
        }
    }

    fn row(calls: u64) -> ApiStats {
        let mut s = ApiStats::ZERO;
        s.calls = calls;
        s.bytes = calls * 10;
        s.hist[3] = calls;
        s
    }

    fn calls(r: &[(StatsKey, ApiStats)], k: StatsKey) -> u64 {
        r.iter().find(|(x, _)| *x == k).unwrap().1.calls
    }

    #[test]
    fn a_row_that_went_back_is_counted_and_shown_with_what_it_had() {
        let mut f = MapFloors::default();
        let mut resets = HashMap::new();
        let (victim, other) = (key(10, 1), key(11, 1));
        let mut r = vec![(victim, row(100)), (other, row(5))];
        f.apply(&mut r, &mut resets);
        assert_eq!(calls(&r, victim), 100);
        // Evicted and re-created: 3 calls since.
        let mut r = vec![(victim, row(3)), (other, row(6))];
        f.apply(&mut r, &mut resets);
        assert_eq!(calls(&r, victim), 103);
        assert_eq!(r.iter().find(|(k, _)| *k == victim).unwrap().1.hist[3], 103);
        assert_eq!(calls(&r, other), 6);
        assert_eq!(resets.get(&10), Some(&1));
        assert_eq!(resets.get(&11), None);
        // It grows on from there; a second reset adds both earlier lives.
        let mut r = vec![(victim, row(7))];
        f.apply(&mut r, &mut resets);
        assert_eq!(calls(&r, victim), 107);
        let mut r = vec![(victim, row(1))];
        f.apply(&mut r, &mut resets);
        assert_eq!(calls(&r, victim), 108);
        assert_eq!(resets.get(&10), Some(&2));
    }

    #[test]
    fn a_vanished_row_keeps_its_counts_until_its_process_is_forgotten() {
        let mut f = MapFloors::default();
        let mut resets = HashMap::new();
        let k = key(20, 4);
        let mut r = vec![(k, row(50))];
        f.apply(&mut r, &mut resets);
        let mut r = vec![];
        f.apply(&mut r, &mut resets);
        assert_eq!(calls(&r, k), 50);
        f.forget(&[20]);
        let mut r = vec![];
        f.apply(&mut r, &mut resets);
        assert!(r.is_empty());
    }

    #[test]
    fn shown_counters_never_go_back_whatever_the_readings() {
        // Random readings of 3 rows (each reading may drop, keep, grow or reset a row): every
        // shown counter is at least what it was shown before.
        let mut f = MapFloors::default();
        let mut resets = HashMap::new();
        let mut shown: HashMap<StatsKey, u64> = HashMap::new();
        let mut raw = [0u64; 3];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut r = vec![];
            for (i, v) in raw.iter_mut().enumerate() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 5 {
                    0 => *v = 0,
                    1 => continue,
                    _ => *v += x % 100,
                }
                r.push((key(30, i as u16), row(*v)));
            }
            f.apply(&mut r, &mut resets);
            for (k, s) in &r {
                let before = shown.insert(*k, s.calls).unwrap_or(0);
                assert!(s.calls >= before, "{k:?}: {before} -> {}", s.calls);
            }
        }
        assert!(resets[&30] > 0);
    }
}
