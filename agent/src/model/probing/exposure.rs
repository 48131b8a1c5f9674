//! What a process's sampled calls stand for ([`Exposure`]), and how sure that estimate is
//! ([`Spread`]): the spread between consecutive windows, and the gaps it is carried over.

use serde::{Deserialize, Serialize};

/// A process's calls of one kind seen in the windows, and what they stand for: those calls plus
/// the calls estimated for the detached gaps between the windows (from a reference kind or by
/// pace: see [`super::gaps`]). Cumulative (like the other counters): a report takes the
/// difference of two readings ([`Exposure::since`]). The gap estimate of the gap in progress and
/// the calls of the window still open are included up to the moment of the reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Exposure {
    pub probed_calls: u64,
    pub estimated_calls: f64,
    /// The part of `estimated_calls` made in the detached gaps, estimated from a reference kind
    /// or by pace.
    #[serde(default)]
    pub gap_calls_by_reference: f64,
    #[serde(default)]
    pub gap_calls_by_pace: f64,
    /// How sure each of the two estimates is.
    #[serde(default)]
    pub reference: Spread,
    #[serde(default)]
    pub pace: Spread,
}

/// The spread of one gap estimator, as sums that add up over windows and gaps (so that the
/// difference of two cumulative readings describes the windows between them).
///
/// Each closed window gives a value per process: sampled calls per reference call (reference),
/// or calls per second of the process's own time (pace). The variance of one window's value
/// around the truth is estimated from consecutive windows, `sum (v[i+1] - v[i])^2 / (2 pairs)`
/// (the successive-difference estimator used for systematic samples: a trend in the rate does
/// not count as spread). A gap's estimate is its length `X` (reference calls, or seconds) times
/// the mean of the `k` window values beside it (1 or 2), so the estimate of all the gaps is a
/// sum of window values, each weighted by the lengths it stood for (`X / k` of each gap beside
/// it: about one cycle for a window with gaps on both sides); its variance is a value's
/// variance times `weight_sq`, the sum of the windows' squared weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Consecutive pairs of windows that both had a value, and the sum of their squared
    /// differences.
    pub pairs: u64,
    pub sq_diff: f64,
    /// The sum over the windows of their squared weights in the gaps estimated this way (gaps
    /// estimated as zero left out).
    pub weight_sq: f64,
    /// The same sum with each window's squared weight times its value's rounding variance: a
    /// window that saw `m` reference calls (or `n` calls, by pace) knows its value to one call
    /// in `m`, which a process that meets the windows at the same phase every time would never
    /// show as spread. The variance is the larger of the two.
    #[serde(default)]
    pub rounding: f64,
    /// Pace only: the probe hits' time and the process's own time in the windows, seconds (how
    /// much an error in the price of a hit moves the own-pace rates: see
    /// [`Exposure::calls_se`]).
    #[serde(default)]
    pub probe_seconds: f64,
    #[serde(default)]
    pub own_seconds: f64,
}

impl Spread {
    fn add(&mut self, o: &Spread) {
        self.pairs += o.pairs;
        self.sq_diff += o.sq_diff;
        self.weight_sq += o.weight_sq;
        self.rounding += o.rounding;
        self.probe_seconds += o.probe_seconds;
        self.own_seconds += o.own_seconds;
    }

    fn since(&self, b: &Spread) -> Spread {
        Spread {
            pairs: self.pairs.saturating_sub(b.pairs),
            sq_diff: (self.sq_diff - b.sq_diff).max(0.0),
            weight_sq: (self.weight_sq - b.weight_sq).max(0.0),
            rounding: (self.rounding - b.rounding).max(0.0),
            probe_seconds: (self.probe_seconds - b.probe_seconds).max(0.0),
            own_seconds: (self.own_seconds - b.own_seconds).max(0.0),
        }
    }

    /// One window value's variance (`None` without a pair of consecutive windows).
    pub fn window_variance(&self) -> Option<f64> {
        (self.pairs > 0).then(|| self.sq_diff / (2.0 * self.pairs as f64))
    }

    /// One standard error of the calls estimated for the gaps this way: 0 when no gap was
    /// estimated (or all as zero), `None` when some were but no two consecutive windows had a
    /// value (one window says nothing about the spread).
    pub fn gap_se(&self) -> Option<f64> {
        if self.weight_sq <= 0.0 {
            return Some(0.0);
        }
        Some(
            (self.window_variance()? * self.weight_sq)
                .max(self.rounding)
                .sqrt(),
        )
    }
}

impl Exposure {
    pub fn add(&mut self, o: &Exposure) {
        self.probed_calls += o.probed_calls;
        self.estimated_calls += o.estimated_calls;
        self.gap_calls_by_reference += o.gap_calls_by_reference;
        self.gap_calls_by_pace += o.gap_calls_by_pace;
        self.reference.add(&o.reference);
        self.pace.add(&o.pace);
    }

    /// What happened between an earlier reading `b` and this one.
    pub fn since(&self, b: &Exposure) -> Exposure {
        Exposure {
            probed_calls: self.probed_calls.saturating_sub(b.probed_calls),
            estimated_calls: (self.estimated_calls - b.estimated_calls).max(0.0),
            gap_calls_by_reference: (self.gap_calls_by_reference - b.gap_calls_by_reference)
                .max(0.0),
            gap_calls_by_pace: (self.gap_calls_by_pace - b.gap_calls_by_pace).max(0.0),
            reference: self.reference.since(&b.reference),
            pace: self.pace.since(&b.pace),
        }
    }

    /// Whether anything was seen or estimated.
    pub fn is_empty(&self) -> bool {
        *self == Exposure::default()
    }

    /// One standard error of `estimated_calls` (the calls seen in windows are exact): the two
    /// gap estimators' spreads, and for the pace estimate the price of a hit, whose relative
    /// standard error is `hit_relative_se` (an own-pace rate `n / (open - n x hit)` moves by
    /// `probe time / own time` times a relative change of the price). Where an estimator's
    /// spread is unknown (its gaps came from windows none of which had a neighbour with a value:
    /// see [`Spread::gap_se`]), its gap calls count as wholly unsure: a standard error as large
    /// as they are. (Always `Some`; `None` is kept for readings that say nothing.)
    pub fn calls_se(&self, hit_relative_se: f64) -> Option<f64> {
        let reference = self
            .reference
            .gap_se()
            .unwrap_or(self.gap_calls_by_reference);
        let pace = self.pace.gap_se().unwrap_or(self.gap_calls_by_pace);
        let price = if self.pace.own_seconds > 0.0 {
            self.gap_calls_by_pace * self.pace.probe_seconds / self.pace.own_seconds
                * hit_relative_se
        } else {
            0.0
        };
        Some((reference * reference + pace * pace + price * price).sqrt())
    }
}
