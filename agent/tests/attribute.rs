//! `vgpu-agent attribute` against known truths (root, real probes, simulated driver): delays the
//! simulated driver injects (busy-waits, so they are exact), and device work that a
//! synchronisation must wait for. Every component must be within 10% of the truth.

mod support;

use std::{process::Command, time::Duration};

use serde_json::Value;
use support::*;

fn process_of(report: &Value, pid: u32) -> &Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} missing: {report:#}"))
}

fn within(got: f64, truth: f64, what: &str) {
    let err = (got - truth).abs() / truth;
    assert!(
        err <= 0.10,
        "{what}: attributed {got:.6}s, truth {truth:.6}s ({:.1}% off)",
        err * 100.0
    );
    eprintln!(
        "{what}: attributed {got:.6}s, truth {truth:.6}s ({:.1}% off)",
        err * 100.0
    );
}

#[test]
fn driver_copy_and_sync_time_are_attributed_within_ten_percent() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 1000;
    // Busy-wait delays (< 50 us in the sim): the truth is calls x delay.
    let mut alloc = exercise(&lib);
    alloc.env("SIMCUDA_DELAY_US", "cuMemAlloc_v2=45").args([
        "latency",
        "--api",
        "cuMemAlloc_v2",
        "--calls",
        &CALLS.to_string(),
        "--init",
    ]);
    let mut copy = exercise(&lib);
    copy.env("SIMCUDA_DELAY_US", "cuMemcpyHtoD_v2=30").args([
        "latency",
        "--api",
        "cuMemcpyHtoD_v2",
        "--calls",
        &CALLS.to_string(),
        "--init",
    ]);
    // 50 launches of 1 ms of simulated device work each, then one cuCtxSynchronize: it waits
    // for all of it (less the little time the launches themselves took).
    let mut sync = exercise(&lib);
    sync.env("SIMCUDA_LAUNCH_US", "1000")
        .args(["launches", "--count", "50"]);

    let workloads: Vec<Workload> = [alloc, copy, sync]
        .into_iter()
        .enumerate()
        .map(|(i, cmd)| {
            let d = dir.path().join(format!("w{i}"));
            std::fs::create_dir_all(&d).unwrap();
            Workload::start(cmd, &d)
        })
        .collect();
    let out = dir.path().join("report");
    let mut agent = std::process::Command::new(agent_bin());
    agent
        .args([
            "attribute",
            "--json",
            "--no-daemon",
            "--no-nvml",
            "--duration",
            "120s",
            "--poll-interval",
            "200ms",
            "--out",
        ])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut stat = Stat::from_command(agent);
    stat.wait_for(&attached(&lib), Duration::from_secs(20));
    stat.wait_for("recording for", Duration::from_secs(20));
    let pids: Vec<u32> = workloads.iter().map(|w| w.pid()).collect();
    for w in &workloads {
        w.go();
    }
    let made: Vec<Value> = workloads.into_iter().map(|w| w.finish()).collect();
    let report = stat.finish();
    assert_eq!(report["schema"], "vgpu-agent.attribute/v1");

    let a = process_of(&report, pids[0]);
    within(
        a["components"]["driver"].as_f64().unwrap(),
        CALLS as f64 * 45e-6,
        "driver time (cuMemAlloc_v2)",
    );
    let c = process_of(&report, pids[1]);
    within(
        c["components"]["copy_wait"].as_f64().unwrap(),
        CALLS as f64 * 30e-6,
        "copy time (cuMemcpyHtoD_v2)",
    );
    let s = process_of(&report, pids[2]);
    let launch_s = made[2]["launch_ns"].as_f64().unwrap() / 1e9;
    within(
        s["components"]["sync_wait"].as_f64().unwrap(),
        0.050 - launch_s,
        "sync wait (cuCtxSynchronize)",
    );
    // Probe cost: the measured per-call cost times the probed calls.
    let per_call = report["sampling"]["probe_cost_per_call_ns"]
        .as_f64()
        .unwrap();
    assert!(per_call > 0.0);
    let probe_cost = a["components"]["probe_cost"].as_f64().unwrap();
    assert!(
        (probe_cost - (CALLS + 1) as f64 * per_call / 1e9).abs() < 1e-9,
        "{probe_cost}"
    );
    // The report files are there and say the same.
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(
        written["processes"].as_array().unwrap().len(),
        report["processes"].as_array().unwrap().len()
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("cuMemAlloc_v2"));
}

#[test]
fn probe_cost_is_attributed_within_ten_percent_of_the_slowdown_it_causes() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    const CALLS: u64 = 20_000;
    let run = |cmd: &mut Command| -> Value {
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap()
                .as_bytes(),
        )
        .unwrap()
    };
    let latency_args = [
        "latency",
        "--api",
        "cuStreamSynchronize",
        "--calls",
        "20000",
        "--init",
    ];
    // Unprobed: the same calls, twice, the median of the per-call means.
    let native: Vec<f64> = (0..3)
        .map(|_| {
            run(exercise(&lib).args(latency_args))["mean_ns"]
                .as_f64()
                .unwrap()
        })
        .collect();
    let mut native = native;
    native.sort_by(f64::total_cmp);
    let native_mean = native[1];

    let mut cmd = exercise(&lib);
    cmd.args(latency_args);
    let workload = Workload::start(cmd, dir.path());
    let mut agent = std::process::Command::new(agent_bin());
    agent
        .args([
            "attribute",
            "--json",
            "--no-daemon",
            "--no-nvml",
            "--duration",
            "120s",
            "--poll-interval",
            "200ms",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut stat = Stat::from_command(agent);
    stat.wait_for(&attached(&lib), Duration::from_secs(20));
    stat.wait_for("recording for", Duration::from_secs(20));
    let pid = workload.pid();
    workload.go();
    let probed = workload.finish();
    let report = stat.finish();
    let truth = (probed["mean_ns"].as_f64().unwrap() - native_mean) * CALLS as f64 / 1e9;
    let p = process_of(&report, pid);
    let attributed = p["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == "cuStreamSynchronize")
        .unwrap()["calls"]
        .as_u64()
        .unwrap() as f64
        * report["sampling"]["probe_cost_per_call_ns"]
            .as_f64()
            .unwrap()
        / 1e9;
    within(attributed, truth, "probe cost");
}

#[test]
fn a_known_limiter_hook_delay_is_attributed_to_the_limiter() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    const LAUNCHES: u64 = 20_000;
    const DELAY_NS: u64 = 20_000;
    let mut cmd = exercise(&lib);
    cmd.env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", &lib)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "8g")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"))
        .env("VGPU_DEBUG_HOOK_DELAY_NS", DELAY_NS.to_string())
        .args(["launch-loop", "--count", &LAUNCHES.to_string()]);
    let workload = Workload::start(cmd, dir.path());
    let mut agent = std::process::Command::new(agent_bin());
    agent
        .args([
            "attribute",
            "--json",
            "--no-daemon",
            "--no-nvml",
            "--duration",
            "120s",
            "--poll-interval",
            "100ms",
            "--region-dir",
        ])
        .arg(&regions)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut stat = Stat::from_command(agent);
    stat.wait_for(&attached(&lib), Duration::from_secs(20));
    stat.wait_for("recording for", Duration::from_secs(20));
    let pid = workload.pid();
    workload.go();
    let _ = workload.finish();
    let report = stat.finish();
    let p = process_of(&report, pid);
    within(
        p["components"]["limiter_hook"].as_f64().unwrap(),
        (LAUNCHES * DELAY_NS) as f64 / 1e9,
        "limiter hook self-time",
    );
    let launch = p["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == "cuLaunchKernel")
        .expect("launches in the report");
    assert_eq!(
        (launch["calls"].as_u64(), launch["measured_by"].as_str()),
        (Some(LAUNCHES), Some("limiter")),
        "{launch}"
    );
}
