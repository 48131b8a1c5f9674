//! Budgeted sampling of the high-rate probe kinds (launches, synchronisations, copies, NCCL
//! collectives).
//!
//! A probe hit costs a microsecond or more, and a launch-heavy job makes tens of thousands of
//! launches, synchronisations and copies a second, a multi-GPU job thousands of collectives
//! (a two-GPU all_reduce loop: 4,000 a second per rank): probing them all would cost it several per
//! cent (3.1% in the seed slowdown test on the GPU machine, all of it from synchronisations and
//! copies). Under a budget, each of these kinds is attached in short windows whose duty cycle is
//! picked from the rate measured in its last window, so that the estimated cost
//! (per-hit cost x calls per second x duty) of all of them together stays under the budget for
//! the busiest process. The budget is shared out by water-filling: a kind whose full cost fits in
//! its share stays attached (exact counts), the others share the rest equally, so every sampled
//! kind is seen in about the same number of calls. Kinds that track state (allocations, frees,
//! lifecycle, NCCL communicators' creation and end) are never sampled.
//!
//! This module is the schedule only (time is passed in); `super::session` attaches and detaches.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use agent_common::ApiKind;

mod exposure;
mod gaps;
mod windows;

#[cfg(test)]
use crate::model::probing::exposure::Spread;
use crate::model::probing::{Exposure, KindSampling, SamplingStatus};
use crate::probe_options::Budget;
use gaps::{GapEnd, Reference, Window, calls_of_kinds, gap_estimates, reference_kinds};
use windows::{KindState, commit};

/// The kinds a budget controls: the CUDA driver's high-rate kinds and NCCL's collective,
/// point-to-point and group calls (a communicator's creation and end are always probed).
pub const SAMPLED_KINDS: [ApiKind; 4] = ApiKind::BUDGETED;

/// Duty cycles that keep `cost` (each kind's probe cost when always attached, a share of wall
/// time) under `budget` (a share of wall time), by water-filling. A kind that would get at least
/// [`WHOLE_ABOVE`] of its full cost, and whose full cost is still within what is left of the
/// budget, stays attached whole (the others share a little less): a gap of a few per cent of a
/// window saves next to nothing, and would stop it being the reference of the others' gaps.
pub fn duties(cost: &[f64], budget: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..cost.len()).collect();
    order.sort_by(|a, b| cost[*a].total_cmp(&cost[*b]));
    let mut left = budget.max(0.0);
    let mut out = vec![1.0; cost.len()];
    for (i, &k) in order.iter().enumerate() {
        let share = left / (cost.len() - i) as f64;
        if cost[k] <= share || (cost[k] * WHOLE_ABOVE <= share && cost[k] <= left) {
            left -= cost[k];
        } else {
            out[k] = share / cost[k];
            left -= share;
        }
    }
    out
}

/// See [`duties`].
const WHOLE_ABOVE: f64 = 0.9;

/// The per-hit cost assumed when calibration is off (the GPU machine's, docs/gpu-validation.md).
pub const UNCALIBRATED_PER_HIT_NS: f64 = 1_600.0;

/// The least duty: windows at most this far apart (so that even a short recording sees a few).
const MIN_DUTY: f64 = 0.002;

/// The most a window's cycle may cost over its plan before the gaps stop growing with it
/// ([`KindState::overrun`]).
const MAX_OVERRUN: f64 = 4.0;

/// Windows planned to see fewer hits than this leave the overrun as it is (too few to say).
const OVERRUN_MIN_HITS: f64 = 100.0;

/// The share of the budget the schedule plans to spend. What a hit costs is measured from
/// outside the probed process (`calibrate`), and on an H200 a launch loop paid 6-21% more per
/// hit than that price (scripts/gpu/validate-budget.sh, docs/gpu-validation.md): the rest is a
/// margin for it, enough on average.
const PLANNED_SHARE: f64 = 0.9;

/// The schedule of every sampled kind.
pub struct Schedule {
    budget: Budget,
    kinds: Vec<KindState>,
    /// When each sampled kind was last detached.
    detached_at: Vec<(ApiKind, Instant)>,
    /// What closed windows and the gaps before them stand for, per process and kind; the
    /// status adds what is pending ([`KindState::pending`]).
    committed: BTreeMap<u32, BTreeMap<String, Exposure>>,
    pub status: SamplingStatus,
}

/// A change to make: attach (`true`) or detach a kind.
pub type Switch = (ApiKind, bool);

impl Schedule {
    /// Every kind starts attached for one window (to measure its rate).
    pub fn new(budget: Budget, kinds: &[ApiKind], now: Instant) -> Schedule {
        Schedule {
            budget,
            detached_at: Vec::new(),
            kinds: kinds
                .iter()
                .map(|&kind| KindState {
                    kind,
                    on: true,
                    since: now,
                    until: now + budget.window,
                    duty: 1.0,
                    rate: 0.0,
                    rate_per_hit_ns: 0.0,
                    attached: Duration::ZERO,
                    calls_at_open: BTreeMap::new(),
                    last_rates: BTreeMap::new(),
                    closed_at: None,
                    gap: Duration::ZERO,
                    at_open: BTreeMap::new(),
                    opened_at: now,
                    attached_since: now,
                    last: None,
                    provisional: BTreeMap::new(),
                    weights: BTreeMap::new(),
                    hits_at_close: BTreeMap::new(),
                    overrun: None,
                    at_mid: None,
                    edge_rates: BTreeMap::new(),
                })
                .collect(),
            committed: BTreeMap::new(),
            status: SamplingStatus {
                budget_share: budget.share,
                window_seconds: budget.window.as_secs_f64(),
                ..Default::default()
            },
        }
    }

    /// Kinds attached at the start.
    pub fn initially_on(&self) -> Vec<ApiKind> {
        self.kinds.iter().map(|k| k.kind).collect()
    }

    /// When the next switch is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.kinds
            .iter()
            .map(|k| k.middle().map_or(k.until, |mid| mid.min(k.until)))
            .min()
    }

    /// Switches due at `now`. `calls(kind)` gives each process's probed calls of a kind so far,
    /// `hits(kind)` those and its unpaired hits at the windows' edges (what the probes cost it);
    /// `per_hit_ns(pid)` the current cost of a hit in that process (it depends on the class of
    /// the functions its library has: `calibrate`).
    pub fn due(
        &mut self,
        now: Instant,
        per_hit_ns: impl Fn(u32) -> f64,
        mut calls: impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
        mut hits: impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
    ) -> Vec<Switch> {
        let mut out = Vec::new();
        let mut replan = false;
        let mut counts_of: Vec<(ApiKind, BTreeMap<u32, u64>)> = Vec::new();
        let mut counted = |kind: ApiKind| -> BTreeMap<u32, u64> {
            if let Some((_, c)) = counts_of.iter().find(|(k, _)| *k == kind) {
                return c.clone();
            }
            let c = calls(kind);
            counts_of.push((kind, c.clone()));
            c
        };
        // The calls at the middle of each window open now: the pace at its two ends
        // (`KindState::half_rates`).
        for k in &mut self.kinds {
            if k.middle().is_some_and(|mid| mid <= now && now < k.until) {
                k.at_mid = Some((now, counted(k.kind)));
            }
        }
        // Each closing window's calls per process.
        let mut seen: Vec<BTreeMap<u32, u64>> = vec![BTreeMap::new(); self.kinds.len()];
        for (k, seen) in self.kinds.iter_mut().zip(&mut seen) {
            if now < k.until || !k.on {
                continue;
            }
            // A window closed: the busiest process's rate while attached.
            let open = now.duration_since(k.since).as_secs_f64().max(1e-3);
            let counts = counted(k.kind);
            for (pid, n) in &counts {
                let before = k.calls_at_open.get(pid).copied().unwrap_or(0);
                seen.insert(*pid, n.saturating_sub(before));
            }
            // The busiest process by the time its hits take.
            let busiest = seen
                .iter()
                .map(|(pid, n)| (*pid, *n as f64 / open, per_hit_ns(*pid)))
                .max_by(|a, b| (a.1 * a.2).total_cmp(&(b.1 * b.2)));
            (k.rate, k.rate_per_hit_ns) = busiest.map_or((0.0, 0.0), |b| (b.1, b.2));
            // What its whole cycle since the last close cost against what the rate plans for a
            // window: a detached kind's edges and a window that ran long are paid too.
            let hits_now = hits(k.kind);
            if let Some((pid, rate, _)) = busiest {
                let planned = rate * self.budget.window.as_secs_f64();
                let cycle = hits_now
                    .get(&pid)
                    .zip(k.hits_at_close.get(&pid))
                    .map(|(now, then)| now.saturating_sub(*then) as f64);
                if let (Some(cycle), true) = (cycle, planned >= OVERRUN_MIN_HITS) {
                    // The first cycle measured is taken whole, the later ones averaged in.
                    let mean = k
                        .overrun
                        .map_or(cycle / planned, |o| 0.5 * o + 0.5 * cycle / planned);
                    k.overrun = Some(mean.clamp(1.0, MAX_OVERRUN));
                }
            }
            k.hits_at_close = hits_now;
            replan = true;
        }
        if replan {
            let cost: Vec<f64> = self
                .kinds
                .iter()
                .map(|k| k.rate * k.rate_per_hit_ns / 1e9)
                .collect();
            let d = duties(&cost, self.budget.share * PLANNED_SHARE);
            for (k, d) in self.kinds.iter_mut().zip(d) {
                k.duty = d.max(MIN_DUTY);
                log::debug!(
                    "sampling {}: {:.0} calls/s, duty {:.4}, overrun {:.2}",
                    k.kind.name(),
                    k.rate,
                    k.duty,
                    k.gap_factor()
                );
            }
        }
        let w = self.budget.window;
        // Reference candidates: the sampled kinds that fit the budget whole (staying attached),
        // with since when each has been attached.
        let whole: Vec<(ApiKind, Instant)> = self
            .kinds
            .iter()
            .filter(|k| k.on && k.duty >= 1.0)
            .map(|k| (k.kind, k.attached_since))
            .collect();
        let all: Vec<ApiKind> = self.kinds.iter().map(|k| k.kind).collect();
        for (k, seen) in self.kinds.iter_mut().zip(&seen) {
            if now < k.until {
                continue;
            }
            if k.on {
                let open = now.duration_since(k.since);
                let off = if k.duty >= 1.0 {
                    Duration::ZERO
                } else {
                    w.mul_f64(k.gap_factor() / k.duty - 1.0)
                };
                let windows: BTreeMap<u32, Window> = seen
                    .iter()
                    .map(|(pid, n)| (*pid, Window::new(open.as_secs_f64(), *n, per_hit_ns(*pid))))
                    .collect();
                let rates: BTreeMap<u32, f64> =
                    windows.iter().map(|(pid, w)| (*pid, w.rate())).collect();
                // The window's reference: the kinds attached all through it.
                let refs = reference_kinds(&whole, k.kind, k.opened_at);
                let reference = Reference::closing(
                    &refs,
                    k.opened_at,
                    &k.at_open_of(&refs),
                    calls_of_kinds(&refs, &mut counted),
                    seen,
                    k.last.as_ref(),
                );
                // By pace, the gap before the window ends at the pace of its first half, and the
                // gap after it starts from that of its second half.
                let [at_start, at_end] = k
                    .half_rates(now, &counted(k.kind), &per_hit_ns)
                    .unwrap_or_else(|| [rates.clone(), rates.clone()]);
                let between = if k.closed_at.is_some() {
                    gap_estimates(
                        k.last.as_ref(),
                        &k.edge_rates,
                        &self.detached_at,
                        GapEnd {
                            seconds: k.gap.as_secs_f64(),
                            ref_calls: &k.at_open_of(k.last_reference_kinds()),
                        },
                        Some((&reference, &at_start)),
                    )
                } else {
                    BTreeMap::new()
                };
                log::debug!(
                    "sampling {}: window of {:?} saw {seen:?} (own-pace rates {rates:?}); gap of {:?} before it: {between:?}",
                    k.kind.name(),
                    open,
                    k.gap,
                );
                k.weights = commit(
                    &mut self.committed,
                    k,
                    &windows,
                    &rates,
                    &reference,
                    &between,
                );
                k.provisional.clear();
                k.last_rates = rates;
                k.edge_rates = at_end;
                k.last = Some(reference);
                k.closed_at = Some(now);
                k.gap = Duration::ZERO;
                k.attached += now.duration_since(k.since);
                if k.duty >= 1.0 {
                    // Stays attached; measured again after another window (an idle process
                    // that starts calling is caught within one).
                    k.since = now;
                    k.until = now + w;
                    k.open(now, &all, &self.detached_at, &mut counted);
                    continue;
                }
                k.on = false;
                k.since = now;
                k.until = now + off;
                self.detached_at.retain(|(d, _)| *d != k.kind);
                self.detached_at.push((k.kind, now));
                out.push((k.kind, false));
            } else {
                k.on = true;
                k.since = now;
                k.until = now + w;
                k.attached_since = now;
                k.open(now, &all, &self.detached_at, &mut counted);
                out.push((k.kind, true));
            }
        }
        self.publish(now, &mut counted);
        out
    }

    /// A window opened at `at` (after its attach returned: attaching can take milliseconds on a
    /// loaded machine, and a call is counted only once it is done). `calls` are read again now:
    /// the window's calls and its reference calls are counted from here, alike, and the detached
    /// time before it is known now (estimated provisionally until the window closes).
    pub fn opened(
        &mut self,
        kind: ApiKind,
        at: Instant,
        mut calls: impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
    ) {
        let all: Vec<ApiKind> = self.kinds.iter().map(|k| k.kind).collect();
        if let Some(k) = self.kinds.iter_mut().find(|k| k.kind == kind && k.on) {
            k.attached_since = at;
            k.open(at, &all, &self.detached_at, &mut calls);
        }
        self.publish(at, &mut calls);
    }

    /// Sets the status's exposure: what closed windows committed, and what is pending at `now`.
    fn publish(&mut self, now: Instant, calls: &mut impl FnMut(ApiKind) -> BTreeMap<u32, u64>) {
        let mut exposure = self.committed.clone();
        for k in &self.kinds {
            for (pid, e) in k.pending(now, &self.detached_at, calls) {
                exposure
                    .entry(pid)
                    .or_default()
                    .entry(k.kind.name().to_owned())
                    .or_default()
                    .add(&e);
            }
        }
        self.status.exposure = exposure;
    }

    fn attached_at(&self, now: Instant) -> Vec<Duration> {
        self.kinds
            .iter()
            .map(|k| k.attached + if k.on { now - k.since } else { Duration::ZERO })
            .collect()
    }

    /// The schedule's state at `now`, for the model: `calls` as for [`Schedule::due`] (the
    /// exposure includes the window still open and the gap in progress up to now).
    pub fn poll(&mut self, now: Instant, mut calls: impl FnMut(ApiKind) -> BTreeMap<u32, u64>) {
        let attached = self.attached_at(now);
        self.status.kinds = self
            .kinds
            .iter()
            .zip(&attached)
            .map(|(k, a)| KindSampling {
                kind: k.kind.name().to_owned(),
                duty: if k.duty >= 1.0 {
                    1.0
                } else {
                    k.duty / k.gap_factor()
                },
                overrun: if k.duty >= 1.0 { 1.0 } else { k.gap_factor() },
                rate_per_second: k.rate,
                attached_seconds: a.as_secs_f64(),
            })
            .collect();
        self.publish(now, &mut calls);
    }

    /// Forgets exited processes.
    pub fn forget(&mut self, pids: &[u32]) {
        for p in pids {
            self.committed.remove(p);
            self.status.exposure.remove(p);
            for k in &mut self.kinds {
                k.last_rates.remove(p);
                k.edge_rates.remove(p);
                k.provisional.remove(p);
                k.weights.remove(p);
                if let Some(last) = &mut k.last {
                    last.ratios.remove(p);
                    last.at_close.remove(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod sim;

#[cfg(test)]
mod tests {
    //! Unit tests of the sampling schedule and its estimates. The estimates are checked on generated
    //! processes in virtual time (`sim`): every call is known, nothing is timed, nothing is retried.

    use proptest::prelude::*;

    use super::gaps::{Gap, How, Window, pace_gap_calls};
    use super::sim::{self, Agent, Phase, Reading, Rng, steady};
    use super::*;

    #[test]
    fn water_filling_keeps_cheap_kinds_whole_and_shares_the_rest() {
        // 1 us a hit, budget 1%: launches at 73k/s, syncs at 12k/s, copies at 1k/s.
        let d = duties(&[0.073, 0.012, 0.001], 0.01);
        assert_eq!(d[2], 1.0, "copies cost 0.1%: all of them");
        // The rest (0.9%) is shared: 0.45% each.
        assert!((d[0] - 0.0045 / 0.073).abs() < 1e-12, "{d:?}");
        assert!((d[1] - 0.0045 / 0.012).abs() < 1e-12, "{d:?}");
        let cost: f64 = [73_000.0, 12_000.0, 1_000.0]
            .iter()
            .zip(&d)
            .map(|(r, d)| r * 1e-6 * d)
            .sum();
        assert!((cost - 0.01).abs() < 1e-12);
        // Everything fits: nothing is sampled.
        assert_eq!(duties(&[0.0002, 0.00002], 0.01), vec![1.0, 1.0]);
        // Syncs at 1.05x their share stay whole; launches share what is left.
        let d = duties(&[0.4, 0.0105], 0.02);
        assert_eq!(d[1], 1.0);
        assert!((d[0] - 0.0095 / 0.4).abs() < 1e-12, "{d:?}");
        // At 1.2x their share they are sampled like the others.
        assert!(duties(&[0.4, 0.012], 0.02)[1] < 1.0);
        // Never over the budget: the costliest kind gets no such rounding.
        assert!((duties(&[0.0105], 0.01)[0] - 0.01 / 0.0105).abs() < 1e-12);
    }

    #[test]
    fn the_probes_own_time_is_taken_out_of_the_window() {
        let rate = |open, n, hit| Window::new(open, n, hit).rate();
        // 50 ms window, 40 ms of it probe hits (a tight loop slowed 5x): 40,000 calls in 10 ms.
        assert!((rate(0.05, 40_000, 1_000.0) - 4_000_000.0).abs() < 1e-3);
        let w = Window::new(0.05, 40_000, 1_000.0);
        assert!((w.own_seconds - 0.01).abs() < 1e-12 && (w.probe_seconds - 0.04).abs() < 1e-12);
        // Sparse calls: the plain rate.
        assert!((rate(0.05, 10, 1_000.0) - 10.0 / 0.04999).abs() < 1e-6);
        // Many threads at once: capped.
        assert!((rate(0.05, 1_000_000, 1_000.0) - 1_000_000.0 / 0.005).abs() < 1e-3);
    }

    #[test]
    fn gaps_are_estimated_at_the_mean_pace_of_the_windows_around_them() {
        let (none, steady, appeared) = (
            BTreeMap::new(),
            [(7, 1_000.0)].into(),
            [(7, 1_000.0), (8, 500.0)].into(),
        );
        // A steady process: the 0.9 s gap at its rate; one that appeared: half of it.
        assert_eq!(pace_gap_calls(&steady, &appeared, 0.9, 7), 900.0);
        assert_eq!(pace_gap_calls(&steady, &appeared, 0.9, 8), 225.0);
        // Stopped: half of it at its last rate.
        assert_eq!(pace_gap_calls(&steady, &none, 0.9, 7), 450.0);
        // What a gap adds, and the weights of the windows beside it (none for a gap of nothing).
        let g = Gap::new(How::Reference, 225.0, 50.0, 50.0);
        let e = g.exposure();
        assert_eq!(
            (
                e.estimated_calls,
                e.gap_calls_by_reference,
                e.gap_calls_by_pace
            ),
            (225.0, 225.0, 0.0)
        );
        assert_eq!((g.before, g.after), (50.0, 50.0));
        let idle = Gap::new(How::Pace, 0.0, 0.45, 0.45);
        assert_eq!((idle.before, idle.after), (0.0, 0.0));
    }

    #[test]
    fn the_standard_error_is_a_window_value_s_variance_times_its_squared_weights() {
        // Window values 1, 3, 2, 4: successive differences 2, -1, 2, variance (4 + 1 + 4) / (2 x 3).
        let mut s = Spread::default();
        for (a, b) in [(1.0f64, 3.0f64), (3.0, 2.0), (2.0, 4.0)] {
            s.pairs += 1;
            s.sq_diff += (b - a).powi(2);
        }
        assert_eq!(s.window_variance(), Some(1.5));
        // Four windows, each standing for 100 reference calls.
        s.weight_sq = 4.0 * 100.0 * 100.0;
        assert!((s.gap_se().unwrap() - (1.5f64 * 40_000.0).sqrt()).abs() < 1e-9);
        // Gaps estimated from one window: the spread is unknown. Nothing estimated: exact.
        let lone = Spread {
            weight_sq: 1.0,
            ..Default::default()
        };
        assert_eq!(lone.gap_se(), None);
        assert_eq!(Spread::default().gap_se(), Some(0.0));
        // Windows that all met the reference at the same phase show no spread; counting whole calls
        // still leaves them unsure to one call in what they counted.
        let locked = Spread {
            pairs: 3,
            sq_diff: 0.0,
            weight_sq: 4.0,
            rounding: 4.0 * (64.0f64 / 13.0).powi(2) / 12.0,
            ..Default::default()
        };
        assert!((locked.gap_se().unwrap() - 2.0 * 64.0 / 13.0 / 12.0f64.sqrt()).abs() < 1e-9);
        // Both estimators and the price of a hit add in quadrature: a pace estimate of 1,000
        // calls from windows where hits took a fifth of the time moves by a quarter of a relative
        // error in the price (10%: 25 calls).
        let e = Exposure {
            probed_calls: 100,
            estimated_calls: 1_100.0,
            gap_calls_by_pace: 1_000.0,
            reference: s,
            pace: Spread {
                pairs: 3,
                sq_diff: 0.0,
                weight_sq: 5.0,
                probe_seconds: 0.2,
                own_seconds: 0.8,
                rounding: 0.0,
            },
            ..Default::default()
        };
        assert!((e.calls_se(0.1).unwrap() - (60_000.0f64 + 625.0).sqrt()).abs() < 1e-9);
        // An estimator whose spread is unknown: its gap calls count as wholly unsure.
        let unknown = Exposure { pace: lone, ..e }.calls_se(0.0).unwrap();
        assert!((unknown - (60_000.0f64 + 1_000_000.0).sqrt()).abs() < 1e-9);
        // Readings subtract.
        let mut later = e;
        later.add(&e);
        assert_eq!(later.since(&e), e);
    }

    /// Each launch's own time moved by up to 1% either way (so that windows do not all meet the
    /// synchronisations at the same phase, as no real process does).
    fn jitter(seed: u64) -> impl FnMut(f64, f64) -> f64 {
        let mut rng = Rng(seed);
        move |_, own| own * (0.99 + 0.02 * rng.uniform())
    }

    /// The launches estimated between the first reading and each later one while the job runs
    /// steadily (after its first cycle), and at the end.
    fn tracked(readings: &[Reading], from: usize) -> Vec<(f64, f64, Option<f64>)> {
        readings[from..]
            .iter()
            .map(|r| r.against(&readings[from], 0.0))
            .collect()
    }

    /// A job at a steady 3 us a launch, hits of 2 us priced right, launches alone (estimated by
    /// pace): at every reading the estimate is the truth to within a few calls at the window edges,
    /// and says it is sure.
    #[test]
    fn a_steady_job_is_tracked_by_pace_at_every_reading() {
        let agent = Agent {
            with_syncs: false,
            ..Agent::new(10, 0.02, 2_000.0)
        };
        let readings = sim::run(
            agent,
            &[Phase::running(3.0, 3_000.0, 0), Phase::idle(0.5)],
            &mut steady,
        );
        // From the reading at 0.5 s (the first cycles measured) to the job's end.
        let running = &readings[4..30];
        for (est, truth, _) in tracked(running, 0).into_iter().skip(1) {
            let off = (est - truth).abs() / truth;
            assert!(off < 0.002, "{est} of {truth} ({:.3}% off)", off * 100.0);
        }
        // Over the 2.5 s, a dozen windows: a steady pace gives a standard error of almost nothing.
        let (est, _, se) = running[running.len() - 1].against(&running[0], 0.0);
        assert!(se.unwrap() / est < 0.002, "{se:?} of {est}");
    }

    /// The same job with a synchronisation every 64 launches (attached all along, the launches'
    /// reference): tracked at every reading and to its end, where it exits in a detached gap (its
    /// synchronisations stop with it).
    #[test]
    fn a_steady_job_is_tracked_by_its_synchronisations_to_its_end() {
        // Synchronisations cost 1% of the job's time: they fit the budget whole.
        let readings = sim::run(
            Agent::new(10, 0.025, 2_000.0),
            &[
                Phase::idle(0.05),
                Phase::running(3.0, 3_000.0, 64),
                Phase::idle(0.5),
            ],
            &mut jitter(1),
        );
        let (est, truth, se) = readings.last().unwrap().against(&readings[0], 0.0);
        let e = readings
            .last()
            .unwrap()
            .exposure
            .since(&readings[0].exposure);
        assert!(
            e.gap_calls_by_reference > 0.9 * (e.estimated_calls - e.probed_calls as f64),
            "{e:?}"
        );
        let off = (est - truth).abs() / truth;
        assert!(off < 0.005, "{est} of {truth} ({:.3}% off)", off * 100.0);
        assert!(se.unwrap() / est < 0.01, "{se:?} of {est}");
        // At every reading from the job's start: the launches so far (a reading in a gap counts
        // the gap so far at the ratio of the window before it).
        // Each window's ratio is known to one synchronisation in the 30 or so it saw: within three
        // standard errors.
        for (est, truth, se) in tracked(&readings, 0).into_iter().skip(5) {
            let se = se.expect("two windows at least");
            assert!(
                (est - truth).abs() < 3.0 * se + 0.003 * truth,
                "{est} of {truth}, se {se}"
            );
            assert!(se / est < 0.05, "se {se} of {est}");
        }
    }

    /// The gap in progress at a reading is part of it: a recording that ends while the job's last
    /// gap is detached counts that gap (it was left out until the next window opened, and a job
    /// that ended in its last gap came out short by up to a cycle: 10-15% on the H100).
    #[test]
    fn a_recording_that_ends_in_a_gap_counts_it() {
        let agent = Agent {
            with_syncs: false,
            ..Agent::new(10, 0.01, 2_000.0)
        };
        // Readings every 20 ms: several in every gap (cycles of about 0.7 s).
        let agent = Agent {
            poll: Duration::from_millis(20),
            ..agent
        };
        let readings = sim::run(agent, &[Phase::running(2.0, 3_000.0, 0)], &mut steady);
        let mut in_gap = 0;
        for (i, r) in readings.iter().enumerate().skip(40) {
            let (est, truth, _) = r.against(&readings[20], 0.0);
            let off = (est - truth).abs() / truth;
            assert!(off < 0.003, "reading {i}: {est} of {truth}");
            in_gap += usize::from(r.exposure.probed_calls == readings[i - 1].exposure.probed_calls);
        }
        assert!(in_gap > 30, "most readings fall in gaps ({in_gap})");
    }

    /// Hits that cost 2 us priced at 1.2 us (the calibration 40% low): the pace estimate rests on
    /// the price and misses; the reference, a ratio of counts, does not.
    #[test]
    fn a_reference_kind_sets_the_pace_of_the_gaps_whatever_a_hit_is_priced() {
        let run = |with_syncs: bool| {
            let agent = Agent {
                priced_hit_ns: 1_200.0,
                with_syncs,
                ..Agent::new(50, 0.01, 2_000.0)
            };
            let r = sim::run(
                agent,
                &[Phase::running(8.0, 5_000.0, 256), Phase::idle(0.3)],
                &mut jitter(2),
            );
            let (est, truth, _) = r.last().unwrap().against(&r[0], 0.0);
            (r.last().unwrap().exposure, (est - truth).abs() / truth)
        };
        let (paced, paced_off) = run(false);
        let (referenced, referenced_off) = run(true);
        assert!(paced_off > 0.05, "paced {paced:?}: {paced_off}");
        assert!(
            referenced_off < 0.01,
            "referenced {referenced:?}: {referenced_off}"
        );
        assert_eq!(paced.gap_calls_by_reference, 0.0);
        assert!(referenced.gap_calls_by_pace < 0.01 * referenced.gap_calls_by_reference);
    }

    /// A job whose pace moves from one 25 ms stretch to the next (own time 3 us x a uniform factor
    /// in 0.6-1.4): over many generated runs, the estimate's errors are about as large as the
    /// standard errors it reported (their ratio's root mean square near 1).
    #[test]
    fn a_known_spread_between_windows_gives_the_standard_error_it_should() {
        let agent = Agent {
            with_syncs: false,
            ..Agent::new(10, 0.02, 2_000.0)
        };
        let mut z = Vec::new();
        let mut relative = Vec::new();
        for seed in 0..40 {
            let mut rng = Rng(seed);
            let (mut block, mut factor) = (-1i64, 1.0);
            let mut noise = |t: f64, own: f64| {
                let b = (t / 25e6) as i64;
                if b != block {
                    block = b;
                    factor = 0.6 + 0.8 * rng.uniform();
                }
                own * factor
            };
            let readings = sim::run(agent, &[Phase::running(2.2, 3_000.0, 0)], &mut noise);
            // From 0.3 s to 2.0 s, while it runs.
            let (est, truth, se) = readings[19].against(&readings[2], 0.0);
            let se = se.expect("many windows");
            relative.push(se / est);
            z.push((est - truth) / se);
        }
        let rms = (z.iter().map(|z| z * z).sum::<f64>() / z.len() as f64).sqrt();
        // 1.43 for these 40 runs: a little over 1, as the windows set the length of the gap after
        // them from their own rate (a window that read high stands for a longer gap), which the
        // standard error does not model. A standard error twice or half as large misses the range.
        assert!((0.8..1.8).contains(&rms), "rms of error / se {rms}: {z:?}");
        let mean = relative.iter().sum::<f64>() / relative.len() as f64;
        assert!(mean > 0.002, "a spread this large is reported: {mean}");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 24,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(22),
            ..ProptestConfig::default()
        })]

        /// Any steady job (launches within 1% of their pace), budget and window, hits priced right:
        /// the estimate between two readings while it runs is within four of its standard errors
        /// of the truth (plus the few calls at the edges of the windows), and an estimate by pace
        /// gives a near-zero standard error.
        #[test]
        fn steady_jobs_are_estimated_within_their_standard_error(
            launch_ns in 2_000.0f64..20_000.0,
            hit_ns in 500.0f64..5_000.0,
            window_ms in 5u64..50,
            share in 0.005f64..0.05,
            sync_every in prop_oneof![Just(0u64), 16u64..512],
            seed in any::<u64>(),
        ) {
            let agent = Agent {
                seed,
                ..Agent::new(window_ms, share, hit_ns)
            };
            let readings = sim::run(
                agent,
                &[Phase::running(1.6, launch_ns, sync_every)],
                &mut jitter(seed),
            );
            let (est, truth, se) = readings[15].against(&readings[3], 0.0);
            let se = se.unwrap_or(f64::INFINITY);
            prop_assert!(
                (est - truth).abs() <= 4.0 * se + 0.005 * truth,
                "{est} of {truth}, se {se}"
            );
            if sync_every == 0 {
                prop_assert!(se / est < 0.005, "constant pace, se {se} of {est}");
            }
        }
    }

    /// A schedule of launches alone under a 1% budget in windows of `w`.
    fn launches_at_one_percent(w: Duration, t0: Instant) -> Schedule {
        Schedule::new(
            Budget {
                share: 0.01,
                window: w,
            },
            &[ApiKind::Launch],
            t0,
        )
    }

    /// The hits a window's cycle takes past those of its measured calls (calls in flight when
    /// its probes are switched, a window that ran long) lengthen the gaps, so that the hits the
    /// process really pays stay within the budget.
    #[test]
    fn hits_at_the_windows_edges_lengthen_the_gaps() {
        let w = Duration::from_millis(100);
        for (edge_hits, overrun) in [(0u64, 1.0), (3_000, 1.3)] {
            let t0 = Instant::now();
            let mut s = launches_at_one_percent(w, t0);
            let at = |calls: u64, hits: u64| {
                (
                    move |_: ApiKind| -> BTreeMap<u32, u64> { [(7, calls)].into() },
                    move |_: ApiKind| -> BTreeMap<u32, u64> { [(7, hits)].into() },
                )
            };
            // 100,000 launches a second at 1 us a hit: a cost of 10%, a duty of 0.09 (0.9% of
            // the 1% planned: `PLANNED_SHARE`).
            let duty = 0.01 * PLANNED_SHARE / 0.1;
            let t1 = t0 + w;
            let (c, h) = at(10_000, 10_000);
            assert_eq!(s.due(t1, |_| 1_000.0, c, h), vec![(ApiKind::Launch, false)]);
            let first_gap = w.mul_f64(1.0 / duty - 1.0);
            let gap = s.next_due().unwrap() - t1;
            assert!(
                gap.abs_diff(first_gap) < Duration::from_micros(10),
                "no cycle measured yet: {gap:?}"
            );
            let t2 = t1 + gap;
            let (c, h) = at(10_000, 10_000);
            assert_eq!(s.due(t2, |_| 1_000.0, c, h), vec![(ApiKind::Launch, true)]);
            // The second window sees 10,000 launches again; the cycle took `edge_hits` more.
            let t3 = t2 + w;
            let (c, h) = at(20_000, 20_000 + edge_hits);
            assert_eq!(s.due(t3, |_| 1_000.0, c, h), vec![(ApiKind::Launch, false)]);
            let off = s.next_due().unwrap() - t3;
            // The first cycle measured is taken whole.
            let want = w.mul_f64(overrun / duty - 1.0);
            assert!(
                off.abs_diff(want) < Duration::from_micros(10),
                "{edge_hits} edge hits: a gap of {off:?}, not {want:?}"
            );
            let (c, _) = at(20_000, 0);
            s.poll(t3, c);
            let k = &s.status.kinds[0];
            assert!((k.overrun - overrun).abs() < 1e-9, "{k:?}");
            assert!((k.duty - duty / overrun).abs() < 1e-9, "{k:?}");
        }
    }

    /// By pace, the gap after a window starts from the pace of the window's second half and the
    /// gap before it ends at that of its first half: a process that stops calling in a window
    /// makes no calls in the gap after it, one that begins in a window made none in the gap
    /// before (a burst is counted as what it was, not extrapolated at its pace), and one that
    /// keeps its pace is estimated as before.
    #[test]
    fn the_gaps_beside_a_window_take_the_pace_of_its_half_next_to_them() {
        let w = Duration::from_millis(100);
        let est = |s: &Schedule, pid: u32| {
            s.status
                .exposure
                .get(&pid)
                .and_then(|k| k.get("launch"))
                .map_or(0.0, |e| e.estimated_calls)
        };
        // Process 8 makes 10,000 launches a window all along (the kind is sampled); process 7
        // makes 2,000 in one half of the second window (the first or the second) and none else.
        for seven_in_first_half in [true, false] {
            let t0 = Instant::now();
            let mut s = launches_at_one_percent(w, t0);
            let none = |_: ApiKind| BTreeMap::new();
            let at = |eight: u64, seven: u64| {
                move |_: ApiKind| -> BTreeMap<u32, u64> {
                    let mut m: BTreeMap<u32, u64> = [(8, eight)].into();
                    if seven > 0 {
                        m.insert(7, seven);
                    }
                    m
                }
            };
            assert_eq!(s.next_due(), Some(t0 + w / 2), "the window's middle first");
            assert!(
                s.due(t0 + w / 2, |_| 1_000.0, at(5_000, 0), none)
                    .is_empty()
            );
            let t1 = t0 + w;
            assert_eq!(
                s.due(t1, |_| 1_000.0, at(10_000, 0), none),
                vec![(ApiKind::Launch, false)]
            );
            let t2 = s.next_due().unwrap();
            assert_eq!(
                s.due(t2, |_| 1_000.0, at(10_000, 0), none),
                vec![(ApiKind::Launch, true)]
            );
            let half = if seven_in_first_half { 2_000 } else { 0 };
            assert!(
                s.due(t2 + w / 2, |_| 1_000.0, at(15_000, half), none)
                    .is_empty()
            );
            let t3 = t2 + w;
            assert_eq!(
                s.due(t3, |_| 1_000.0, at(20_000, 2_000), none),
                vec![(ApiKind::Launch, false)]
            );
            let gap = (t2 - t1).as_secs_f64();
            let before = est(&s, 7);
            let later = w.mul_f64(5.0);
            s.poll(t3 + later, at(20_000, 2_000));
            let after = est(&s, 7);
            // Own-pace rates at 1 us a hit: 2,000 calls in half a window, 100,000 a second for
            // process 8.
            let pace = |calls: f64, seconds: f64| calls / (seconds - calls * 1e-6);
            let (r7, r8) = (pace(2_000.0, 0.05), pace(10_000.0, 0.1));
            if seven_in_first_half {
                // Calling when the window opened: the gap before it ends at that pace (half the
                // gap at it, as it may have begun anywhere in it); stopped within it: nothing
                // for the gap after.
                assert!(
                    (before - (2_000.0 + gap * r7 / 2.0)).abs() < 1e-6,
                    "{before}"
                );
                assert_eq!(
                    after, before,
                    "stopped in the window: nothing in the gap after"
                );
            } else {
                // Begun within it: nothing for the gap before; calling when it closed: the gap
                // after it at that pace so far.
                assert_eq!(
                    before, 2_000.0,
                    "began in the window: nothing in the gap before"
                );
                let want = 2_000.0 + later.as_secs_f64() * r7;
                assert!((after - want).abs() < 1e-6, "{after} against {want}");
            }
            // Process 8 kept its pace: its gaps at it, as by the whole windows.
            let want = 20_000.0 + (gap + later.as_secs_f64()) * r8;
            assert!(
                (est(&s, 8) - want).abs() < 1e-6,
                "{} against {want}",
                est(&s, 8)
            );
        }
    }

    #[test]
    fn a_busy_kind_gets_short_windows_far_apart_and_gaps_are_estimated() {
        let t0 = Instant::now();
        let w = Duration::from_millis(100);
        let mut s = Schedule::new(
            Budget {
                share: 0.01,
                window: w,
            },
            &[ApiKind::Launch, ApiKind::Sync],
            t0,
        );
        assert_eq!(s.next_due(), Some(t0 + w / 2), "the window's middle first");
        // 10,000 launches and 5 syncs in the first window: 100k/s and 50/s (too few syncs for a
        // reference: the gaps are estimated by pace).
        let mut launches = 10_000;
        let mut calls = |k: ApiKind| -> BTreeMap<u32, u64> {
            match k {
                ApiKind::Launch => [(7, launches)].into(),
                _ => [(7, 5)].into(),
            }
        };
        let t1 = t0 + w;
        let sw = s.due(t1, |_| 1_000.0, &mut calls, |_| BTreeMap::new());
        assert_eq!(sw, vec![(ApiKind::Launch, false)], "syncs fit the budget");
        // Syncs cost 0.005%; launches get the rest of the 0.9% planned (`PLANNED_SHARE`) of
        // their 10%: duty 0.0895.
        let off = w.mul_f64(1.0 / 0.0895 - 1.0);
        assert_eq!(
            s.next_due(),
            Some(t1 + w / 2),
            "syncs are measured again first (their window's middle)"
        );
        assert_eq!(s.status.exposure[&7]["launch"].estimated_calls, 10_000.0);
        assert_eq!(s.status.exposure[&7]["sync"].estimated_calls, 5.0);
        assert!(
            s.due(t1 + w, |_| 1_000.0, &mut calls, |_| BTreeMap::new())
                .is_empty()
        );
        // The window opens again when due; its attach returned 50 ms late, so the gap before it
        // was that much longer.
        let t2 = t1 + off;
        let opens = s.due(t2, |_| 1_000.0, &mut calls, |_| BTreeMap::new());
        assert_eq!(opens, vec![(ApiKind::Launch, true)]);
        let late = Duration::from_millis(50);
        s.opened(ApiKind::Launch, t2 + late, &mut calls);
        // The gap is counted from the opening on (at the rate before it), before this window
        // closes.
        let rate = 10_000.0 / (0.1 - 10_000.0 * 1e-6);
        let gap = (off + late).as_secs_f64();
        let e = s.status.exposure[&7]["launch"];
        assert!(
            (e.estimated_calls - (10_000.0 + gap * rate)).abs() < 1e-6,
            "{e:?}"
        );
        // The same pace in the second window: 10,000 launches, 10 ms of them probe hits.
        launches += 10_000;
        let mut calls = |k: ApiKind| -> BTreeMap<u32, u64> {
            match k {
                ApiKind::Launch => [(7, launches)].into(),
                _ => [(7, 5)].into(),
            }
        };
        let t3 = t2 + late + w;
        assert_eq!(
            s.due(t3, |_| 1_000.0, &mut calls, |_| BTreeMap::new()),
            vec![(ApiKind::Launch, false)]
        );
        let e = s.status.exposure[&7]["launch"];
        assert_eq!(e.probed_calls, 20_000);
        assert!(
            (e.estimated_calls - (20_000.0 + gap * rate)).abs() < 1e-6,
            "the gap at the windows' own pace: {e:?}"
        );
        // Detached again: at a reading half a window later, the gap in progress is counted at the
        // pace of the windows before it.
        s.poll(t3 + w / 2, &mut calls);
        let e = s.status.exposure[&7]["launch"];
        assert!(
            (e.estimated_calls - (20_000.0 + gap * rate + 0.05 * rate)).abs() < 1e-6,
            "{e:?}"
        );
        assert_eq!(s.status.kinds.len(), 2);
        s.forget(&[7]);
        assert!(!s.status.exposure.contains_key(&7));
    }
}
