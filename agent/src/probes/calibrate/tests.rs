//! The calibration's bookkeeping, fed with generated measurements (no clock): what each interval
//! is charged, at which class, and how sure the price is.

use super::*;

fn cost_with(classes: &[(Prologue, f64)]) -> ProbeCost {
    ProbeCost {
        target: String::new(),
        prologue: classes[0].0,
        calls: 0,
        unprobed_ns: 0.0,
        per_hit_ns: 0.0,
        inband_ns: 0.0,
        remeasured: 0,
        last_per_hit_ns: 0.0,
        charged_ns: BTreeMap::new(),
        charged_se_ns: BTreeMap::new(),
        charged_inband_ns: BTreeMap::new(),
        classes: classes
            .iter()
            .map(|&(prologue, ns)| ClassCost {
                prologue,
                target: String::new(),
                unprobed_ns: 1.0,
                per_hit_ns: ns,
                inband_ns: ns / 2.0,
                last_per_hit_ns: ns,
                last_se_ns: 0.0,
                charged_calls: 0,
            })
            .collect(),
        process_prologue: BTreeMap::new(),
    }
}

/// A calibrator whose classes were first measured at `start` (ns per hit, with that standard
/// error), without probes: re-measurements are given to [`Calibrator::settle`].
fn calibrator(start: &[(Prologue, Timed)]) -> Calibrator {
    let priced: Vec<(Prologue, f64)> = start.iter().map(|(p, t)| (*p, t.ns)).collect();
    Calibrator {
        classes: start
            .iter()
            .map(|(_, t)| Class {
                func: UNPROBED_BODY,
                burst: 100,
                recent: vec![*t],
                recent_inband: vec![t.ns / 2.0],
            })
            .collect(),
        row: None,
        cost: cost_with(&priced),
        default_main: start[0].0,
        calls_seen: BTreeMap::new(),
    }
}

/// A re-measurement that found a hit to cost `ns` exactly (probed `ns + 500`, unprobed 500),
/// half of it in band (the probes measured the calibration function at `500 + ns / 2`).
fn hit(ns: f64) -> Measured {
    Measured {
        probed: Timed {
            ns: ns + 500.0,
            se_ns: 0.0,
        },
        unprobed: Timed {
            ns: 500.0,
            se_ns: 0.0,
        },
        latency: Some(500.0 + ns / 2.0),
    }
}

fn exact(ns: f64) -> Timed {
    Timed { ns, se_ns: 0.0 }
}

#[test]
fn each_interval_is_charged_at_its_own_cost_and_class() {
    let (mut cost, mut seen) = (cost_with(&[(Prologue::Push, 1.0)]), BTreeMap::new());
    let price = |k: f64| {
        move |p: Prologue| {
            let ns = if p == Prologue::Push { k } else { 10.0 * k };
            (exact(ns), ns / 4.0)
        }
    };
    let (push, other) = (Prologue::Push, Prologue::Other);
    let by = charge(
        &mut cost,
        &mut seen,
        &[((7, push), 100)].into(),
        price(1_000.0),
    );
    assert_eq!(by, [(push, 100)].into());
    let by = charge(
        &mut cost,
        &mut seen,
        &[((7, push), 300), ((7, other), 5), ((8, push), 50)].into(),
        price(2_000.0),
    );
    assert_eq!(by, [(push, 250), (other, 5)].into());
    assert_eq!(
        cost.charged_ns[&7],
        100.0 * 1_000.0 + 200.0 * 2_000.0 + 5.0 * 20_000.0
    );
    assert_eq!(cost.charged_ns[&8], 50.0 * 2_000.0);
    // A reused pid whose rows were removed starts again.
    charge(
        &mut cost,
        &mut seen,
        &[((8, push), 10)].into(),
        price(3_000.0),
    );
    assert_eq!(cost.charged_ns[&8], 50.0 * 2_000.0 + 10.0 * 3_000.0);
    assert_eq!(cost.charged_se_ns[&8], 0.0, "exact prices, exact charges");
    assert_eq!(cost.charged_inband_ns[&8], 50.0 * 500.0 + 10.0 * 750.0);
}

#[test]
fn a_steady_hit_is_priced_exactly_and_with_no_uncertainty() {
    let mut c = calibrator(&[(Prologue::Push, exact(2_000.0))]);
    let push = Prologue::Push;
    for polls in 1..=8u64 {
        c.settle(
            &[((7, push), polls * 1_000)].into(),
            &[(push, hit(2_000.0))].into(),
        );
    }
    let class = c.cost.class(push).unwrap();
    assert_eq!((class.last_per_hit_ns, class.last_se_ns), (2_000.0, 0.0));
    assert_eq!(class.charged_calls, 8_000);
    assert_eq!(c.cost.charged_ns[&7], 8_000.0 * 2_000.0);
    assert_eq!(c.cost.charged_se_ns[&7], 0.0);
    assert_eq!(c.cost.charged_inband_ns[&7], 8_000.0 * 1_000.0);
    assert_eq!(c.cost.remeasured, 8);
    assert_eq!(c.cost.process_prologue[&7], push);
}

#[test]
fn the_price_is_the_median_of_the_last_five_and_its_uncertainty_their_spread() {
    let push = Prologue::Push;
    // Measured at start with a spread of its own batches: until a second measurement, that is
    // the price's uncertainty.
    let mut c = calibrator(&[(
        push,
        Timed {
            ns: 1_000.0,
            se_ns: 30.0,
        },
    )]);
    assert_eq!(price(&c.classes[0].recent).se_ns, 30.0);
    // Re-measured 1,200, 800, 1,100, 900 (with the start's 1,000: five values), calls charged
    // at each poll. The fifth price: median 1,000; spread: deviations 0, 200, -200, 100, -100
    // from the mean 1,000, sample variance 100,000 / 4, standard error sqrt(25,000 / 5).
    let mut charged = 0.0;
    let mut charged_se = 0.0;
    for (i, ns) in [1_200.0, 800.0, 1_100.0, 900.0].into_iter().enumerate() {
        c.settle(
            &[((7, push), (i as u64 + 1) * 100)].into(),
            &[(push, hit(ns))].into(),
        );
        let p = price(&c.classes[0].recent);
        charged += 100.0 * p.ns;
        charged_se += 100.0 * p.se_ns;
    }
    let class = c.cost.class(push).unwrap();
    assert_eq!(class.last_per_hit_ns, 1_000.0);
    assert!(
        (class.last_se_ns - 5_000.0f64.sqrt()).abs() < 1e-9,
        "{class:?}"
    );
    assert!((c.cost.charged_ns[&7] - charged).abs() < 1e-6);
    assert!((c.cost.charged_se_ns[&7] - charged_se).abs() < 1e-6);
    // The second price: median of {1,000, 1,200} (the upper middle), spread of two values.
    let two = price(&[exact(1_000.0), exact(1_200.0)]);
    assert_eq!(two.ns, 1_200.0);
    assert!((two.se_ns - 100.0).abs() < 1e-9, "{two:?}");
}

#[test]
fn a_preempted_burst_does_not_set_the_price_but_widens_its_uncertainty() {
    let push = Prologue::Push;
    let mut c = calibrator(&[(push, exact(2_000.0))]);
    for (i, ns) in [2_000.0, 2_000.0, 9_000.0, 2_000.0].into_iter().enumerate() {
        c.settle(
            &[((7, push), (i as u64 + 1) * 10)].into(),
            &[(push, hit(ns))].into(),
        );
    }
    let class = c.cost.class(push).unwrap();
    assert_eq!(class.last_per_hit_ns, 2_000.0, "the median");
    // Five values 2,000 x4 and 9,000: mean 3,400, sample sd 3,130.5: se 1,400.
    assert!((class.last_se_ns - 1_400.0).abs() < 1.0, "{class:?}");
    assert!(
        class.last_se_ns / class.last_per_hit_ns > 0.10,
        "marked uncertain"
    );
}

/// The in-band part of a hit is re-measured too, from the latency the probes measured of each
/// batch (medians of batches, like the price): one preempted burst does not move it.
#[test]
fn the_in_band_part_is_the_median_of_its_re_measurements() {
    let push = Prologue::Push;
    let mut c = calibrator(&[(push, exact(2_000.0))]);
    for (i, latency) in [1_500.0, 1_500.0, 9_000.0, 1_500.0].into_iter().enumerate() {
        let mut m = hit(2_000.0);
        m.latency = Some(latency);
        c.settle(
            &[((7, push), (i as u64 + 1) * 10)].into(),
            &[(push, m)].into(),
        );
    }
    // Five values: 1,000 from the start, then 1,000, 1,000, 8,500, 1,000 (latency less the
    // unprobed 500).
    assert_eq!(c.cost.class(push).unwrap().inband_ns, 1_000.0);
    assert_eq!(
        c.cost.charged_inband_ns[&7],
        30.0 * 1_000.0 + 10.0 * 1_000.0
    );
    // Without a latency reading, the last in-band figure stands.
    let mut m = hit(2_000.0);
    m.latency = None;
    c.settle(&[((7, push), 50)].into(), &[(push, m)].into());
    assert_eq!(c.cost.class(push).unwrap().inband_ns, 1_000.0);
}

#[test]
fn classes_without_calls_are_not_re_measured_or_charged() {
    let (push, other) = (Prologue::Push, Prologue::Other);
    let mut c = calibrator(&[(push, exact(1_500.0)), (other, exact(8_000.0))]);
    c.settle(&[((7, other), 40)].into(), &[(other, hit(7_000.0))].into());
    assert_eq!(c.cost.class(push).unwrap().last_per_hit_ns, 1_500.0);
    // The median of {8,000, 7,000} (the upper middle).
    assert_eq!(c.cost.class(other).unwrap().last_per_hit_ns, 8_000.0);
    assert_eq!(c.cost.charged_ns[&7], 40.0 * 8_000.0);
    assert_eq!(
        c.cost.prologue, other,
        "the class most calls were charged at"
    );
    assert_eq!(c.cost.class_of(9).unwrap().prologue, other);
    c.forget(&[7]);
    assert!(c.cost.charged_ns.is_empty() && c.cost.charged_se_ns.is_empty());
}

#[test]
fn timings_carry_the_spread_of_their_batches() {
    let t = Timed::of(&[10.0, 12.0, 14.0]);
    assert_eq!(t.ns, 12.0);
    // Sample sd 2, over sqrt(3).
    assert!((t.se_ns - 2.0 / 3.0f64.sqrt()).abs() < 1e-12);
    let d = Timed {
        ns: 10.0,
        se_ns: 3.0,
    }
    .minus(Timed {
        ns: 4.0,
        se_ns: 4.0,
    });
    assert_eq!((d.ns, d.se_ns), (6.0, 5.0));
    assert_eq!(Timed::of(&[5.0]).se_ns, 0.0);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn each_class_has_a_function_that_starts_like_it_in_this_binary() {
    let (path, data) = own_binary().unwrap();
    let file = object::File::parse(&*data).unwrap();
    for (prologue, name, func) in STUBS {
        let (_, seen) = super::super::symbols::find_function(&file, &*data, name)
            .unwrap_or_else(|| panic!("{name} in {}", path.display()));
        assert_eq!(seen, prologue, "{name}");
        let mut v = 0;
        // SAFETY: see `time_calls`.
        assert_eq!(unsafe { func(&mut v) }, 0);
    }
    let mut main = cost_with(&[(Prologue::Other, 3_000.0), (Prologue::Push, 1_000.0)]);
    main.process_prologue.insert(7, Prologue::Push);
    assert_eq!(main.class_of(7).unwrap().per_hit_ns, 1_000.0);
    assert_eq!(
        main.class_of(8).unwrap().per_hit_ns,
        3_000.0,
        "the main class"
    );
}

#[test]
fn batches_take_about_the_time_asked() {
    assert_eq!(batch_for(Duration::from_micros(700), 3_500.0), 200);
    assert_eq!(batch_for(Duration::from_millis(10), 0.0), 5_000);
    assert_eq!(batch_for(Duration::from_micros(10), 15_000.0), 20);
}
