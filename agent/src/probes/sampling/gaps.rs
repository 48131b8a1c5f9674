//! The calls made while a sampled kind is detached: estimated from reference kinds ([`Reference`])
//! or by pace, with the weight each gap adds to its estimator's uncertainty ([`Gap`]).

use std::{collections::BTreeMap, time::Instant};

use agent_common::ApiKind;

/// A pace clock for the detached gaps that the probes themselves do not disturb: the calls of
/// the other sampled kinds while they fit the budget whole and stay attached (synchronisations
/// and copies, which a training step makes at a steady ratio to its launches). Each window gives, per process, the ratio of the sampled
/// kind's calls to the reference kinds' calls; the gap after it is estimated as the reference
/// calls made in the gap times the ratio. Unlike a rate per second, the ratio does not move when
/// the probes slow the process down (both kinds slow alike), nor when it is descheduled, and a
/// process that starts or exits in the gap has reference calls only while it runs.
#[derive(Clone, Debug)]
pub(super) struct Reference {
    pub(super) kinds: Vec<ApiKind>,
    /// When that window opened (its reference kinds must have stayed attached since).
    opened_at: Instant,
    /// Reference calls per process at its close.
    pub(super) at_close: BTreeMap<u32, u64>,
    /// Sampled calls per reference call, per process with enough reference calls in the window,
    /// and the rounding variance of that ratio (see [`super::Spread::rounding`]).
    pub(super) ratios: BTreeMap<u32, f64>,
    pub(super) rounding: BTreeMap<u32, f64>,
    /// Reference calls per window, per process: a moving average over its windows.
    typical: BTreeMap<u32, f64>,
}

/// Reference calls a process makes in a typical window for its ratios to be used (fewer: the
/// pace estimate instead). Typical, not this window's: a process that makes 7 or 8 reference
/// calls a window, by the phase at which a window meets them, would otherwise have only its
/// windows of 8 used, and all its ratios taken one reference call short (4.5% low in a
/// generated job of this kind).
const MIN_REFERENCE_CALLS: f64 = 8.0;

/// The weight of the latest window in the moving average of reference calls per window.
const TYPICAL_WEIGHT: f64 = 0.25;

/// What one process did in a closed window of `open` seconds: its `calls`, and how much of the
/// window was its own time (the rest went to probe hits).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Window {
    pub(super) calls: u64,
    pub(super) own_seconds: f64,
    pub(super) probe_seconds: f64,
}

impl Window {
    /// While attached, each call also took a probe hit, so the process got through only
    /// `open - n x per_hit` of its own work (without this a tight launch loop, slowed 3x by the
    /// probes while they are attached, would be counted 3x short). The correction is capped at
    /// 90% of the window, for callers on many threads at once.
    pub(super) fn new(open: f64, calls: u64, per_hit_ns: f64) -> Window {
        let own = (open - calls as f64 * per_hit_ns / 1e9)
            .max(open * 0.1)
            .max(1e-9);
        Window {
            calls,
            own_seconds: own,
            probe_seconds: (open - own).max(0.0),
        }
    }

    /// Calls per second of the process's own time.
    pub(super) fn rate(&self) -> f64 {
        self.calls as f64 / self.own_seconds
    }

    /// The rounding variance of the rate (one call in the window, rounded evenly).
    pub(super) fn rounding(&self) -> f64 {
        (1.0 / self.own_seconds).powi(2) / 12.0
    }
}

/// Each process's calls of `kinds` together.
pub(super) fn calls_of_kinds(
    kinds: &[ApiKind],
    calls: &mut impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
) -> BTreeMap<u32, u64> {
    let mut sum: BTreeMap<u32, u64> = BTreeMap::new();
    for k in kinds {
        for (pid, n) in calls(*k) {
            *sum.entry(pid).or_default() += n;
        }
    }
    sum
}

/// The reference kinds of a window of `kind` that opened at `opened_at` and closes now: those
/// attached whole (`whole`: each with since when it has been) since before the window opened.
pub(super) fn reference_kinds(
    whole: &[(ApiKind, Instant)],
    kind: ApiKind,
    opened_at: Instant,
) -> Vec<ApiKind> {
    let mut refs: Vec<ApiKind> = whole
        .iter()
        .filter(|(_, since)| *since <= opened_at)
        .map(|(k, _)| *k)
        .filter(|k| *k != kind)
        .collect();
    refs.sort_by_key(|k| *k as u8);
    refs.dedup();
    refs
}

impl Reference {
    /// A window closing: `at_open`/`at_close` are the reference calls per process at its ends,
    /// `seen` its sampled calls per process, `last` the window before it.
    pub(super) fn closing(
        kinds: &[ApiKind],
        opened_at: Instant,
        at_open: &BTreeMap<u32, u64>,
        at_close: BTreeMap<u32, u64>,
        seen: &BTreeMap<u32, u64>,
        last: Option<&Reference>,
    ) -> Reference {
        let (mut ratios, mut rounding, mut typical) =
            (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let earlier = last.filter(|l| l.kinds == kinds).map(|l| &l.typical);
        for (pid, close) in &at_close {
            let in_window = close.saturating_sub(at_open.get(pid).copied().unwrap_or(0));
            let usual = match earlier.and_then(|t| t.get(pid)) {
                Some(t) => t + TYPICAL_WEIGHT * (in_window as f64 - t),
                None => in_window as f64,
            };
            typical.insert(*pid, usual);
            if usual >= MIN_REFERENCE_CALLS && in_window > 0 {
                let n = seen.get(pid).copied().unwrap_or(0);
                let ratio = n as f64 / in_window as f64;
                ratios.insert(*pid, ratio);
                rounding.insert(*pid, (ratio / in_window as f64).powi(2) / 12.0);
            }
        }
        Reference {
            kinds: kinds.to_vec(),
            opened_at,
            at_close,
            ratios,
            rounding,
            typical,
        }
    }

    /// The calls of `pid` in the gap between this (earlier) window and the end of the gap, where
    /// the reference calls were `end_calls`: the gap's reference calls times the mean of the
    /// ratios of this window and the next (`next`: once it closed), or of the one that has a
    /// ratio (a process that started or exited in the gap). `None` when neither has.
    fn gap_calls(
        &self,
        end_calls: &BTreeMap<u32, u64>,
        next: Option<&Reference>,
        pid: u32,
    ) -> Option<Gap> {
        // The next window's ratio is to the same reference only if it has the same kinds.
        let next = next.filter(|n| n.kinds == self.kinds);
        let (before, after) = (
            self.ratios.get(&pid).copied(),
            next.and_then(|n| n.ratios.get(&pid)).copied(),
        );
        let sides = [before, after].into_iter().flatten().count();
        if sides == 0 {
            return None;
        }
        let ratio = (before.unwrap_or(0.0) + after.unwrap_or(0.0)) / sides as f64;
        let gap = end_calls
            .get(&pid)
            .copied()
            .unwrap_or(0)
            .saturating_sub(self.at_close.get(&pid).copied().unwrap_or(0)) as f64;
        let share = gap / sides as f64;
        Some(Gap::new(
            How::Reference,
            gap * ratio,
            before.map_or(0.0, |_| share),
            after.map_or(0.0, |_| share),
        ))
    }
}

/// How a gap ends: its length, and the calls per process of the reference kinds of the window
/// before it at its end.
pub(super) struct GapEnd<'a> {
    pub(super) seconds: f64,
    pub(super) ref_calls: &'a BTreeMap<u32, u64>,
}

/// The calls of each process in the detached gap after a kind's last closed window (`last`, its
/// reference, and `last_rates`, its own-pace rates): by that window's reference where it held all along (none of its kinds detached since the window
/// opened), else by pace. `next`: the window after the gap and its own-pace rates once it
/// closed; `None` while it is open or the gap goes on (from the window before the gap alone,
/// then).
pub(super) fn gap_estimates(
    last: Option<&Reference>,
    last_rates: &BTreeMap<u32, f64>,
    detached_at: &[(ApiKind, Instant)],
    end: GapEnd,
    next: Option<(&Reference, &BTreeMap<u32, f64>)>,
) -> BTreeMap<u32, Gap> {
    let by_reference = last.filter(|last| {
        !last.kinds.is_empty()
            && !detached_at
                .iter()
                .any(|(d, at)| last.kinds.contains(d) && *at >= last.opened_at)
    });
    let none = BTreeMap::new();
    let after = next.map(|(_, rates)| rates).unwrap_or(&none);
    let mut pids: std::collections::BTreeSet<u32> =
        last_rates.keys().chain(after.keys()).copied().collect();
    if let Some(last) = last {
        pids.extend(last.ratios.keys());
    }
    pids.into_iter()
        .map(|pid| {
            let estimate = match by_reference
                .and_then(|last| last.gap_calls(end.ref_calls, next.map(|(r, _)| r), pid))
            {
                Some(gap) => gap,
                None if next.is_some() => Gap::new(
                    How::Pace,
                    pace_gap_calls(last_rates, after, end.seconds, pid),
                    end.seconds / 2.0,
                    end.seconds / 2.0,
                ),
                // One-sided: the whole gap at the rate before it (the trapezoid needs the rate
                // after it).
                None => Gap::new(
                    How::Pace,
                    end.seconds * last_rates.get(&pid).copied().unwrap_or(0.0),
                    end.seconds,
                    0.0,
                ),
            };
            (pid, estimate)
        })
        .collect()
}

/// The calls of `pid` in a detached gap of `gap` seconds estimated by pace: at the mean of the
/// own-pace rates of the windows on either side (a trapezoid: a process that started or stopped
/// calling somewhere in the gap is counted for half of it, which is right on average wherever in
/// the gap it changed, and off by at most half a gap).
pub(super) fn pace_gap_calls(
    before: &BTreeMap<u32, f64>,
    after: &BTreeMap<u32, f64>,
    gap: f64,
    pid: u32,
) -> f64 {
    let rate = |m: &BTreeMap<u32, f64>| m.get(&pid).copied().unwrap_or(0.0);
    gap * (rate(before) + rate(after)) / 2.0
}

/// How a gap's calls were estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum How {
    Reference,
    Pace,
}

impl How {
    /// Its index in a `[reference, pace]` pair.
    pub(super) fn index(self) -> usize {
        match self {
            How::Reference => 0,
            How::Pace => 1,
        }
    }
}

/// The calls estimated for a detached gap, and how: its length (reference calls, or seconds)
/// times a mean of the values of the windows beside it. `before` and `after` are the weights
/// those windows' values got (the length over the number of values averaged; 0 for a window
/// whose value was not used, and for both when the gap was estimated as zero): the estimate's
/// variance is the sum over the windows of their squared weights times a value's variance
/// (see [`super::Spread`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Gap {
    pub(super) how: How,
    pub(super) calls: f64,
    pub(super) before: f64,
    pub(super) after: f64,
}

impl Gap {
    pub(super) fn new(how: How, calls: f64, before: f64, after: f64) -> Gap {
        let used = calls > 0.0;
        Gap {
            how,
            calls,
            before: if used { before } else { 0.0 },
            after: if used { after } else { 0.0 },
        }
    }

    /// Its calls, as an addition to a process's exposure.
    pub(super) fn exposure(&self) -> super::Exposure {
        let mut e = super::Exposure {
            estimated_calls: self.calls,
            ..Default::default()
        };
        match self.how {
            How::Reference => e.gap_calls_by_reference = self.calls,
            How::Pace => e.gap_calls_by_pace = self.calls,
        }
        e
    }
}
