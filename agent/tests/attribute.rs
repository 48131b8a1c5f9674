//! `vgpu-agent attribute` against what the simulated driver and the limiter make happen (root,
//! real probes): delayed driver calls, copies and device work that a synchronisation waits for,
//! a known limiter hook delay, an SM throttle, and a launch loop under the limiter. Each check
//! is one that holds on any machine however loaded: exact counts, which component a figure lands
//! in, that the figures add up, and bounds that nesting makes certain (see
//! `support/attribute.rs`). How close the figures come to their truths is measured by
//! `cargo xtask bench attribute` (`attribute_accuracy.rs`) and on the GPU machine
//! (`scripts/gpu/validate-attribute.sh`). The probes' own cost and sampling under a budget are
//! in `attribute_sampling.rs`.

mod support;

use support::{attribute::*, *};

/// Three workloads one after another, every call probed: 1,000 `cuMemAlloc_v2` delayed 45 us in
/// the driver, 1,000 `cuMemcpyHtoD_v2` delayed 30 us, and 50 launches of 1 ms of device work
/// that one `cuCtxSynchronize` waits for.
#[test]
fn delayed_calls_copies_and_waits_land_in_their_components_with_exact_counts() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 1000;
    let workloads = delayed_calls_copies_and_a_sync(&lib, dir.path(), CALLS);
    let out = dir.path().join("report");
    let Recording { pids, made, report } = record(
        workloads,
        &lib,
        &["--out", out.to_str().unwrap(), "--probe-budget", "off"],
    );
    assert_consistent(&report);
    assert_written(&report, &out, "cuMemAlloc_v2");
    // Each delayed call's time as the probes measured it (the attributed time and the in-band
    // part of the hits taken out of it): at least what the driver measured inside the calls, at
    // most what the application measured around them.
    for (i, api, component, other) in [
        (0, "cuMemAlloc_v2", "driver", "copy_wait"),
        (1, "cuMemcpyHtoD_v2", "copy_wait", "sync_wait"),
    ] {
        let p = process(&report, pids[i]);
        let row = api_of(p, api).unwrap_or_else(|| panic!("{api} in {p:#}"));
        assert_eq!(row["calls"], CALLS, "{row}");
        assert_eq!(row["measured_by"], "probes");
        assert!(row.get("calls_uncertainty").is_none(), "exact: {row}");
        // Its time is only as sure as the in-band correction: a hit's price on the probed
        // function.
        assert!(
            row["seconds_uncertainty"]["standard_error"].as_f64() > Some(0.0),
            "{row}"
        );
        let seconds = num(&row["seconds"]);
        let probed = seconds + num(&row["probe_inband_seconds"]);
        let inside = num(&made[i]["inside_total_ns"]) / 1e9;
        let around = num(&made[i]["total_ns"]) / 1e9;
        assert!(
            probed >= inside && probed <= around,
            "{api}: attributed {seconds} s + in band = {probed} s, inside the driver {inside} s, around the call {around} s"
        );
        assert!(num(&p["components"][component]) >= seconds, "{p:#}");
        assert_eq!(num(&p["components"][other]), 0.0, "{p:#}");
        // Every probed call (and cuInit) was charged at the calibrated price.
        assert!(num(&p["components"]["probe_cost"]) > 0.0);
        assert!(p["uncertainty"]["probe_cost"]["standard_error"].is_number());
    }
    // The synchronisation waits for the device work (50 ms) less the time the launches took.
    let s = process(&report, pids[2]);
    let ctx_sync = api_of(s, "cuCtxSynchronize").expect("cuCtxSynchronize");
    assert_eq!(ctx_sync["calls"], 1);
    let wait = num(&ctx_sync["seconds"]) + num(&ctx_sync["probe_inband_seconds"]);
    let launch_s = num(&made[2]["launch_ns"]) / 1e9;
    let sync_s = num(&made[2]["sync_ns"]) / 1e9;
    assert!(
        wait >= 0.050 - launch_s && wait <= sync_s,
        "sync wait as probed {wait} s: device work 0.050 s, launches took {launch_s} s, the call {sync_s} s"
    );
    assert!(num(&s["components"]["sync_wait"]) >= num(&ctx_sync["seconds"]));
    assert!(
        report["sampling"]["probe_cost_per_call_ns"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

/// The limiter's hook delayed 20 us per launch (`VGPU_DEBUG_HOOK_DELAY_NS`, a busy-wait it
/// times itself): all of it in `limiter_hook`, at least the delay asked for each launch, and the
/// launches counted exactly by the limiter.
#[test]
fn a_known_limiter_hook_delay_lands_in_the_limiter_hook() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 20_000;
    const DELAY_NS: u64 = 20_000;
    let delay = DELAY_NS.to_string();
    let RecordedWorkload { pid, made, report } = record_limited_launches(
        dir.path(),
        &lib,
        LAUNCHES,
        &[("VGPU_DEBUG_HOOK_DELAY_NS", &delay)],
        &[],
    );
    assert_consistent(&report);
    let p = process(&report, pid);
    let launch = api_of(p, "cuLaunchKernel").expect("launches in the report");
    assert_eq!(
        (launch["calls"].as_u64(), launch["measured_by"].as_str()),
        (Some(LAUNCHES), Some("limiter")),
        "{launch}"
    );
    let hook = num(&p["components"]["limiter_hook"]);
    let loop_s = (num(&made["launch_mean_ns"]) + 1.0) * LAUNCHES as f64 / 1e9;
    assert!(
        hook >= (LAUNCHES * DELAY_NS) as f64 / 1e9 && hook <= loop_s,
        "hook {hook} s for {LAUNCHES} x {DELAY_NS} ns in a loop of {loop_s} s"
    );
    // Most of it in the launches' hook (the other calls' hooks have no delay).
    assert!(num(&launch["hook_seconds"]) >= (LAUNCHES * DELAY_NS) as f64 / 1e9);
    assert!(num(&launch["hook_seconds"]) <= hook);
}

/// Launches held to a 50% SM share (20,000 launches of 50 us of device work): the limiter's
/// throttled time lands in `throttled`, more than a quarter of the device work (at 50% it holds
/// the launches back about as long as the work) and less than the loop took.
#[test]
fn a_known_throttle_lands_in_throttled() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 20_000;
    let RecordedWorkload { pid, made, report } = record_limited_launches(
        dir.path(),
        &lib,
        LAUNCHES,
        &[("SIMCUDA_LAUNCH_US", "50"), ("CUDA_DEVICE_SM_LIMIT", "50")],
        &[],
    );
    assert_consistent(&report);
    let p = process(&report, pid);
    let throttled = num(&p["components"]["throttled"]);
    let device_s = LAUNCHES as f64 * 50e-6;
    let loop_s = (num(&made["launch_mean_ns"]) + 1.0) * LAUNCHES as f64 / 1e9;
    assert!(
        throttled > device_s / 4.0 && throttled <= loop_s,
        "throttled {throttled} s; device work {device_s} s; the loop took {loop_s} s"
    );
    assert!(
        p.get("uncertainty")
            .is_none_or(|u| u.get("throttled").is_none()),
        "exact"
    );
}

/// A launch loop under the limiter with launch probes sampled under a budget: the launch figures
/// are the limiter's (its exact count, its timing of the driver call less the probe hits in
/// it), not the sampled probes' estimate. The probes sample its launches only until the agent has
/// seen its region slot (from then on they take no probe trap); what they charged before is taken
/// out of the limiter's timing. The driver time is at least what the simulated driver measured
/// inside the launches, less the probe cost charged, and at most what the loop took.
#[test]
fn under_the_limiter_launch_figures_are_its_exact_count_and_timing() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 200_000;
    let RecordedWorkload { pid, made, report } =
        record_delayed_launches_under_the_limiter(dir.path(), &lib, LAUNCHES);
    assert_consistent(&report);
    let p = process(&report, pid);
    let launch = api_of(p, "cuLaunchKernel").expect("launches in the report");
    assert_eq!(launch["calls"], LAUNCHES, "{launch}");
    assert_eq!(launch["measured_by"], "limiter", "{launch}");
    assert!(launch.get("calls_uncertainty").is_none(), "exact: {launch}");
    let probe_cost = num(&p["components"]["probe_cost"]);
    assert!(probe_cost >= 0.0);
    let seconds = num(&launch["seconds"]);
    let inside = num(&made["inside_total_ns"]) / 1e9;
    let loop_s = (num(&made["launch_mean_ns"]) + 1.0) * LAUNCHES as f64 / 1e9;
    assert!(
        seconds >= 0.9 * inside - probe_cost && seconds <= loop_s,
        "launch driver time {seconds} s: inside the driver {inside} s, probe cost {probe_cost} s, loop {loop_s} s"
    );
}
