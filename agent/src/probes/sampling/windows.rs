//! A window of one kind opening, standing open, and closing: what it counts from, what a
//! reading counts while it is open or while the gap after it runs ([`KindState::pending`]), and
//! what it adds to each process's exposure when it closes ([`commit`]).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use agent_common::ApiKind;

use super::{
    exposure::Weight,
    gaps::{Gap, GapEnd, Reference, Window, calls_of_kinds, gap_estimates},
};
use crate::model::probing::Exposure;

/// One kind's schedule and what was measured.
#[derive(Clone, Debug)]
pub(super) struct KindState {
    pub(super) kind: ApiKind,
    pub(super) on: bool,
    /// When the current state began.
    pub(super) since: Instant,
    /// When it should change (attached kinds whose duty is 1 are re-measured at this time).
    pub(super) until: Instant,
    pub(super) duty: f64,
    /// Calls per second of the busiest process in the last window.
    pub(super) rate: f64,
    /// What a hit costs that process, ns.
    pub(super) rate_per_hit_ns: f64,
    pub(super) attached: Duration,
    /// Calls per process when the window opened.
    pub(super) calls_at_open: BTreeMap<u32, u64>,
    /// Each process's own-pace call rate (calls per second of its own time) in the last closed
    /// window, and when that window closed.
    pub(super) last_rates: BTreeMap<u32, f64>,
    pub(super) closed_at: Option<Instant>,
    /// The detached time before the current window (from the last window's close to this one's
    /// opening, polls and attaching included).
    pub(super) gap: Duration,
    /// Every kind's calls per process when the current window opened (its reference kinds are
    /// picked when it closes: the kinds attached all through it, see [`Reference`]).
    pub(super) at_open: BTreeMap<ApiKind, BTreeMap<u32, u64>>,
    pub(super) opened_at: Instant,
    /// Since when the kind has been attached without a break (re-measuring a kind that fits the
    /// budget whole is no break).
    pub(super) attached_since: Instant,
    /// The last closed window's reference, as seen at its close.
    pub(super) last: Option<Reference>,
    /// The estimate of the gap before the current window, made when it opened (from the window
    /// before the gap alone): part of every reading until the window closes and the full
    /// estimate replaces it.
    pub(super) provisional: BTreeMap<u32, Gap>,
    /// Every process's hits of the kind (probed calls and the unpaired hits at the windows'
    /// edges) when its last window closed.
    pub(super) hits_at_close: BTreeMap<u32, u64>,
    /// The hits of a window's whole cycle (its attach and detach, the calls in flight across
    /// them, a window that ran long) over those its measured rate plans for the window alone, in
    /// the busiest process: the gaps are lengthened by it so that what the probes really cost
    /// stays within the budget (at least 1; a moving average over the cycles; `None`, taken as 1,
    /// until a cycle measured it).
    pub(super) overrun: Option<f64>,
    /// When the open window's middle was read, and each process's calls then (`None` until it
    /// is: see [`KindState::middle`]).
    pub(super) at_mid: Option<(Instant, BTreeMap<u32, u64>)>,
    /// Each process's own-pace rate at the end of the last closed window (over its second half;
    /// over the whole window where its middle was not read): the pace the gap after it starts
    /// from. See [`KindState::half_rates`].
    pub(super) edge_rates: BTreeMap<u32, f64>,
    /// The weights the last closed window's values got so far in the gap estimates (by
    /// reference, by pace: see [`Spread`](crate::model::probing::exposure::Spread)), per process: the gap before it; the gap after it
    /// completes them.
    pub(super) weights: BTreeMap<u32, Weight>,
}

impl KindState {
    /// Opens a window at `at`: the calls of the kind and of its reference kinds are counted from
    /// here, and the gap before it is estimated provisionally.
    pub(super) fn open(
        &mut self,
        at: Instant,
        kinds: &[ApiKind],
        detached_at: &[(ApiKind, Instant)],
        calls: &mut impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
    ) {
        self.until += at.saturating_duration_since(self.since);
        self.since = at;
        self.opened_at = at;
        self.at_mid = None;
        self.at_open = kinds.iter().map(|k| (*k, calls(*k))).collect();
        self.calls_at_open = self.at_open.get(&self.kind).cloned().unwrap_or_default();
        self.gap = self
            .closed_at
            .map(|c| at.saturating_duration_since(c))
            .unwrap_or_default();
        self.provisional = if self.closed_at.is_some() {
            gap_estimates(
                self.last.as_ref(),
                &self.edge_rates,
                detached_at,
                GapEnd {
                    seconds: self.gap.as_secs_f64(),
                    ref_calls: &self.at_open_of(self.last_reference_kinds()),
                },
                None,
            )
        } else {
            BTreeMap::new()
        };
    }

    /// The middle of the window open now while its calls have not been read there.
    pub(super) fn middle(&self) -> Option<Instant> {
        (self.on && self.at_mid.is_none())
            .then(|| self.since + self.until.saturating_duration_since(self.since) / 2)
    }

    /// What the gaps are lengthened by ([`KindState::overrun`]).
    pub(super) fn gap_factor(&self) -> f64 {
        self.overrun.unwrap_or(1.0)
    }

    /// Each process's own-pace rates over the first and the second half of the window closing at
    /// `now` (`counts`: calls per process then), where its middle was read: the pace at the
    /// window's start, which the gap before it ends at, and at its end, which the gap after it
    /// starts from. A process that stopped calling in the window's first half makes no calls in
    /// the gap after it, one that began in its second half made none in the gap before; for a
    /// process that keeps its pace the halves' mean is the window's, so the gaps' estimates
    /// together stay what the window rates give.
    pub(super) fn half_rates(
        &self,
        now: Instant,
        counts: &BTreeMap<u32, u64>,
        per_hit_ns: impl Fn(u32) -> f64,
    ) -> Option<[BTreeMap<u32, f64>; 2]> {
        let (mid, at_mid) = self.at_mid.as_ref()?;
        let first_s = mid.saturating_duration_since(self.since).as_secs_f64();
        let second_s = now.saturating_duration_since(*mid).as_secs_f64();
        // A middle read late (the agent was not scheduled) leaves one part too short to say.
        let shorter = first_s.min(second_s);
        if shorter <= 0.0 || shorter < 0.25 * (first_s + second_s) {
            return None;
        }
        let mut halves = [BTreeMap::new(), BTreeMap::new()];
        for (pid, close) in counts {
            let open = self.calls_at_open.get(pid).copied().unwrap_or(0);
            let middle = at_mid.get(pid).copied().unwrap_or(open).clamp(open, *close);
            let price = per_hit_ns(*pid);
            halves[0].insert(*pid, Window::new(first_s, middle - open, price).rate());
            halves[1].insert(*pid, Window::new(second_s, close - middle, price).rate());
        }
        Some(halves)
    }

    /// The reference kinds of the last closed window (none before the first).
    pub(super) fn last_reference_kinds(&self) -> &[ApiKind] {
        self.last.as_ref().map_or(&[], |l| &l.kinds)
    }

    /// Each process's calls of `kinds` together when the current window opened.
    pub(super) fn at_open_of(&self, kinds: &[ApiKind]) -> BTreeMap<u32, u64> {
        calls_of_kinds(kinds, &mut |k| {
            self.at_open.get(&k).cloned().unwrap_or_default()
        })
    }

    /// What the kind's calls stand for beyond what closed windows committed, per process, at
    /// `now`: the calls of the window still open and the provisional estimate of the gap before
    /// it, or the estimate of the gap in progress.
    pub(super) fn pending(
        &self,
        now: Instant,
        detached_at: &[(ApiKind, Instant)],
        calls: &mut impl FnMut(ApiKind) -> BTreeMap<u32, u64>,
    ) -> BTreeMap<u32, Exposure> {
        let mut out: BTreeMap<u32, Exposure> = BTreeMap::new();
        let gaps = if self.on {
            for (pid, n) in calls(self.kind) {
                let seen = n.saturating_sub(self.calls_at_open.get(&pid).copied().unwrap_or(0));
                if seen > 0 {
                    let e = out.entry(pid).or_default();
                    e.probed_calls += seen;
                    e.estimated_calls += seen as f64;
                }
            }
            self.provisional.clone()
        } else if let Some(closed) = self.closed_at {
            let ref_calls = calls_of_kinds(self.last_reference_kinds(), calls);
            gap_estimates(
                self.last.as_ref(),
                &self.edge_rates,
                detached_at,
                GapEnd {
                    seconds: now.saturating_duration_since(closed).as_secs_f64(),
                    ref_calls: &ref_calls,
                },
                None,
            )
        } else {
            BTreeMap::new()
        };
        // The last window's weights as they stand (completed when the gap after it is).
        let mut weights = self.weights.clone();
        for (pid, gap) in gaps {
            if gap.calls != 0.0 {
                out.entry(pid).or_default().add(&gap.exposure());
                weights.entry(pid).or_default().weight[gap.how.index()] += gap.before;
            }
        }
        for (pid, w) in weights {
            let e = w.exposure();
            if !e.is_empty() {
                out.entry(pid).or_default().add(&e);
            }
        }
        out
    }
}

/// Commits a closed window of `k` to each process's exposure: its calls (`windows`), the calls
/// estimated for the gap before it (`between`), and what the window adds to the spread of each
/// estimator (its value against the last window's, its own and probe time for the pace, and the
/// last window's weight, now complete). Returns the new window's weights so far.
pub(super) fn commit(
    committed: &mut BTreeMap<u32, BTreeMap<String, Exposure>>,
    k: &KindState,
    windows: &BTreeMap<u32, Window>,
    rates: &BTreeMap<u32, f64>,
    reference: &Reference,
    between: &BTreeMap<u32, Gap>,
) -> BTreeMap<u32, Weight> {
    let consecutive_refs = k.last.as_ref().is_some_and(|l| l.kinds == reference.kinds);
    let pids: std::collections::BTreeSet<u32> = windows
        .keys()
        .chain(between.keys())
        .chain(k.weights.keys())
        .copied()
        .collect();
    let mut weights = BTreeMap::new();
    for pid in pids {
        let mut e = Exposure::default();
        // The last window's weight is complete with the gap after it; this window's starts.
        let mut last = k.weights.get(&pid).copied().unwrap_or_default();
        let mut next = Weight::new([
            reference.rounding.get(&pid).copied().unwrap_or(0.0),
            windows.get(&pid).map_or(0.0, Window::rounding),
        ]);
        if let Some(g) = between.get(&pid)
            && g.calls != 0.0
        {
            last.weight[g.how.index()] += g.before;
            next.weight[g.how.index()] = g.after;
        }
        e.add(&last.exposure());
        if windows.contains_key(&pid) || next.weight != [0.0; 2] {
            weights.insert(pid, next);
        }
        if let Some(w) = windows.get(&pid) {
            e.probed_calls = w.calls;
            e.estimated_calls = w.calls as f64;
            if w.calls > 0 {
                e.pace.own_seconds = w.own_seconds;
                e.pace.probe_seconds = w.probe_seconds;
            }
        }
        if let Some(g) = between.get(&pid)
            && g.calls != 0.0
        {
            e.add(&g.exposure());
        }
        let rate = rates.get(&pid).copied().unwrap_or(0.0);
        if let Some(before) = k.last_rates.get(&pid)
            && (rate > 0.0 || *before > 0.0)
        {
            e.pace.pairs = 1;
            e.pace.sq_diff = (rate - before).powi(2);
        }
        if consecutive_refs
            && let (Some(now), Some(before)) = (
                reference.ratios.get(&pid),
                k.last.as_ref().and_then(|l| l.ratios.get(&pid)),
            )
        {
            e.reference.pairs = 1;
            e.reference.sq_diff = (now - before).powi(2);
        }
        if !e.is_empty() {
            committed
                .entry(pid)
                .or_default()
                .entry(k.kind.name().to_owned())
                .or_default()
                .add(&e);
        }
    }
    weights
}
