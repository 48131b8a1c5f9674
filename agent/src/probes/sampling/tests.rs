//! Unit tests of the sampling schedule and the gap estimators.

use super::gaps::pace_gap_calls;
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
}

#[test]
fn the_probes_own_time_is_taken_out_of_the_window() {
    // 50 ms window, 40 ms of it probe hits (a tight loop slowed 5x): 40,000 calls in 10 ms.
    assert!((own_rate(0.05, 40_000, 1_000.0) - 4_000_000.0).abs() < 1e-3);
    // Sparse calls: the plain rate.
    assert!((own_rate(0.05, 10, 1_000.0) - 10.0 / 0.04999).abs() < 1e-6);
    // Many threads at once: capped.
    assert!((own_rate(0.05, 1_000_000, 1_000.0) - 1_000_000.0 / 0.005).abs() < 1e-3);
}

#[test]
fn gaps_are_charged_at_the_mean_pace_of_the_windows_around_them() {
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
    let mut e = BTreeMap::new();
    // Process 8's gap charged by pace when the window opened, then replaced at its close.
    let provisional: BTreeMap<u32, Gap> = [(8, Gap::ByPace(50.0))].into();
    charge(
        &mut e,
        ApiKind::Launch,
        &BTreeMap::new(),
        &provisional,
        &BTreeMap::new(),
    );
    assert_eq!(e[&8]["launch"].estimated_calls, 50.0);
    charge(
        &mut e,
        ApiKind::Launch,
        &[(7, 100), (9, 0)].into(),
        &[(7, Gap::ByPace(900.0)), (8, Gap::ByReference(225.0))].into(),
        &provisional,
    );
    let (seven, eight) = (e[&7]["launch"], e[&8]["launch"]);
    assert_eq!((seven.probed_calls, seven.estimated_calls), (100, 1_000.0));
    assert_eq!(
        (seven.gap_calls_by_pace, seven.gap_calls_by_reference),
        (900.0, 0.0)
    );
    assert_eq!((eight.probed_calls, eight.estimated_calls), (0, 225.0));
    assert_eq!(
        (eight.gap_calls_by_reference, eight.gap_calls_by_pace),
        (225.0, 0.0)
    );
    assert!(!e.contains_key(&9), "nothing seen, nothing estimated");
}

/// Launches sampled, synchronisations attached all along (one per 256 launches), and the
/// per-hit cost given to the schedule 40% low: the pace estimate misses, the reference does
/// not.
#[test]
fn a_reference_kind_attached_all_along_sets_the_pace_of_the_gaps() {
    let t0 = Instant::now();
    let w = Duration::from_millis(50);
    let budget = Budget {
        share: 0.01,
        window: w,
    };
    // A process making 200k launches/s of its own (5 us each), and 2 us per probe hit (the
    // schedule is told 1.2 us): 7 us per launch while attached.
    let (own_ns, hit_ns) = (5_000.0, 2_000.0);
    let run = |always_on: &[ApiKind]| {
        let mut s = Schedule::new(budget, &[ApiKind::Launch], always_on, t0);
        let (mut t, mut launches, mut attached) = (t0, 0.0f64, true);
        let mut made = 0.0;
        let step = Duration::from_millis(1);
        for _ in 0..20_000 {
            t += step;
            let ns = if attached { own_ns + hit_ns } else { own_ns };
            let n = 1e6 / ns;
            made += n;
            if attached {
                launches += n;
            }
            if s.next_due().is_some_and(|d| d <= t) {
                let syncs = (made / 256.0) as u64;
                let calls = |k: ApiKind| -> BTreeMap<u32, u64> {
                    match k {
                        ApiKind::Launch => [(7, launches as u64)].into(),
                        ApiKind::Sync => [(7, syncs)].into(),
                        _ => BTreeMap::new(),
                    }
                };
                for (_, on) in s.due(t, |_| 1_200.0, calls) {
                    attached = on;
                    if on {
                        s.opened(ApiKind::Launch, t, calls);
                    }
                }
            }
        }
        (s.status.exposure[&7]["launch"], made)
    };
    let (paced, made) = run(&[]);
    let (referenced, _) = run(&[ApiKind::Sync]);
    let off = |est: Exposure| (est.estimated_calls - made).abs() / made;
    assert!(off(paced) > 0.05, "paced {paced:?} of {made}");
    assert!(
        off(referenced) < 0.02,
        "referenced {referenced:?} of {made}"
    );
    assert_eq!(paced.gap_calls_by_reference, 0.0);
    assert!(referenced.gap_calls_by_pace < 0.01 * referenced.gap_calls_by_reference);
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
        &[],
        t0,
    );
    assert_eq!(s.next_due(), Some(t0 + w));
    // 10,000 launches and 10 syncs in the first window: 100k/s and 100/s.
    let mut launches = 10_000;
    let mut calls = |k: ApiKind| -> BTreeMap<u32, u64> {
        match k {
            ApiKind::Launch => [(7, launches)].into(),
            _ => [(7, 10)].into(),
        }
    };
    let t1 = t0 + w;
    let sw = s.due(t1, |_| 1_000.0, &mut calls);
    assert_eq!(sw, vec![(ApiKind::Launch, false)], "syncs fit the budget");
    // Syncs cost 0.01%; launches get the other 0.99% of 10%/s: duty 0.099.
    let off = w.mul_f64(1.0 / 0.099 - 1.0);
    assert_eq!(s.next_due(), Some(t1 + w), "syncs are measured again first");
    assert_eq!(s.status.exposure[&7]["launch"].estimated_calls, 10_000.0);
    assert_eq!(s.status.exposure[&7]["sync"].estimated_calls, 10.0);
    assert!(s.due(t1 + w, |_| 1_000.0, &mut calls).is_empty());
    // The window opens again when due; its attach returned 50 ms late, so the gap before it
    // was that much longer.
    let t2 = t1 + off;
    let opens = s.due(t2, |_| 1_000.0, &mut calls);
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
            _ => [(7, 10)].into(),
        }
    };
    let t3 = t2 + late + w;
    assert_eq!(
        s.due(t3, |_| 1_000.0, &mut calls),
        vec![(ApiKind::Launch, false)]
    );
    let e = s.status.exposure[&7]["launch"];
    assert_eq!(e.probed_calls, 20_000);
    assert!(
        (e.estimated_calls - (20_000.0 + gap * rate)).abs() < 1e-6,
        "the gap at the windows' own pace: {e:?}"
    );
    s.poll(t3);
    assert_eq!(s.status.kinds.len(), 2);
    s.forget(&[7]);
    assert!(!s.status.exposure.contains_key(&7));
}
