//! A closed window's weights in the gap estimates, and what they add to a process's
//! [`Exposure`] (the model's record of what its sampled calls stand for).

use crate::model::probing::Exposure;

/// A window's weights in the gap estimates, by reference and by pace, and the rounding
/// variance of its values (see [`Spread`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Weight {
    pub(super) weight: [f64; 2],
    pub(super) rounding: [f64; 2],
}

impl Weight {
    /// A window's weight before any gap beside it was estimated. `rounding`: the variance of
    /// its values from counting whole calls (`(v / m)^2 / 12` for a value `v` from `m` calls,
    /// rounded evenly).
    pub(super) fn new(rounding: [f64; 2]) -> Weight {
        Weight {
            weight: [0.0; 2],
            rounding,
        }
    }

    /// What it adds to the spreads of an exposure.
    pub(super) fn exposure(&self) -> Exposure {
        let [r, p] = self.weight;
        let mut e = Exposure::default();
        e.reference.weight_sq = r * r;
        e.reference.rounding = r * r * self.rounding[0];
        e.pace.weight_sq = p * p;
        e.pace.rounding = p * p * self.rounding[1];
        e
    }
}
