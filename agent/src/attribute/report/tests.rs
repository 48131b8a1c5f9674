//! The report built from two generated snapshots: a sampled estimate and a probe cost carry
//! their uncertainty into the JSON, the table and the HTML, marked where over 10%.

use serde_json::json;

use super::*;
use crate::model::{
    ApiUsage, Source,
    probing::{Exposure, KindSampling, LaunchProbes, ProbeCost, SamplingStatus},
};

/// A snapshot of one process (pid 1) that made `probed` probed launches of `launch_ns` each
/// (as the probes measured them), whose launches the schedule estimated as `exposure`, and that
/// was charged `charged` ns of probe cost with that standard error.
fn snapshot(
    probed: u64,
    launch_ns: u64,
    exposure: serde_json::Value,
    charged: (f64, f64),
) -> Snapshot {
    let mut s = crate::tui::fixture::empty();
    s.agent.launch_probes = LaunchProbes::Sampled {
        window: std::time::Duration::from_millis(50),
        period: std::time::Duration::from_secs(1),
    };
    let exposure: Exposure = serde_json::from_value(exposure).unwrap();
    s.agent.sampling = Some(SamplingStatus {
        budget_share: 0.01,
        window_seconds: 0.05,
        kinds: vec![KindSampling {
            kind: "launch".into(),
            duty: 0.05,
            rate_per_second: 200_000.0,
            attached_seconds: probed as f64 / 200_000.0,
        }],
        exposure: [(1, [("launch".to_owned(), exposure)].into())].into(),
    });
    let cost: ProbeCost = serde_json::from_value(json!({
        "target": "self:vgpu_calibrate_push", "prologue": "push", "calls": 1000,
        "unprobed_ns": 300.0, "per_hit_ns": 2000.0, "inband_ns": 1000.0,
        "last_per_hit_ns": 2000.0,
        "charged_ns": {"1": charged.0}, "charged_se_ns": {"1": charged.1},
    }))
    .unwrap();
    s.agent.probe_cost = Some(cost);
    let mut p = crate::model::Process::with_apis(vec![ApiUsage {
        api: "cuLaunchKernel".into(),
        kind: "launch".into(),
        source: Source::Probes,
        calls: probed,
        errors: 0,
        bytes: 0,
        total_ns: probed * launch_ns,
        hook_ns: 0,
        denied: 0,
        hist: vec![],
        latency: None,
        probed: None,
    }]);
    p.key.start_ticks = 0;
    s.processes = vec![p];
    s
}

/// `launch_ns`: each launch as the probes measured it (the price of a hit is 2 us, 1 us of it
/// in-band). 50,000 launches probed in windows, 950,000 estimated for the gaps by pace from 11
/// windows whose successive differences give a variance of `sq_diff / 20` (calls/s)^2, over gaps
/// whose squared weights sum to 1 s^2.
fn report(sq_diff: f64, launch_ns: u64) -> AttributionReport {
    report_by_pace(
        json!({"pairs": 10, "sq_diff": sq_diff, "weight_sq": 1.0, "own_seconds": 0.25}),
        launch_ns,
    )
}

/// The report of 50,000 launches probed in windows and 950,000 estimated for the gaps by pace,
/// the pace windows' spread `pace`, each launch `launch_ns` as the probes measured it, charged at
/// 2 us a hit with a 5% spread.
fn report_by_pace(pace: serde_json::Value, launch_ns: u64) -> AttributionReport {
    let first = snapshot(
        0,
        launch_ns,
        json!({"probed_calls": 0, "estimated_calls": 0.0}),
        (0.0, 0.0),
    );
    let last = snapshot(
        50_000,
        launch_ns,
        json!({
            "probed_calls": 50_000, "estimated_calls": 1_000_000.0,
            "gap_calls_by_pace": 950_000.0, "pace": pace,
        }),
        (50_000.0 * 2_000.0, 50_000.0 * 100.0),
    );
    build(
        &first,
        &last,
        "in_process",
        10.0,
        &Filter::default(),
        |_| None,
    )
}

#[test]
fn an_unsure_estimate_is_marked_in_the_json_the_table_and_the_html() {
    // Standard error 150,000 calls: 15% of the estimate; launches of 5 us.
    let r = report(20.0 * 150_000f64.powi(2), 5_000);
    let p = &r.processes[0];
    let launch = &p.apis[0];
    assert_eq!(
        (launch.calls, launch.measured_by.as_str()),
        (1_000_000, "probes_sampled")
    );
    let u = launch.calls_uncertainty.unwrap();
    assert!(
        (u.relative.unwrap() - 0.15).abs() < 1e-9 && u.marked,
        "{u:?}"
    );
    assert!(p.uncertainty["driver"].marked);
    assert!(r.totals_uncertainty["driver"].marked);
    assert!(r.containers[0].uncertainty["driver"].marked);
    // The probe cost: charged at prices 5% unsure, and a hit on the probed function unsure by
    // a quarter of its price beyond that (in quadrature: 25.5%).
    let cost = p.uncertainty["probe_cost"];
    let relative = 0.05f64.hypot(0.25);
    assert!((cost.relative.unwrap() - relative).abs() < 1e-9 && cost.marked);
    let per_call = r.sampling.probe_cost_per_call_uncertainty.unwrap();
    assert!((per_call.standard_error.unwrap() - 2_000.0 * relative).abs() < 1e-6);
    assert!(
        r.notes.iter().any(|n| n.contains("marked !")),
        "{:?}",
        r.notes
    );
    let json = serde_json::to_value(&r).unwrap();
    let row = &json["processes"][0]["apis"][0];
    assert_eq!(row["calls_uncertainty"]["marked"], true);
    // The time: the count's 15%, and the in-band correction (a quarter of a 2 us hit in each
    // 4 us launch: 12.5%).
    assert!((row["seconds_uncertainty"]["relative"].as_f64().unwrap() - 0.275).abs() < 1e-9);
    assert_eq!(
        json["processes"][0]["uncertainty"]["driver"]["marked"],
        true
    );
    let text = super::super::table(&r);
    assert!(text.contains("±15%!"), "{text}");
    assert!(text.contains("1000000 ±15%!"), "{text}");
    let html = super::super::html::render(&r);
    assert!(html.contains("<span class=unsure title") && html.contains("±15%!"));
    assert!(html.contains("How sure these figures are"));
}

#[test]
fn a_sure_estimate_shows_its_uncertainty_unmarked() {
    // 2%, launches of 50 us: the in-band correction is 1% of each.
    let r = report(20.0 * 20_000f64.powi(2), 50_000);
    let p = &r.processes[0];
    let u = p.apis[0].calls_uncertainty.unwrap();
    assert!((u.relative.unwrap() - 0.02).abs() < 1e-9 && !u.marked);
    let s = p.apis[0].seconds_uncertainty.unwrap();
    assert!((s.relative.unwrap() - (0.02 + 500.0 / 49_000.0)).abs() < 1e-9 && !s.marked);
    assert!(!p.uncertainty["driver"].marked && !r.totals_uncertainty["driver"].marked);
    let text = super::super::table(&r);
    assert!(text.contains("±2%") && !text.contains("±2%!"), "{text}");
    // The probe cost alone is marked: what a hit costs the probed function is a quarter of
    // its price unsure, whatever the sampling.
    assert!(p.uncertainty["probe_cost"].marked);
    let marked: Vec<&String> = p
        .uncertainty
        .iter()
        .filter(|(_, u)| u.marked)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(marked, ["probe_cost"]);
    // In the HTML: the cost per probed call in the header and the probe cost's row.
    let html = super::super::html::render(&r);
    assert_eq!(
        html.matches("<span class=unsure title").count(),
        2,
        "{html}"
    );
    assert!(html.contains("each probed call cost 2000 ns <span class=unsure"));
}

#[test]
fn a_recording_without_uncertainty_still_reads_as_a_baseline() {
    let r = report(0.0, 5_000);
    let mut json = serde_json::to_value(&r).unwrap();
    // As written before estimates carried their uncertainty.
    json.as_object_mut().unwrap().remove("totals_uncertainty");
    for p in json["processes"].as_array_mut().unwrap() {
        p.as_object_mut().unwrap().remove("uncertainty");
        for a in p["apis"].as_array_mut().unwrap() {
            a.as_object_mut().unwrap().remove("calls_uncertainty");
            a.as_object_mut().unwrap().remove("seconds_uncertainty");
        }
    }
    let back: AttributionReport = serde_json::from_value(json).unwrap();
    assert!(back.processes[0].uncertainty.is_empty());
    assert_eq!(back.totals, r.totals);
}

/// A pace estimate rests on the price of a hit: the windows' own time is what is left of them
/// once the hits are taken out. Its count carries the price's error (the prices' 5% spread and
/// a quarter of the price on the probed function, in quadrature) times probe time over own time.
#[test]
fn a_pace_estimate_carries_the_price_of_a_hit() {
    let r = report_by_pace(
        json!({"pairs": 10, "sq_diff": 0.0, "weight_sq": 1.0,
               "probe_seconds": 0.05, "own_seconds": 0.25}),
        5_000,
    );
    let u = r.processes[0].apis[0].calls_uncertainty.unwrap();
    let expected = 950_000.0 * 0.05 / 0.25 * 0.05f64.hypot(0.25);
    assert!(
        (u.standard_error.unwrap() - expected).abs() < 1e-6,
        "{u:?} vs {expected}"
    );
    // 4.8% of the estimate, where without the price it would be exact (no spread).
    assert!(
        (u.relative.unwrap() - 0.0484).abs() < 1e-4 && !u.marked,
        "{u:?}"
    );
}
