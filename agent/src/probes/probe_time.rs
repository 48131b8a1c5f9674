//! What the probes' hits cost each process: its probed calls (the aggregation maps' counts, the
//! hits themselves, not the estimates a budget makes of all calls) times the calibrated price of
//! a hit in its library, added up as they come. This is the figure a probe budget is held to
//! in reality: the schedule plans duties from rates, this counts what was hit.

use std::collections::HashMap;

/// Each process's hits so far and their cost, seconds.
#[derive(Debug, Default)]
pub struct ProbeTime {
    /// The hits last counted (the maps' cumulative count).
    hits: HashMap<u32, u64>,
    seconds: HashMap<u32, f64>,
}

impl ProbeTime {
    /// Counts the hits since the last call: `totals` each process's hits so far (cumulative;
    /// a count that went back, a row the kernel reset, starts again from zero), each at
    /// `per_hit_ns(pid)`.
    pub fn account(
        &mut self,
        totals: impl IntoIterator<Item = (u32, u64)>,
        per_hit_ns: impl Fn(u32) -> f64,
    ) {
        for (pid, total) in totals {
            let last = self.hits.insert(pid, total).unwrap_or(0);
            let new = if total >= last { total - last } else { total };
            if new > 0 {
                *self.seconds.entry(pid).or_default() += new as f64 * per_hit_ns(pid) / 1e9;
            }
        }
    }

    /// What the probes cost `pid` so far, seconds (`None`: never hit).
    pub fn seconds(&self, pid: u32) -> Option<f64> {
        self.seconds.get(&pid).copied()
    }

    pub fn forget(&mut self, pids: &[u32]) {
        for pid in pids {
            self.hits.remove(pid);
            self.seconds.remove(pid);
        }
    }
}

/// Each process's hits so far, from the aggregation maps' rows `(pid, api, calls)`.
pub fn hits_per_process(rows: &[(u32, u16, u64)]) -> HashMap<u32, u64> {
    let mut out: HashMap<u32, u64> = HashMap::new();
    for &(pid, _, calls) in rows {
        *out.entry(pid).or_default() += calls;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_priced_as_they_come_and_a_reset_row_starts_again() {
        let mut t = ProbeTime::default();
        let price = |pid: u32| if pid == 1 { 2_000.0 } else { 1_000.0 };
        t.account([(1, 1_000), (2, 500)], price);
        assert_eq!(t.seconds(1), Some(0.002));
        assert_eq!(t.seconds(2), Some(0.0005));
        // 500 more hits for 1; 2's row was reset and counted 100 since.
        t.account([(1, 1_500), (2, 100)], price);
        assert!((t.seconds(1).unwrap() - 0.003).abs() < 1e-12);
        assert!((t.seconds(2).unwrap() - 0.0006).abs() < 1e-12);
        // No new hits: nothing added; a process never hit has no figure.
        t.account([(1, 1_500)], price);
        assert!((t.seconds(1).unwrap() - 0.003).abs() < 1e-12);
        assert_eq!(t.seconds(3), None);
        t.forget(&[1]);
        assert_eq!(t.seconds(1), None);
        assert_eq!(
            hits_per_process(&[(1, 3, 10), (1, 4, 5), (2, 3, 7)]),
            HashMap::from([(1, 15), (2, 7)])
        );
    }
}
