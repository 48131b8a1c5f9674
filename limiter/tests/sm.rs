//! The SM controller against the simulated driver, whose launches each make the device busy for
//! `SIMCUDA_LAUNCH_US` after earlier work: a saturating launch loop (synchronising every few
//! launches, as a training step does) is held to its share on every launch path, the time held
//! back is recorded in the region as `throttled_ns`, threads share one duty cycle, and an
//! unlimited process is not slowed and gets no thread.
//!
//! The share is computed from the truth the sim gives: launches made in the measured interval
//! times the launch time, over the interval's wall time. The VM is shared with other builds, so a
//! share that misses is retried (a bounded number of times): the controller's error is systematic
//! and would miss every attempt.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::OnceLock,
};

use region::reader::{RegionReader, SlotPhase};
use support::{cc, fresh_region, paths, preloaded};

/// Simulated device time of one launch.
const LAUNCH_US: u64 = 500;
/// Launches between two synchronisations (8 ms of device work per step).
const SYNC_EVERY: u64 = 16;
const ATTEMPTS: usize = 3;

fn caller() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc(
            "sm_caller.c",
            "sm_caller",
            &[&libdir, "-lcuda", "-lpthread"],
        )
    })
}

/// A number from the caller's one-line JSON.
fn field(json: &str, key: &str) -> f64 {
    let k = format!("\"{key}\":");
    let rest = &json[json.find(&k).unwrap_or_else(|| panic!("{key} in {json}")) + k.len()..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"').parse().unwrap()
}

struct Run {
    json: String,
    /// Device-busy share of the measured interval, percent.
    share: f64,
    /// `throttled_ns` summed over the process's shards in the region.
    throttled_ns: u64,
    /// Threads of the process after its workers exited.
    tasks: usize,
}

/// The tests time a saturating workload: one at a time on the shared CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(mode: &str, threads: u32, limit: Option<&str>, measure_ms: u64) -> Run {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let region = fresh_region("sm");
    let mut c = preloaded(caller());
    c.args([
        mode,
        &threads.to_string(),
        "500",
        &measure_ms.to_string(),
        &SYNC_EVERY.to_string(),
    ])
    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
    .env("SIMCUDA_LAUNCH_US", LAUNCH_US.to_string())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    if let Some(l) = limit {
        c.env("CUDA_DEVICE_SM_LIMIT", l);
    }
    let mut child: Child = c.spawn().expect("spawn sm_caller");
    let mut json = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut json)
        .unwrap();
    assert!(json.starts_with('{'), "sm_caller said {json:?}");
    let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count();
    let snap = RegionReader::open(&region).unwrap().snapshot().unwrap();
    let throttled_ns = snap
        .slots
        .iter()
        .filter(|s| s.phase == SlotPhase::Live)
        .map(|s| s.throttled_ns)
        .sum();
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "{json}");
    assert_eq!(field(&json, "errors"), 0.0, "{json}");
    let share = field(&json, "measured_launches") * (LAUNCH_US * 1000) as f64
        / field(&json, "measured_ns")
        * 100.0;
    Run {
        json,
        share,
        throttled_ns,
        tasks,
    }
}

/// Runs until the share is within `tolerance` points of `target` (bounded attempts).
fn run_near(mode: &str, threads: u32, limit: u8, measure_ms: u64, tolerance: f64) -> Run {
    let mut seen = Vec::new();
    for _ in 0..ATTEMPTS {
        let r = run(mode, threads, Some(&limit.to_string()), measure_ms);
        if (r.share - f64::from(limit)).abs() < tolerance {
            eprintln!(
                "{mode} x{threads} at {limit}%: share {:.1}% {}",
                r.share, r.json
            );
            return r;
        }
        seen.push(format!("{:.1}% ({})", r.share, r.json.trim()));
    }
    panic!("{mode} x{threads} limited to {limit}%: shares {seen:?}");
}

#[test]
fn shares_of_25_50_75_percent_hold_and_throttled_time_is_recorded() {
    for limit in [25, 50, 75] {
        let r = run_near("kernel", 1, limit, 2500, 5.0);
        let blocked = field(&r.json, "blocked_ns");
        let throttled = r.throttled_ns as f64;
        assert!(
            (throttled - blocked).abs() < blocked * 0.10,
            "limit {limit}%: region throttled_ns {throttled} vs {blocked} ns blocked in launches"
        );
        assert_eq!(r.tasks, 1, "the limiter started a thread");
    }
}

#[test]
fn every_launch_path_is_held_to_its_share() {
    for mode in ["kernel_ptsz", "ex", "coop", "graph"] {
        let r = run_near(mode, 1, 40, 1500, 5.0);
        assert!(r.throttled_ns > 0, "{mode}: nothing throttled");
    }
}

#[test]
fn threads_share_one_duty_cycle() {
    // Each thread adding its own idle time would push the share far below the limit.
    run_near("kernel", 4, 50, 2000, 5.0);
}

#[test]
fn unlimited_launches_are_not_held_and_get_no_thread() {
    for limit in [None, Some("100"), Some("0")] {
        let r = run("kernel", 1, limit, 1000);
        eprintln!("unlimited {limit:?}: share {:.1}% {}", r.share, r.json);
        // The workload saturates the device (CPU gaps between steps aside).
        assert!(
            r.share > 90.0,
            "{limit:?}: share {:.1}% {}",
            r.share,
            r.json
        );
        assert_eq!(r.throttled_ns, 0, "{limit:?}");
        assert_eq!(r.tasks, 1, "{limit:?}: the limiter started a thread");
    }
}
