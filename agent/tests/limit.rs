//! `vgpu-agent limit`: a run-time SM share reaches every running process of the container under
//! the limiter (each is held back after the change, by the container's one window), a lower
//! memory limit denies the next allocation over it, and malformed values are refused with a
//! message that names them.
//!
//! How soon a change takes effect and the share the processes then get together are checked in
//! virtual time (limiter-core's `sm::tests::a_share_set_at_run_time_holds_launches_from_the_next_window`:
//! held within one window of the change, the share within 2 points) and measured by
//! `cargo xtask bench sm-shares`; these tests check what happened, not how long it took.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::{agent_bin, exercise_bin, limiter_lib, sim_lib, tempdir};

fn workload(dir: &Path, region: &Path, args: &[&str]) -> Command {
    let lib = sim_lib(&dir.join("lib"));
    let mut c = Command::new(exercise_bin());
    c.arg("--lib")
        .arg(&lib)
        .args(args)
        .env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", &lib)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("VGPU_CONTEXT_BYTES", "0")
        .env("SIMCUDA_LAUNCH_US", "500");
    c
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn limit(args: &[&str]) -> std::process::Output {
    Command::new(agent_bin())
        .arg("limit")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_run_time_sm_share_reaches_a_running_process() {
    let dir = tempdir();
    let region = dir.path().join("c.region");
    let child = workload(dir.path(), &region, &["paced", "--seconds", "4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_started(&region, "the limiter created no region");
    let set_at = monotonic_ns();
    let out = limit(&["set", "--region", region.to_str().unwrap(), "--sm", "40"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("sm 40%"), "{said}");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let held = v["first_held_mono_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("no launch was held back: {v}"));
    assert!(held > set_at, "held before the change: {v}");
    // `show` reads it back.
    let out = limit(&["show", "--region", region.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sm 40%"),
        "{out:?}"
    );
}

#[test]
fn a_run_time_sm_share_holds_all_processes_of_the_container() {
    let dir = tempdir();
    let region = dir.path().join("c2.region");
    let children: Vec<_> = (0..2)
        .map(|_| {
            workload(dir.path(), &region, &["paced", "--seconds", "4"])
                .env("VGPU_SM_FEEDBACK", "0")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Both have started (a bound on a slow start, not a timing): the region lists two live
    // processes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while live_processes(&region) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the two processes did not both start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let set_at = monotonic_ns();
    let out = limit(&["set", "--region", region.to_str().unwrap(), "--sm", "40"]);
    assert!(out.status.success(), "{out:?}");
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["errors"], 0, "{v}");
        // Each process was held back after the change, and not before it (nothing was limited).
        let held = v["first_held_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("no launch was held back: {v}"));
        assert!(held > set_at, "held before the change: {v}");
    }
}

/// Live processes in the region at `path` (0 while it does not exist).
/// Waits until a process lives in `region` (a bound on a slow start, not a timing).
fn wait_started(region: &Path, failure: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while live_processes(region) < 1 {
        assert!(std::time::Instant::now() < deadline, "{failure}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn live_processes(path: &Path) -> usize {
    region::reader::RegionReader::open(path)
        .and_then(|r| r.snapshot())
        .map_or(0, |s| {
            s.slots
                .iter()
                .filter(|s| s.phase == region::reader::SlotPhase::Live)
                .count()
        })
}

#[test]
fn a_lower_memory_limit_denies_the_next_allocation_over_it() {
    let dir = tempdir();
    let region = dir.path().join("m.region");
    let mut holder = workload(dir.path(), &region, &["hold", "--bytes", "64m"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pair = |dir: &Path| {
        workload(dir, &region, &["pairs", "--count", "1", "--size", "16m"])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .output()
            .unwrap()
    };
    let ok = pair(dir.path());
    assert!(ok.status.success(), "before the change: {ok:?}");
    let out = limit(&[
        "set",
        "--region",
        region.to_str().unwrap(),
        "--memory",
        "32m",
    ]);
    assert!(out.status.success(), "{out:?}");
    let denied = pair(dir.path());
    assert!(
        !denied.status.success() && String::from_utf8_lossy(&denied.stderr).contains("Some(2)"),
        "64 MiB held, limit 32 MiB, 16 MiB more must be denied: {denied:?}"
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
}

#[test]
fn malformed_values_are_refused_by_name() {
    let dir = tempdir();
    let region = dir.path().join("none.region");
    let r = region.to_str().unwrap();
    for (args, needle) in [
        (vec!["set", "--region", r, "--sm", "101"], "101"),
        (vec!["set", "--region", r, "--memory", "4x"], "4x"),
        (vec!["set", "--region", r], "nothing to set"),
        (vec!["set", "--sm", "40"], "--container"),
        (
            vec!["set", "--region", r, "--sm", "40"],
            "not a vgpu-agent limiter region",
        ),
        (
            vec!["set", "--container", "ffffffffffff0000", "--sm", "40"],
            "no running process",
        ),
    ] {
        let out = limit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn a_run_time_qos_tier_reaches_a_running_container_and_can_be_taken_away() {
    let dir = tempdir();
    let region = dir.path().join("qos.region");
    let child = workload(dir.path(), &region, &["paced", "--seconds", "6"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_started(&region, "the workload did not start");
    let r = region.to_str().unwrap();
    let out = limit(&[
        "set",
        "--region",
        r,
        "--tier",
        "guaranteed",
        "--guarantee",
        "40",
    ]);
    assert!(out.status.success(), "{out:?}");
    // The limiter applies it at its next call; its QoS thread publishes the tier in the region.
    let qos = |want: &dyn Fn(Option<region::sm_share::QosState>) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let q = region::reader::RegionReader::open(&region)
                .and_then(|r| r.snapshot())
                .ok()
                .and_then(|s| s.devices.first().and_then(|d| d.qos));
            if want(q) {
                return q;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the region's QoS state is {q:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let q = qos(&|q| q.is_some_and(|q| q.tier == 2 && q.guarantee_pm == 400));
    // Alone on the device (no board): the whole of it.
    assert_eq!(q.unwrap().allocated_pm, 1000, "{q:?}");
    let out = limit(&["show", "--region", r]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("QoS tier guaranteed 40%"),
        "{out:?}"
    );
    let out = limit(&["set", "--region", r, "--tier", "none"]);
    assert!(out.status.success(), "{out:?}");
    qos(&|q| q.is_none());
    // A tier with a guarantee it cannot have is refused by name.
    let out = limit(&[
        "set",
        "--region",
        r,
        "--tier",
        "latency",
        "--guarantee",
        "30",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--guarantee goes with the guaranteed tier"),
        "{out:?}"
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
}
