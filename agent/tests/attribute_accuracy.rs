//! How close `vgpu-agent attribute` comes to known truths on this machine: the accuracy
//! benchmark, not part of CI (every test here is `#[ignore]`d: their figures move with the load
//! of the machine, and CI checks only what cannot move, in `attribute.rs` and
//! `attribute_sampling.rs`). Run with `cargo xtask bench attribute` (root). Each test makes one
//! measurement, prints `ACCURACY` lines (attributed, truth, % off, and the uncertainty the report
//! gave the figure) and fails when a figure is further off than its tolerance: no retries, a
//! miss is a reading to look at.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{attribute::*, *};

/// Delayed driver calls, copies and device work waited for, every call probed: the truth of a
/// delayed call is its time inside the simulated driver, as the driver measured it in the same
/// run (with whatever the machine took from it meanwhile, as the attributed time has).
#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_driver_copy_and_sync_time() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 1000;
    let workloads = delayed_calls_copies_and_a_sync(&lib, dir.path(), CALLS);
    let Recording { pids, made, report } = record(workloads, &lib, &["--probe-budget", "off"]);
    let inside = |i: usize| num(&made[i]["inside_total_ns"]) / 1e9;
    let offs = [
        accuracy(
            "driver time (cuMemAlloc_v2, 45 us delays)",
            num(&process(&report, pids[0])["components"]["driver"]),
            inside(0),
            None,
        ),
        accuracy(
            "copy time (cuMemcpyHtoD_v2, 30 us delays)",
            num(&process(&report, pids[1])["components"]["copy_wait"]),
            inside(1),
            None,
        ),
        accuracy(
            "sync wait (cuCtxSynchronize on 50 ms of device work)",
            num(&process(&report, pids[2])["components"]["sync_wait"]),
            0.050 - num(&made[2]["launch_ns"]) / 1e9,
            None,
        ),
    ];
    assert!(offs.iter().all(|o| *o <= 0.10), "{offs:?}");
}

/// The limiter's hook delayed 20 us per launch: the truth is the delay asked for.
#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_a_known_limiter_hook_delay() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 20_000;
    const DELAY_NS: u64 = 20_000;
    let delay = DELAY_NS.to_string();
    let RecordedWorkload { pid, report, .. } = record_limited_launches(
        dir.path(),
        &lib,
        LAUNCHES,
        &[("VGPU_DEBUG_HOOK_DELAY_NS", &delay)],
        &[],
    );
    let off = accuracy(
        "limiter hook self-time (20 us x 20,000 launches)",
        num(&process(&report, pid)["components"]["limiter_hook"]),
        (LAUNCHES * DELAY_NS) as f64 / 1e9,
        None,
    );
    assert!(off <= 0.10);
}

/// The slowdown the probes cause against the probe cost attributed: seven unprobed and seven
/// probed runs of 20,000 `cuStreamSynchronize` interleaved in one recording; the truth is the
/// median over the rounds of each probed run's median call less the unprobed run's before it.
#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_the_probe_cost() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    // The same simulated driver under a name the agent never probes (not `libcuda.so*`).
    let unprobed = dir.path().join("native/libsimnative.so.1");
    std::fs::create_dir_all(unprobed.parent().unwrap()).unwrap();
    std::fs::copy(&lib, &unprobed).unwrap();
    const CALLS: u64 = 20_000;
    const ROUNDS: usize = 7;
    let args = [
        "latency",
        "--api",
        "cuStreamSynchronize",
        "--calls",
        "20000",
        "--init",
    ];
    let p50 = |v: &Value| num(&v["p50_ns"]);
    let probed_run = |round: usize| {
        let d = dir.path().join(format!("probed-{round}"));
        std::fs::create_dir_all(&d).unwrap();
        let mut cmd = exercise(&lib);
        cmd.args(["--linger-ms", "300"]).args(args);
        Workload::start(cmd, &d)
    };
    let mut next = Some(probed_run(0));
    let stat = start_recording(&lib, &["--probe-budget", "off"]);
    let (mut native, mut probed, mut pids) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let out = exercise(&unprobed).args(args).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        native.push(p50(
            &serde_json::from_str(text.lines().last().unwrap()).unwrap()
        ));
        let w = next.take().unwrap_or_else(|| {
            let w = probed_run(round);
            // Seen by a poll (every 100 ms) before it runs.
            std::thread::sleep(Duration::from_millis(300));
            w
        });
        pids.push(w.pid());
        w.go();
        probed.push(p50(&w.finish()));
    }
    let report = stat.finish();
    let attributed: Vec<f64> = pids
        .iter()
        .map(|pid| {
            num(&process(&report, *pid)["components"]["probe_cost"]) * 1e9 / (CALLS + 1) as f64
        })
        .collect();
    eprintln!(
        "unprobed p50s {native:?}, probed p50s {probed:?}, attributed ns/call {attributed:?}"
    );
    let paired: Vec<f64> = probed.iter().zip(&native).map(|(p, n)| p - n).collect();
    let off = accuracy(
        "probe cost per probed call, ns",
        median(attributed),
        median(paired),
        Some(&report["sampling"]["probe_cost_per_call_uncertainty"]),
    );
    assert!(off <= 0.10);
}

/// 1M launches of 3 us under a 2% budget, 10 ms windows (`sync_every`: a cuCtxSynchronize after
/// that many): the scaled count against the launches made, the driver time against the time the
/// simulated driver measured inside them.
fn sampled_launches(sync_every: u64) {
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
    let launch = api_of(process(&report, pid), "cuLaunchKernel").unwrap();
    eprintln!("sampling {}", report["sampling"]);
    let how = if sync_every == 0 { "pace" } else { "reference" };
    let count = accuracy(
        &format!("sampled launch count (by {how})"),
        num(&launch["calls"]),
        LAUNCHES as f64,
        Some(&launch["calls_uncertainty"]),
    );
    let time = accuracy(
        &format!("sampled launch driver time (by {how})"),
        num(&launch["seconds"]),
        num(&made["inside_total_ns"]) / 1e9,
        Some(&launch["seconds_uncertainty"]),
    );
    eprintln!(
        "ACCURACY probe cost share {:.2}% (budget 2%)",
        num(&report["sampling"]["probe_cost_share"]) * 100.0
    );
    assert!(count <= 0.10 && time <= 0.15, "count {count}, time {time}");
}

#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_sampled_launches_by_pace() {
    sampled_launches(0);
}

#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_sampled_launches_by_reference() {
    sampled_launches(64);
}

/// The same launches under the limiter, every other one made straight to the simulated driver
/// past it (and past the probes): the limiter's count is exact, and its driver time is checked
/// against the direct launches' time measured beside the hooked ones (their mean times the hooked
/// launches), the truth `scripts/gpu/validate-attribute.sh` uses on the real driver. The time the
/// simulated driver measures inside itself starts after its own entry work, so it is printed but
/// is not the truth for a timing around the call. Twice: with the default sampling window (50 ms)
/// and with 10 ms windows, five times as many attaches and detaches of the launch probes, whose
/// cost to the launching thread lands inside the limiter's timing (docs/attribute.md,
/// "Accuracy"); the goal (5%) is held at the default.
#[test]
#[ignore = "accuracy benchmark: cargo xtask bench attribute"]
fn accuracy_of_launches_under_the_limiter() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    const LAUNCHES: u64 = 1_000_000;
    let mut at_default = None;
    for window in ["50ms", "10ms"] {
        let dir = tempdir();
        let lib = sim_lib(&dir.path().join("lib"));
        let RecordedWorkload { pid, made, report } =
            record_delayed_launches_beside_direct_ones(dir.path(), &lib, LAUNCHES, window);
        let launch = api_of(process(&report, pid), "cuLaunchKernel").unwrap();
        let direct = &made["direct"];
        let hooked = num(&direct["hooked"]);
        let count = accuracy(
            &format!("launch count under the limiter ({window} windows)"),
            num(&launch["calls"]),
            hooked,
            None,
        );
        let time = accuracy(
            &format!("launch driver time under the limiter ({window} windows)"),
            num(&launch["seconds"]),
            num(&direct["mean_ns"]) * hooked / 1e9,
            Some(&launch["seconds_uncertainty"]),
        );
        println!(
            "ACCURACY (for reference, {window} windows) the simulated driver's own time inside all {LAUNCHES} launches: {:.6} s; launch probes attached {:.2} s",
            num(&made["inside_total_ns"]) / 1e9,
            num(&report["sampling"]["launch_probe_seconds"])
        );
        assert_eq!(count, 0.0, "{window}");
        at_default.get_or_insert(time);
    }
    let time = at_default.unwrap();
    assert!(time <= 0.05, "default window: {time}");
}
