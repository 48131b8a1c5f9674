//! The report built from two generated snapshots: a sampled estimate and a probe cost carry
//! their uncertainty into the JSON, the table and the HTML, marked where over 10%.

use serde_json::json;

use super::*;
use crate::model::{
    ApiUsage, Source,
    probing::{Exposure, KindSampling, LaunchProbes, ProbeCost, SamplingStatus},
};

/// A snapshot of one process (pid 1) that made `probed` probed launches of 5 us each, whose
/// launches the schedule estimated as `exposure`, and that was charged `charged` ns of probe
/// cost with that standard error.
fn snapshot(probed: u64, exposure: serde_json::Value, charged: (f64, f64)) -> Snapshot {
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
        total_ns: probed * 5_000,
        hook_ns: 0,
        denied: 0,
        hist: vec![],
        latency: None,
    }]);
    p.key.start_ticks = 0;
    s.processes = vec![p];
    s
}

fn report(sq_diff: f64) -> AttributionReport {
    let first = snapshot(
        0,
        json!({"probed_calls": 0, "estimated_calls": 0.0}),
        (0.0, 0.0),
    );
    // 50,000 launches probed in windows, 950,000 estimated for the gaps by pace from 11 windows
    // whose successive differences give a variance of `sq_diff / 20` (calls/s)^2, over gaps
    // whose squared weights sum to 1 s^2.
    let last = snapshot(
        50_000,
        json!({
            "probed_calls": 50_000, "estimated_calls": 1_000_000.0,
            "gap_calls_by_pace": 950_000.0,
            "pace": {"pairs": 10, "sq_diff": sq_diff, "weight_sq": 1.0, "own_seconds": 0.25},
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
    // Standard error 150,000 calls: 15% of the estimate.
    let r = report(20.0 * 150_000f64.powi(2));
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
    // The probe cost: charged at prices 5% unsure.
    let cost = p.uncertainty["probe_cost"];
    assert!((cost.relative.unwrap() - 0.05).abs() < 1e-9 && !cost.marked);
    let per_call = r.sampling.probe_cost_per_call_uncertainty.unwrap();
    assert!((per_call.standard_error.unwrap() - 100.0).abs() < 1e-6);
    assert!(
        r.notes.iter().any(|n| n.contains("marked !")),
        "{:?}",
        r.notes
    );
    let json = serde_json::to_value(&r).unwrap();
    let row = &json["processes"][0]["apis"][0];
    assert_eq!(row["calls_uncertainty"]["marked"], true);
    assert!((row["seconds_uncertainty"]["relative"].as_f64().unwrap() - 0.15).abs() < 1e-9);
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
    // 2%.
    let r = report(20.0 * 20_000f64.powi(2));
    let u = r.processes[0].apis[0].calls_uncertainty.unwrap();
    assert!((u.relative.unwrap() - 0.02).abs() < 1e-9 && !u.marked);
    assert!(!r.notes.iter().any(|n| n.contains("marked !")));
    let text = super::super::table(&r);
    assert!(text.contains("±2%") && !text.contains("±2%!"), "{text}");
    assert!(!super::super::html::render(&r).contains("<span class=unsure title"));
}

#[test]
fn a_recording_without_uncertainty_still_reads_as_a_baseline() {
    let r = report(0.0);
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
