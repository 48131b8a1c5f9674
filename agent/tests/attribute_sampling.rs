//! `vgpu-agent attribute` under its probe budget (root, real probes, simulated driver): every
//! probed call counted and charged at the calibrated price, launch-heavy jobs sampled within the
//! budget and scaled back with a stated uncertainty, and sampling that survives a library whose
//! process exited. Only what holds on any machine is checked here (see `support/attribute.rs`);
//! how close the estimates come to the truth is `cargo xtask bench attribute`
//! (`attribute_accuracy.rs`), and on the real driver `scripts/gpu/validate-attribute.sh`. The
//! estimators themselves are tested in virtual time with exact expectations
//! (the unit tests of `agent/src/probes/sampling.rs` and `agent/src/probes/calibrate.rs`).

mod support;

use support::{attribute::*, *};

/// 20,000 probed `cuStreamSynchronize` with every call probed: each one counted, and the
/// process charged for its probed calls at the calibrated price, with the uncertainty of the
/// price.
#[test]
fn every_probed_call_is_counted_and_charged_at_the_calibrated_price() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 20_000;
    let mut cmd = exercise(&lib);
    cmd.args([
        "--linger-ms",
        "300",
        "latency",
        "--api",
        "cuStreamSynchronize",
        "--calls",
        &CALLS.to_string(),
        "--init",
    ]);
    let RecordedWorkload { pid, made, report } =
        record_one(cmd, dir.path(), &lib, &["--probe-budget", "off"]);
    assert_consistent(&report);
    let p = process(&report, pid);
    let sync = api_of(p, "cuStreamSynchronize").unwrap();
    assert_eq!(sync["calls"], CALLS);
    assert_eq!(sync["measured_by"], "probes");
    let probed: u64 = p["apis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(probed, CALLS + 1, "and cuInit");
    // Charged: its calls at the price of the moment (the report's cost per probed call is over
    // every process in the window, other tests' included).
    assert!(num(&p["components"]["probe_cost"]) > 0.0);
    assert!(
        p["uncertainty"]["probe_cost"]["standard_error"].is_number(),
        "{p:#}"
    );
    assert!(num(&report["sampling"]["probe_cost_per_call_ns"]) > 0.0);
    // The simulated driver's entry points start with `push %rbp`: charged at that class.
    assert!(num(&report["sampling"]["probe_cost_per_class_ns"]["push"]) > 0.0);
    let u = &report["sampling"]["probe_cost_per_call_uncertainty"];
    assert!(u["standard_error"].is_number(), "{u}");
    // The probes' time is within the application's: the synchronisations' attributed wait is
    // at most what the application measured around them.
    assert!(num(&sync["seconds"]) <= num(&made["total_ns"]) / 1e9);
}

#[test]
fn a_launch_heavy_job_is_sampled_under_the_probe_budget_and_scaled_back() {
    launch_heavy(0);
}

/// The same job with a synchronisation every 128 launches: the synchronisations fit the budget
/// whole (about 2,000 a second at 2-4 us a hit: under 1%, half the budget) and stay attached, a
/// window sees about 20 of them, and the detached gaps are estimated from them.
#[test]
fn a_launch_heavy_job_with_synchronisations_is_scaled_back_by_them() {
    launch_heavy(128);
}

/// 1M launches of 3 us of host time each (`sync_every`: a cuCtxSynchronize after every that
/// many, 0: none) under a 2% probe budget with 10 ms windows: launches are probed in windows
/// only, their count and time scaled back to an estimate with a stated uncertainty; the probes
/// cost a small share of the time (probed always, they would cost a third or more).
fn launch_heavy(sync_every: u64) {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 1_000_000;
    let RecordedWorkload { pid, made, report } = record_one(
        delayed_launch_loop(&lib, LAUNCHES, sync_every),
        dir.path(),
        &lib,
        &SAMPLED_2_PERCENT,
    );
    assert_consistent(&report);
    assert_eq!(report["sampling"]["budget_share"].as_f64(), Some(0.02));
    let p = process(&report, pid);
    let launch = api_of(p, "cuLaunchKernel").expect("launches in the report");
    assert_eq!(launch["measured_by"], "probes_sampled", "{launch}");
    let sampled = report["sampling"]["sampled_kinds"].as_array().unwrap();
    let launches = sampled
        .iter()
        .find(|k| k["kind"] == "launch")
        .unwrap_or_else(|| panic!("{:#}", report["sampling"]));
    assert!(num(&launches["duty"]) > 0.0, "{launches}");
    // Without synchronisations the gaps can only be estimated by pace.
    match LAUNCHES.checked_div(sync_every) {
        None => assert_eq!(num(&launches["gaps_by_reference"]), 0.0, "{launches}"),
        // With them, how much of the gaps they set depends on the load: a window must see
        // about 8 of them, and they must stay attached whole (a hit that costs over 5 us makes
        // them sampled too). The estimators' use of a reference is tested in virtual time.
        Some(made_syncs) => {
            let syncs = api_of(p, "cuCtxSynchronize").expect("synchronisations");
            if syncs["measured_by"] == "probes" {
                assert_eq!(syncs["calls"], made_syncs + 1, "{syncs}");
            }
        }
    }
    // The estimate is at least what the windows saw, and says how sure it is (a few dozen
    // windows: a standard error is known).
    let probed = num(&launch["probed_calls"]);
    assert!(probed > 0.0 && num(&launch["calls"]) >= probed, "{launch}");
    for key in ["calls_uncertainty", "seconds_uncertainty"] {
        assert!(launch[key]["standard_error"].is_number(), "{key}: {launch}");
    }
    // The time is as unsure as the count, and more: each probed launch's latency is corrected
    // by the in-band part of its hit, whose price on the probed function is itself unsure.
    let relative = |key: &str| num(&launch[key]["relative"]);
    assert!(
        relative("seconds_uncertainty") > relative("calls_uncertainty"),
        "{launch}"
    );
    assert!(
        p["uncertainty"]["driver"]["standard_error"].is_number(),
        "{p:#}"
    );
    // Within the budget give or take a misjudged rate or price, and far under what probing
    // every launch costs (a hit of 2-4 us on a launch of 3-4 us).
    let share = num(&report["sampling"]["probe_cost_share"]);
    assert!(
        share > 0.0 && share < 0.25,
        "probe cost {share} of the time"
    );
    // The sampled driver time is the probed launches' mean time times the estimate: as the
    // probes measured them (the in-band part of the hits added back), at least the 3 us delay
    // each.
    let scale = num(&launch["calls"]) / probed;
    let as_probed = num(&launch["seconds"]) / scale + num(&launch["probe_inband_seconds"]);
    assert!(
        as_probed >= probed * 3e-6,
        "{as_probed} s for {probed} probed launches"
    );
    assert!(num(&made["inside_total_ns"]) >= LAUNCHES as f64 * 3e3);
    // Every hit is counted and charged: the launches that met the breakpoint (as the process saw
    // its entry point before and after each call) are the probed calls and the unpaired hits at
    // the windows' edges (a return without its entry, an entry without its return), give or
    // take a call whose breakpoint came or went while it ran.
    let trapped = num(&made["trapped"]);
    let hits = probed + num(&p["unpaired_probe_hits"]);
    assert!(
        trapped > 0.0 && hits >= 0.97 * trapped && hits <= 1.01 * trapped + 100.0,
        "{hits} hits counted ({probed} probed calls), {trapped} launches trapped"
    );
}

/// A library attached through a process that exited (its `/proc/PID/map_files/...` entry is gone) is
/// dropped at the next switch of the sampled probes, and does not keep them from another
/// process's library: that one's launches are still sampled (probed in windows: its launch row
/// exists, from the sampled probes).
#[test]
fn a_library_whose_process_exited_does_not_stop_sampling_elsewhere() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    // Two copies: two files (inodes), each attached through its own process.
    let (lib_a, lib_b) = (
        sim_lib(&dir.path().join("a")),
        sim_lib(&dir.path().join("b")),
    );
    const LAUNCHES: u64 = 300_000;
    let run = dir.path().join("run");
    let (wa, wb) = (run.join("a"), run.join("b"));
    std::fs::create_dir_all(&wa).unwrap();
    std::fs::create_dir_all(&wb).unwrap();
    let mut first = exercise(&lib_a);
    first.args(["launch-loop", "--count", "1000"]);
    let first = Workload::start(first, &wa);
    let mut stat = start_recording(&lib_a, &SAMPLED_2_PERCENT);
    first.go();
    let _ = first.finish();
    let mut second = exercise(&lib_b);
    second.env("SIMCUDA_DELAY_US", "cuLaunchKernel=3").args([
        "--linger-ms",
        "300",
        "launch-loop",
        "--count",
        &LAUNCHES.to_string(),
    ]);
    let second = Workload::start(second, &wb);
    stat.wait_for(&attached(&lib_b), STARTUP);
    let pid = second.pid();
    second.go();
    let _ = second.finish();
    stat.wait_for("is gone: detached", STARTUP);
    let report = stat.finish();
    assert_consistent(&report);
    let launch = api_of(process(&report, pid), "cuLaunchKernel")
        .expect("the second process's launches were probed");
    assert_eq!(launch["measured_by"], "probes_sampled", "{launch}");
}
