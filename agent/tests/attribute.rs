//! `vgpu-agent attribute` against known truths (root, real probes, simulated driver): time spent
//! in the simulated driver's delayed calls (busy-waits; the truth is the time the driver itself
//! measured inside those calls in the same run, which includes what the machine took from them
//! meanwhile, as the attributed time does), device work that a synchronisation must wait for, a
//! known limiter hook delay and a known SM throttle. The probes' own cost and sampling under a
//! budget are in `attribute_sampling.rs`; what both share is `support/attribute.rs`.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{attribute::*, *};

#[test]
fn driver_copy_and_sync_time_are_attributed_within_ten_percent() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 1000;
    // The nominal time of the delayed calls: calls x (injected busy-wait + the simulated
    // driver's own time per call), a lower bound of the truth (see `inside` below).
    let (alloc_own, copy_own) = (
        sim_own_ns(&lib, "cuMemAlloc_v2"),
        sim_own_ns(&lib, "cuMemcpyHtoD_v2"),
    );
    let calls = CALLS.to_string();
    measured_each(|| {
        let run = dir.path().join(format!("run-{}", rand_suffix()));
        let mut alloc = exercise(&lib);
        alloc.env("SIMCUDA_DELAY_US", "cuMemAlloc_v2=45").args([
            "--linger-ms",
            "300",
            "latency",
            "--api",
            "cuMemAlloc_v2",
            "--calls",
            &calls,
            "--init",
        ]);
        let mut copy = exercise(&lib);
        copy.env("SIMCUDA_DELAY_US", "cuMemcpyHtoD_v2=30").args([
            "--linger-ms",
            "300",
            "latency",
            "--api",
            "cuMemcpyHtoD_v2",
            "--calls",
            &calls,
            "--init",
        ]);
        // 50 launches of 1 ms of simulated device work, then one cuCtxSynchronize that waits for
        // all of it (less the little time the launches took).
        let mut sync = exercise(&lib);
        sync.env("SIMCUDA_LAUNCH_US", "1000").args([
            "--linger-ms",
            "300",
            "launches",
            "--count",
            "50",
        ]);
        let workloads: Vec<Workload> = [alloc, copy, sync]
            .into_iter()
            .enumerate()
            .map(|(i, cmd)| {
                let d = run.join(format!("w{i}"));
                std::fs::create_dir_all(&d).unwrap();
                Workload::start(cmd, &d)
            })
            .collect();
        let out = run.join("report");
        // Every call probed (no budget): these checks compare exact totals.
        let mut stat = Stat::from_command(attribute_cmd(&[
            "--out",
            out.to_str().unwrap(),
            "--probe-budget",
            "off",
        ]));
        stat.wait_for(&attached(&lib), Duration::from_secs(20));
        stat.wait_for("recording for", Duration::from_secs(20));
        let pids: Vec<u32> = workloads.iter().map(|w| w.pid()).collect();
        // One at a time: busy-waiting workloads side by side would preempt each other.
        let made: Vec<Value> = workloads
            .into_iter()
            .map(|w| {
                w.go();
                w.finish()
            })
            .collect();
        let report = stat.finish();
        assert_eq!(report["schema"], "vgpu-agent.attribute/v1");
        // The report files are there and say the same.
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap())
                .unwrap();
        assert_eq!(written["processes"], report["processes"]);
        let html = std::fs::read_to_string(out.join("report.html")).unwrap();
        assert!(html.contains("<svg") && html.contains("cuMemAlloc_v2"));

        let a = process_of(&report, pids[0]);
        let c = process_of(&report, pids[1]);
        let s = process_of(&report, pids[2]);
        let launch_s = made[2]["launch_ns"].as_f64().unwrap() / 1e9;
        // The truth of the delayed calls: their time inside the simulated driver, as it measured
        // it (with whatever the machine took from them meanwhile, which is attributed too); the
        // nominal time (calls x (delay + the driver's own median)) bounds it from below.
        let inside = |i: usize, nominal: f64| {
            let t = made[i]["inside_total_ns"].as_f64().unwrap() / 1e9;
            assert!(t >= nominal * 0.95, "inside {t}s, nominal {nominal}s");
            t
        };
        let checks = [
            within(
                a["components"]["driver"].as_f64().unwrap(),
                inside(0, CALLS as f64 * (45e-6 + alloc_own / 1e9)),
                0.10,
                "driver time (cuMemAlloc_v2)",
            ),
            within(
                c["components"]["copy_wait"].as_f64().unwrap(),
                inside(1, CALLS as f64 * (30e-6 + copy_own / 1e9)),
                0.10,
                "copy time (cuMemcpyHtoD_v2)",
            ),
            within(
                s["components"]["sync_wait"].as_f64().unwrap(),
                0.050 - launch_s,
                0.10,
                "sync wait (cuCtxSynchronize)",
            ),
        ];
        // Probe cost: the probed calls at the cost re-measured around them, close to the
        // window's mean cost per call (its accuracy is the last test's).
        let per_call = report["sampling"]["probe_cost_per_call_ns"]
            .as_f64()
            .unwrap();
        let probe_cost = a["components"]["probe_cost"].as_f64().unwrap();
        let expected = (CALLS + 1) as f64 * per_call / 1e9;
        assert!(
            per_call > 0.0 && probe_cost > expected / 2.0 && probe_cost < expected * 2.0,
            "{probe_cost} for {} calls at {per_call} ns",
            CALLS + 1
        );
        checks
    });
}

#[test]
fn a_known_limiter_hook_delay_is_attributed_to_the_limiter() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 20_000;
    const DELAY_NS: u64 = 20_000;
    // The delay is a busy-wait timed by the limiter itself: time stolen from the vCPU while it
    // spins lengthens it, and 0.4 s of spinning read 2-85 % long on the test VM (2026-11-22,
    // sixth session; half the attempts within 10 %). Five attempts, not three.
    measured_n(5, || {
        let run = dir.path().join(format!("run-{}", rand_suffix()));
        let regions = run.join("regions");
        std::fs::create_dir_all(&regions).unwrap();
        let mut cmd = exercise(&lib);
        cmd.env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", &lib)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "8g")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"))
            .env("VGPU_DEBUG_HOOK_DELAY_NS", DELAY_NS.to_string())
            // Linger past the next poll: the limiter retires its region slot at exit.
            .args([
                "--linger-ms",
                "1000",
                "launch-loop",
                "--count",
                &LAUNCHES.to_string(),
            ]);
        let workload = Workload::start(cmd, &run);
        let mut stat =
            Stat::from_command(attribute_cmd(&["--region-dir", regions.to_str().unwrap()]));
        stat.wait_for(&attached(&lib), Duration::from_secs(20));
        stat.wait_for("recording for", Duration::from_secs(20));
        let pid = workload.pid();
        workload.go();
        let _ = workload.finish();
        let report = stat.finish();
        let p = process_of(&report, pid);
        let launch = api_of(p, "cuLaunchKernel").expect("launches in the report");
        assert_eq!(
            (launch["calls"].as_u64(), launch["measured_by"].as_str()),
            (Some(LAUNCHES), Some("limiter")),
            "{launch}"
        );
        within(
            p["components"]["limiter_hook"].as_f64().unwrap(),
            (LAUNCHES * DELAY_NS) as f64 / 1e9,
            0.10,
            "limiter hook self-time",
        )
    });
}

#[test]
fn a_known_throttle_is_attributed_within_ten_percent() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const LAUNCHES: u64 = 20_000;
    // Each launch is 50 us of simulated device work: unthrottled, the loop only enqueues it
    // (a few us a launch, longer in all than the controller's first window); held to a 50% SM
    // share, the limiter drains the queue when the window closes and holds launches as long
    // again, so the loop takes about 2 x 1 s.
    let limited = |regions: &std::path::Path, sm_limit: Option<&str>| {
        let mut cmd = exercise(&lib);
        cmd.env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", &lib)
            .env("SIMCUDA_LAUNCH_US", "50")
            .env("CUDA_DEVICE_MEMORY_LIMIT", "8g")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"));
        if let Some(l) = sm_limit {
            cmd.env("CUDA_DEVICE_SM_LIMIT", l);
        }
        cmd
    };
    let loop_ns = |v: &Value| v["launch_mean_ns"].as_f64().unwrap() * LAUNCHES as f64;
    measured(|| {
        let run = dir.path().join(format!("run-{}", rand_suffix()));
        // The truth: the throttled loop's time less the same loop's time unthrottled (under the
        // limiter too), the median of three unthrottled runs.
        let free: Vec<f64> = (0..3)
            .map(|i| {
                let regions = run.join(format!("free-{i}"));
                std::fs::create_dir_all(&regions).unwrap();
                let out = limited(&regions, None)
                    .args(["launch-loop", "--count", &LAUNCHES.to_string()])
                    .output()
                    .unwrap();
                assert!(out.status.success());
                let text = String::from_utf8_lossy(&out.stdout);
                loop_ns(&serde_json::from_str(text.lines().last().unwrap()).unwrap())
            })
            .collect();
        let regions = run.join("throttled");
        std::fs::create_dir_all(&regions).unwrap();
        let mut cmd = limited(&regions, Some("50"));
        // Linger past the next poll: the limiter retires its region slot at exit.
        cmd.args([
            "--linger-ms",
            "1000",
            "launch-loop",
            "--count",
            &LAUNCHES.to_string(),
        ]);
        let workload = Workload::start(cmd, &run);
        let mut stat =
            Stat::from_command(attribute_cmd(&["--region-dir", regions.to_str().unwrap()]));
        stat.wait_for(&attached(&lib), Duration::from_secs(20));
        stat.wait_for("recording for", Duration::from_secs(20));
        let pid = workload.pid();
        workload.go();
        let made = workload.finish();
        let report = stat.finish();
        let truth = (loop_ns(&made) - median(free)) / 1e9;
        assert!(truth > 0.2, "the SM limit slowed the loop: {truth} s");
        let p = process_of(&report, pid);
        within(
            p["components"]["throttled"].as_f64().unwrap(),
            truth,
            0.10,
            "throttled time",
        )
    });
}
