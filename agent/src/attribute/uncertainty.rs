//! How sure an attributed figure is: one standard error from the sampling (the spread between
//! the sampled windows, the calibration's spread) and from the price of a probe hit
//! ([`HIT_PRICE_SYSTEMATIC`]), added up as figures are, and the mark on those more than
//! [`MARK_ABOVE`] unsure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A figure whose relative standard error exceeds this (or is unknown) is marked.
pub const MARK_ABOVE: f64 = 0.10;

/// One standard error of what a probe hit costs the probed function itself, as a share of the
/// price its calibration function measured. The calibration functions are not the probed
/// library's entry points: a hit on a real entry point disturbs more of the code after its trap,
/// and more or less of it falls between the probes' own timestamps, by amounts that differ by
/// function and by run, which no spread of the calibration shows (docs/attribute.md, "How
/// sure": on an H100, libcuda's `cuLaunchKernel` in six runs, the in-band part was over by 0.07
/// to 0.35 of the price and the price itself off by -0.21 to +0.40 of it; root mean squares
/// 0.21 and 0.22). Every figure that rests on the price carries it: the probe cost, the in-band
/// correction of probed latencies, the hits taken out of the limiter's timing, and the pace
/// estimate of sampled calls. It is the same for every call of a function, so it adds linearly.
pub const HIT_PRICE_SYSTEMATIC: f64 = 0.25;

/// The relative standard error of the price of a hit: the calibration's own spread
/// (`spread_relative`) and [`HIT_PRICE_SYSTEMATIC`], in quadrature.
pub fn hit_price_relative_se(spread_relative: f64) -> f64 {
    spread_relative.hypot(HIT_PRICE_SYSTEMATIC)
}

/// One estimated figure's uncertainty.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Uncertainty {
    /// One standard error, in the figure's unit (`None`: it could not be estimated, as from a
    /// single sampled window).
    pub standard_error: Option<f64>,
    /// The standard error over the figure.
    pub relative: Option<f64>,
    /// Relative uncertainty above [`MARK_ABOVE`], or unknown.
    pub marked: bool,
}

impl Uncertainty {
    pub fn of(value: f64, standard_error: Option<f64>) -> Uncertainty {
        let relative = standard_error.map(|se| {
            if value.abs() > 0.0 {
                se / value.abs()
            } else if se > 0.0 {
                f64::MAX
            } else {
                0.0
            }
        });
        Uncertainty {
            standard_error,
            relative,
            marked: relative.is_none_or(|r| r > MARK_ABOVE),
        }
    }

    /// `±4.2%`, `±?` (unknown), with `!` when marked.
    pub fn short(&self) -> String {
        let text = match self.relative {
            Some(r) if r >= 10.0 => "±>999%".to_owned(),
            Some(r) => format!("±{:.0}%", r * 100.0),
            None => "±?".to_owned(),
        };
        if self.marked {
            format!("{text}!")
        } else {
            text
        }
    }
}

/// Standard errors being added up: independent errors in quadrature (the sampling of different
/// APIs and processes), `correlated` ones linearly (probe costs priced from the same
/// re-measurements), and whether any part was unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sum {
    squares: f64,
    correlated: f64,
    unknown: bool,
}

impl Sum {
    pub fn independent(se: Option<f64>) -> Sum {
        Sum {
            squares: se.map_or(0.0, |s| s * s),
            correlated: 0.0,
            unknown: se.is_none(),
        }
    }

    pub fn correlated(se: Option<f64>) -> Sum {
        Sum {
            squares: 0.0,
            correlated: se.unwrap_or(0.0),
            unknown: se.is_none(),
        }
    }

    pub fn add(&mut self, o: &Sum) {
        self.squares += o.squares;
        self.correlated += o.correlated;
        self.unknown |= o.unknown;
    }

    pub fn standard_error(&self) -> Option<f64> {
        (!self.unknown).then(|| self.squares.sqrt() + self.correlated)
    }
}

/// The uncertainty of each estimated component of a process, container or the totals (components
/// that are exact are absent).
pub type ComponentSums = BTreeMap<&'static str, Sum>;

pub fn add_all(into: &mut ComponentSums, from: &ComponentSums) {
    for (name, s) in from {
        into.entry(name).or_default().add(s);
    }
}

/// The report's form: each estimated component's uncertainty against its value, and the time
/// inside the API's (`in_api`), the components' sum.
pub fn describe(
    sums: &ComponentSums,
    value: impl Fn(&str) -> f64,
    in_api: f64,
) -> BTreeMap<String, Uncertainty> {
    let mut out: BTreeMap<String, Uncertainty> = sums
        .iter()
        .map(|(name, s)| {
            (
                name.to_string(),
                Uncertainty::of(value(name), s.standard_error()),
            )
        })
        .collect();
    if !sums.is_empty() {
        let mut all = Sum::default();
        for s in sums.values() {
            all.add(s);
        }
        out.insert(
            "in_api".into(),
            Uncertainty::of(in_api, all.standard_error()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_errors_add_in_quadrature_correlated_ones_linearly() {
        let mut s = Sum::independent(Some(3.0));
        s.add(&Sum::independent(Some(4.0)));
        assert_eq!(s.standard_error(), Some(5.0));
        s.add(&Sum::correlated(Some(1.0)));
        s.add(&Sum::correlated(Some(1.5)));
        assert_eq!(s.standard_error(), Some(7.5));
        s.add(&Sum::independent(None));
        assert_eq!(s.standard_error(), None, "unknown stays unknown");
    }

    #[test]
    fn more_than_ten_percent_or_unknown_is_marked() {
        let sure = Uncertainty::of(2.0, Some(0.1));
        assert_eq!((sure.relative, sure.marked), (Some(0.05), false));
        assert_eq!(sure.short(), "±5%");
        let unsure = Uncertainty::of(2.0, Some(0.3));
        assert!(unsure.marked);
        assert_eq!(unsure.short(), "±15%!");
        let unknown = Uncertainty::of(2.0, None);
        assert!(unknown.marked && unknown.relative.is_none());
        assert_eq!(unknown.short(), "±?!");
        assert!(!Uncertainty::of(0.0, Some(0.0)).marked, "nothing, exactly");
        assert!(Uncertainty::of(0.0, Some(1e-6)).marked);
    }

    #[test]
    fn the_time_inside_the_api_carries_its_components_errors() {
        let sums: ComponentSums = [
            ("driver", Sum::independent(Some(0.03))),
            ("probe_cost", Sum::correlated(Some(0.01))),
        ]
        .into();
        let d = describe(&sums, |n| if n == "driver" { 1.0 } else { 0.05 }, 2.0);
        assert_eq!(d["driver"].relative, Some(0.03));
        assert!(!d["driver"].marked);
        assert!((d["probe_cost"].relative.unwrap() - 0.2).abs() < 1e-12);
        assert!(d["probe_cost"].marked);
        assert!((d["in_api"].standard_error.unwrap() - 0.04).abs() < 1e-12);
        assert!(describe(&ComponentSums::new(), |_| 0.0, 1.0).is_empty());
    }
}
