//! Budgeted sampling of the high-rate probe kinds (launches, synchronisations, copies).
//!
//! A probe hit costs a microsecond or more, and a launch-heavy job makes tens of thousands of
//! launches, synchronisations and copies a second: probing them all would cost it several per
//! cent (3.1% in the seed slowdown test on the GPU machine, all of it from synchronisations and
//! copies). Under a budget, each of these kinds is attached in short windows whose duty cycle is
//! picked from the rate measured in its last window, so that the estimated cost
//! (per-hit cost x calls per second x duty) of all of them together stays under the budget for
//! the busiest process. The budget is shared out by water-filling: a kind whose full cost fits in
//! its share stays attached (exact counts), the others share the rest equally, so every sampled
//! kind is seen in about the same number of calls. Kinds that track state (allocations, frees,
//! lifecycle, NCCL communicators) are never sampled.
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
use exposure::Weight;
use gaps::{Gap, GapEnd, Reference, Window, calls_of_kinds, gap_estimates, reference_kinds};
use windows::commit;

/// The kinds a budget controls.
pub const SAMPLED_KINDS: [ApiKind; 3] = ApiKind::HIGH_RATE;

/// How much probe cost the sampled kinds may add.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Share of a process's wall time (0.01 = 1%).
    pub share: f64,
    /// How long each window lasts.
    pub window: Duration,
}

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

/// One kind's schedule and what was measured.
#[derive(Clone, Debug)]
struct KindState {
    kind: ApiKind,
    on: bool,
    /// When the current state began.
    since: Instant,
    /// When it should change (attached kinds whose duty is 1 are re-measured at this time).
    until: Instant,
    duty: f64,
    /// Calls per second of the busiest process in the last window.
    rate: f64,
    /// What a hit costs that process, ns.
    rate_per_hit_ns: f64,
    attached: Duration,
    /// Calls per process when the window opened.
    calls_at_open: BTreeMap<u32, u64>,
    /// Each process's own-pace call rate (calls per second of its own time) in the last closed
    /// window, and when that window closed.
    last_rates: BTreeMap<u32, f64>,
    closed_at: Option<Instant>,
    /// The detached time before the current window (from the last window's close to this one's
    /// opening, polls and attaching included).
    gap: Duration,
    /// Every kind's calls per process when the current window opened (its reference kinds are
    /// picked when it closes: the kinds attached all through it, see [`Reference`]).
    at_open: BTreeMap<ApiKind, BTreeMap<u32, u64>>,
    opened_at: Instant,
    /// Since when the kind has been attached without a break (re-measuring a kind that fits the
    /// budget whole is no break).
    attached_since: Instant,
    /// The last closed window's reference, as seen at its close.
    last: Option<Reference>,
    /// The estimate of the gap before the current window, made when it opened (from the window
    /// before the gap alone): part of every reading until the window closes and the full
    /// estimate replaces it.
    provisional: BTreeMap<u32, Gap>,
    /// The weights the last closed window's values got so far in the gap estimates (by
    /// reference, by pace: see [`Spread`]), per process: the gap before it; the gap after it
    /// completes them.
    weights: BTreeMap<u32, Weight>,
}

/// The schedule of every sampled kind.
pub struct Schedule {
    budget: Budget,
    kinds: Vec<KindState>,
    /// Kinds never detached (reference kinds for every sampled kind).
    always_on: Vec<ApiKind>,
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
    /// Every kind starts attached for one window (to measure its rate). `always_on`: the probed
    /// kinds that are never detached.
    pub fn new(budget: Budget, kinds: &[ApiKind], always_on: &[ApiKind], now: Instant) -> Schedule {
        Schedule {
            budget,
            always_on: always_on.to_vec(),
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
        self.kinds.iter().map(|k| k.until).min()
    }

    /// Switches due at `now`. `calls(kind)` gives each process's probed calls of a kind so far;
    /// `per_hit_ns(pid)` the current cost of a hit in that process (it depends on the class of
    /// the functions its library has: `calibrate`).
    pub fn due(
        &mut self,
        now: Instant,
        per_hit_ns: impl Fn(u32) -> f64,
        mut calls: impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
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
                .map(|(pid, n)| (*n as f64 / open, per_hit_ns(*pid)))
                .max_by(|a, b| (a.0 * a.1).total_cmp(&(b.0 * b.1)));
            (k.rate, k.rate_per_hit_ns) = busiest.unwrap_or((0.0, 0.0));
            replan = true;
        }
        if replan {
            let cost: Vec<f64> = self
                .kinds
                .iter()
                .map(|k| k.rate * k.rate_per_hit_ns / 1e9)
                .collect();
            let d = duties(&cost, self.budget.share);
            for (k, d) in self.kinds.iter_mut().zip(d) {
                k.duty = d.max(MIN_DUTY);
                log::debug!(
                    "sampling {}: {:.0} calls/s, duty {:.4}",
                    k.kind.name(),
                    k.rate,
                    k.duty
                );
            }
        }
        let w = self.budget.window;
        // Reference candidates: the never-sampled kinds, and the sampled ones that fit the
        // budget whole (staying attached), with since when each has been attached.
        let whole: Vec<(ApiKind, Instant)> = self
            .kinds
            .iter()
            .filter(|k| k.on && k.duty >= 1.0)
            .map(|k| (k.kind, k.attached_since))
            .collect();
        let all: Vec<ApiKind> = self
            .kinds
            .iter()
            .map(|k| k.kind)
            .chain(self.always_on.iter().copied())
            .collect();
        for (k, seen) in self.kinds.iter_mut().zip(&seen) {
            if now < k.until {
                continue;
            }
            if k.on {
                let open = now.duration_since(k.since);
                let off = if k.duty >= 1.0 {
                    Duration::ZERO
                } else {
                    w.mul_f64(1.0 / k.duty - 1.0)
                };
                let windows: BTreeMap<u32, Window> = seen
                    .iter()
                    .map(|(pid, n)| (*pid, Window::new(open.as_secs_f64(), *n, per_hit_ns(*pid))))
                    .collect();
                let rates: BTreeMap<u32, f64> =
                    windows.iter().map(|(pid, w)| (*pid, w.rate())).collect();
                // The window's reference: the kinds attached all through it.
                let refs = reference_kinds(&self.always_on, &whole, k.kind, k.opened_at);
                let reference = Reference::closing(
                    &refs,
                    k.opened_at,
                    &k.at_open_of(&refs),
                    calls_of_kinds(&refs, &mut counted),
                    seen,
                    k.last.as_ref(),
                );
                let between = if k.closed_at.is_some() {
                    gap_estimates(
                        k,
                        &self.detached_at,
                        GapEnd {
                            seconds: k.gap.as_secs_f64(),
                            ref_calls: &k.at_open_of(k.last_reference_kinds()),
                        },
                        Some((&reference, &rates)),
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
        let all: Vec<ApiKind> = self
            .kinds
            .iter()
            .map(|k| k.kind)
            .chain(self.always_on.iter().copied())
            .collect();
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
                duty: k.duty,
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
mod tests;
