//! The calls made while a sampled kind is detached: estimated from reference kinds ([`Reference`])
//! or by pace, and charged to each process's [`Exposure`].

use std::{collections::BTreeMap, time::Instant};

use agent_common::ApiKind;

use super::{Exposure, KindState};

/// A pace clock for the detached gaps that the probes themselves do not disturb: the calls of
/// the other sampled kinds while they fit the budget whole and stay attached (synchronisations
/// and copies, which a training step makes at a steady ratio to its launches), and launches when
/// they are always probed. Each window gives, per process, the ratio of the sampled
/// kind's calls to the reference kinds' calls; the gap after it is estimated as the reference
/// calls made in the gap times the ratio. Unlike a rate per second, the ratio does not move when
/// the probes slow the process down (both kinds slow alike), nor when it is descheduled, and a
/// process that starts or exits in the gap has reference calls only while it runs.
#[derive(Clone, Debug)]
pub(super) struct Reference {
    kinds: Vec<ApiKind>,
    /// When that window opened (its reference kinds must have stayed attached since).
    opened_at: Instant,
    /// Reference calls per process at its close.
    pub(super) at_close: BTreeMap<u32, u64>,
    /// Sampled calls per reference call, per process with enough reference calls in the window.
    pub(super) ratios: BTreeMap<u32, f64>,
}

/// Reference calls a window needs for its ratio to be used (fewer: the pace estimate instead).
const MIN_REFERENCE_CALLS: u64 = 8;

/// A process's calls per second of its own time in a window that was open `open` seconds and
/// saw `n` of its calls. While attached, each call also took a probe hit, so the process got
/// through only `open - n x per_hit` of its own work (without this a tight launch loop, slowed 3x
/// by the probes while they are attached, would be counted 3x short). The correction is capped at
/// 90% of the window, for callers on many threads at once.
pub(super) fn own_rate(open: f64, n: u64, per_hit_ns: f64) -> f64 {
    let own = (open - n as f64 * per_hit_ns / 1e9)
        .max(open * 0.1)
        .max(1e-9);
    n as f64 / own
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

/// The reference kinds of a window of `kind` opening now.
pub(super) fn reference_kinds(
    always_on: &[ApiKind],
    whole: &[ApiKind],
    kind: ApiKind,
) -> Vec<ApiKind> {
    let mut refs: Vec<ApiKind> = always_on
        .iter()
        .chain(whole)
        .copied()
        .filter(|k| *k != kind)
        .collect();
    refs.sort_by_key(|k| *k as u8);
    refs.dedup();
    refs
}

impl Reference {
    /// A window closing: `at_open`/`at_close` are the reference calls per process at its ends,
    /// `seen` its sampled calls per process.
    pub(super) fn closing(
        kinds: &[ApiKind],
        opened_at: Instant,
        at_open: &BTreeMap<u32, u64>,
        at_close: BTreeMap<u32, u64>,
        seen: &BTreeMap<u32, u64>,
    ) -> Reference {
        let ratios = at_close
            .iter()
            .filter_map(|(pid, close)| {
                let in_window = close.saturating_sub(at_open.get(pid).copied().unwrap_or(0));
                (in_window >= MIN_REFERENCE_CALLS).then(|| {
                    let n = seen.get(pid).copied().unwrap_or(0);
                    (*pid, n as f64 / in_window as f64)
                })
            })
            .collect();
        Reference {
            kinds: kinds.to_vec(),
            opened_at,
            at_close,
            ratios,
        }
    }

    /// The calls of `pid` in the gap between this (earlier) window and the next, whose reference
    /// calls at its opening were `next_at_open`: the gap's reference calls times the mean of the
    /// ratios of the two windows (`next`: once it closed), or of the one that has a ratio (a
    /// process that started or exited in the gap). `None` when neither has.
    fn gap_calls(
        &self,
        next_at_open: &BTreeMap<u32, u64>,
        next: Option<&Reference>,
        pid: u32,
    ) -> Option<f64> {
        let ratios: Vec<f64> = [self.ratios.get(&pid), next.and_then(|n| n.ratios.get(&pid))]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        if ratios.is_empty() {
            return None;
        }
        let ratio = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let gap = next_at_open
            .get(&pid)
            .copied()
            .unwrap_or(0)
            .saturating_sub(self.at_close.get(&pid).copied().unwrap_or(0));
        Some(gap as f64 * ratio)
    }
}

/// The calls of each process in the detached gap before `k`'s current window: by the reference
/// where it held all along (the same kinds, none detached since the window before the gap
/// opened), else by pace. `next`: the current window's reference and own-pace rates once it
/// closed; `None` while it is open (from the window before the gap alone, then).
pub(super) fn gap_estimates(
    k: &KindState,
    detached_at: &[(ApiKind, Instant)],
    next: Option<(&Reference, &BTreeMap<u32, f64>)>,
) -> BTreeMap<u32, Gap> {
    let by_reference = k.last.as_ref().filter(|last| {
        last.kinds == k.refs
            && !k.refs.is_empty()
            && !detached_at
                .iter()
                .any(|(d, at)| last.kinds.contains(d) && *at >= last.opened_at)
    });
    let gap = k.gap.as_secs_f64();
    let none = BTreeMap::new();
    let after = next.map(|(_, rates)| rates).unwrap_or(&none);
    let mut pids: std::collections::BTreeSet<u32> =
        k.last_rates.keys().chain(after.keys()).copied().collect();
    if let Some(last) = &k.last {
        pids.extend(last.ratios.keys());
    }
    pids.into_iter()
        .map(|pid| {
            let estimate = match by_reference
                .and_then(|last| last.gap_calls(&k.ref_at_open, next.map(|(r, _)| r), pid))
            {
                Some(calls) => Gap::ByReference(calls),
                None if next.is_some() => {
                    Gap::ByPace(pace_gap_calls(&k.last_rates, after, gap, pid))
                }
                // One-sided: the whole gap at the rate before it (the trapezoid needs the rate
                // after it).
                None => Gap::ByPace(gap * k.last_rates.get(&pid).copied().unwrap_or(0.0)),
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

/// The calls estimated for a detached gap, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Gap {
    ByReference(f64),
    ByPace(f64),
}

impl Gap {
    fn calls(self) -> f64 {
        match self {
            Gap::ByReference(c) | Gap::ByPace(c) => c,
        }
    }
}

/// Adds a window to each process's exposure: its calls (`seen`), and the calls estimated for the
/// detached gap before it (`between`), in place of what was charged for that gap provisionally.
pub(super) fn charge(
    exposure: &mut BTreeMap<u32, BTreeMap<String, Exposure>>,
    kind: ApiKind,
    seen: &BTreeMap<u32, u64>,
    between: &BTreeMap<u32, Gap>,
    provisional: &BTreeMap<u32, Gap>,
) {
    let pids: std::collections::BTreeSet<u32> = seen
        .keys()
        .chain(between.keys())
        .chain(provisional.keys())
        .copied()
        .collect();
    for pid in pids {
        let n = seen.get(&pid).copied().unwrap_or(0);
        let now = between.get(&pid).copied().unwrap_or(Gap::ByPace(0.0));
        let before = provisional.get(&pid).copied().unwrap_or(Gap::ByPace(0.0));
        if n == 0 && now.calls() == 0.0 && before.calls() == 0.0 {
            continue;
        }
        let e = exposure
            .entry(pid)
            .or_default()
            .entry(kind.name().to_owned())
            .or_default();
        e.probed_calls += n;
        e.estimated_calls += n as f64 + now.calls() - before.calls();
        for (gap, sign) in [(before, -1.0), (now, 1.0)] {
            match gap {
                Gap::ByReference(c) => e.gap_calls_by_reference += sign * c,
                Gap::ByPace(c) => e.gap_calls_by_pace += sign * c,
            }
        }
    }
}
