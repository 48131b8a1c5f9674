//! Two devices (the simulated driver with `SIMCUDA_DEVICES=2`) under the limiter, with a
//! different limit per device (`CUDA_DEVICE_MEMORY_LIMIT_0`, `_1`): each limit holds to the byte
//! for one process using both devices and for two processes of one container on one device
//! each, the region shows what each device holds, and `vgpu-agent stat --json` shows both devices'
//! limits and use, per process and per container.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::*;

const MIB: u64 = 1 << 20;
const LIMITS: [u64; 2] = [100 * MIB, 150 * MIB];
const CONTEXT: u64 = 8 * MIB;

/// `cuda-exercise fill --devices DEVICES` under the limiter with the two limits, in the region
/// `region`; returns the child (holding what it allocated until its stdin closes) and its report.
fn fill(lib: &Path, region: &Path, devices: &str) -> (Child, Value) {
    let mut cmd = exercise(lib);
    cmd.args(["fill", "--devices", devices, "--chunk", "16m"])
        .env("SIMCUDA_DEVICES", "2")
        .env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", lib)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "100m")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "150m")
        .env("VGPU_CONTEXT_BYTES", CONTEXT.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("cuda-exercise fill starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (child, v)
}

fn release(mut child: Child) {
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let last = String::from_utf8_lossy(&out.stdout);
    assert!(last.contains("\"free_errors\":0"), "{last}");
}

/// Device `d` of a fill report: (bytes allocated, size of the last refused allocation, result,
/// cuMemGetInfo's free and total).
fn device(v: &Value, d: u64) -> (u64, u64, i64, u64, u64) {
    let e = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["device"] == d)
        .unwrap_or_else(|| panic!("device {d} not in {v}"));
    (
        e["allocated"].as_u64().unwrap(),
        e["last_refused"]["bytes"].as_u64().unwrap(),
        e["last_refused"]["result"].as_i64().unwrap(),
        e["mem_info"]["free"].as_u64().unwrap(),
        e["mem_info"]["total"].as_u64().unwrap(),
    )
}

/// `vgpu-agent stat --json` over a short window, reading the regions under `dir` (no NVML: the
/// devices shown are the ones the region's processes use).
fn stat(dir: &Path) -> Value {
    let mut s = Stat::start(&[
        "--no-calibrate",
        "--no-nvml",
        "--region-dir",
        dir.to_str().unwrap(),
    ]);
    s.wait_for("tracing for", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(600));
    s.finish()
}

fn container_of(report: &Value, pid: u32) -> &Value {
    report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["pids"].as_array().unwrap().iter().any(|p| *p == pid))
        .unwrap_or_else(|| panic!("no container with pid {pid}: {report:#}"))
}

fn by_device(row: &Value) -> Vec<(u64, Option<u64>)> {
    row["memory_by_device"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["device"].as_u64().unwrap(), d["limiter"].as_u64()))
        .collect()
}

#[test]
fn one_process_on_two_devices_meets_each_limit_exactly() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    let (child, made) = fill(&lib, &regions.join("ctr.cache"), "0,1");
    for (d, limit) in LIMITS.iter().enumerate() {
        // The context charge first, then allocations up to the limit, the next 512 bytes refused
        // (CUDA_ERROR_OUT_OF_MEMORY); cuMemGetInfo on the device says its limit and nothing free.
        assert_eq!(
            device(&made, d as u64),
            (limit - CONTEXT, 512, 2, 0, *limit),
            "device {d}: {made}"
        );
    }
    let report = stat(&regions);
    let pid = made["pid"].as_u64().unwrap() as u32;
    let row = process(&report, pid);
    assert_eq!(
        by_device(row),
        [(0, Some(LIMITS[0])), (1, Some(LIMITS[1]))],
        "{row:#}"
    );
    let c = container_of(&report, pid);
    assert_eq!(by_device(c), by_device(row));
    let devs = c["regions"][0]["devices"].as_array().unwrap();
    let shown: Vec<(u64, u64, u64, u64)> = devs
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["memory_limit"].as_u64().unwrap(),
                d["reserved"].as_u64().unwrap(),
                d["denied"].as_u64().unwrap(),
            )
        })
        .collect();
    // Each device reserved to its limit, and denied three times: once per allocation size the
    // fill steps down through (16 MiB, 2 MiB, 512 bytes).
    assert_eq!(
        shown,
        [(0, LIMITS[0], LIMITS[0], 3), (1, LIMITS[1], LIMITS[1], 3)],
        "{devs:#?}"
    );
    assert_eq!(devs[0]["context_charge"].as_u64(), Some(CONTEXT));
    release(child);
}

#[test]
fn two_processes_of_one_container_on_different_devices_share_each_devices_limit() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    let region = regions.join("ctr.cache");
    let (a, on0) = fill(&lib, &region, "0");
    let (b, on1) = fill(&lib, &region, "1");
    assert_eq!(device(&on0, 0).0, LIMITS[0] - CONTEXT, "{on0}");
    assert_eq!(
        device(&on1, 1).0,
        LIMITS[1] - CONTEXT,
        "device 0's use does not count against device 1: {on1}"
    );
    // A third process of the container finds both devices full: even its context charge is
    // refused, so nothing is allocated on either.
    let (c, late) = fill(&lib, &region, "0,1");
    assert_eq!(device(&late, 0).0, 0, "{late}");
    assert_eq!(device(&late, 1).0, 0, "{late}");

    let report = stat(&regions);
    let pid = |v: &Value| v["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        by_device(process(&report, pid(&on0))),
        [(0, Some(LIMITS[0]))]
    );
    assert_eq!(
        by_device(process(&report, pid(&on1))),
        [(1, Some(LIMITS[1]))]
    );
    let ctr = container_of(&report, pid(&on0));
    assert_eq!(
        by_device(ctr),
        [(0, Some(LIMITS[0])), (1, Some(LIMITS[1]))],
        "{ctr:#}"
    );
    let reserved: Vec<u64> = ctr["regions"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["reserved"].as_u64().unwrap())
        .collect();
    assert_eq!(reserved, LIMITS);
    for child in [a, b, c] {
        release(child);
    }
}
