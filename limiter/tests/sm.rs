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
    process::{Child, Stdio},
};

use region::reader::{RegionReader, SlotPhase};
use support::{fake_nvml, fresh_region, preloaded, sm_caller};

/// Simulated device time of one launch.
const LAUNCH_US: u64 = 500;
/// Launches between two synchronisations (8 ms of device work per step).
const SYNC_EVERY: u64 = 16;
const ATTEMPTS: usize = 3;

/// A number from the caller's one-line JSON.
fn field(json: &str, key: &str) -> f64 {
    let k = format!("\"{key}\":");
    let rest = &json[json.find(&k).unwrap_or_else(|| panic!("{key} in {json}")) + k.len()..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim_matches('"').parse().unwrap()
}

struct Run {
    json: String,
    stderr: String,
    /// Device-busy share of the measured interval, percent.
    share: f64,
    /// `throttled_ns` summed over the process's shards in the region.
    throttled_ns: u64,
    /// Threads of the process after its workers exited.
    tasks: usize,
    /// Names of those other than the main thread.
    extra_threads: Vec<String>,
}

/// The tests time a saturating workload: one at a time on the shared CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(mode: &str, threads: u32, limit: Option<&str>, measure_ms: u64) -> Run {
    run_env(mode, threads, limit, 500, measure_ms, &[])
}

fn run_env(
    mode: &str,
    threads: u32,
    limit: Option<&str>,
    warm_ms: u64,
    measure_ms: u64,
    env: &[(&str, &str)],
) -> Run {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let region = fresh_region("sm");
    let mut c = preloaded(sm_caller());
    c.args([
        mode,
        &threads.to_string(),
        &warm_ms.to_string(),
        &measure_ms.to_string(),
        &SYNC_EVERY.to_string(),
    ])
    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
    .env("SIMCUDA_LAUNCH_US", LAUNCH_US.to_string())
    .envs(env.iter().copied())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(l) = limit {
        c.env("CUDA_DEVICE_SM_LIMIT", l);
    }
    let mut child: Child = c.spawn().expect("spawn sm_caller");
    let mut json = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut json)
        .unwrap();
    assert!(json.starts_with('{'), "sm_caller said {json:?}");
    let pid = child.id();
    // The workers were joined before the JSON was printed, but a joined thread can stay listed
    // in /proc for a moment while the kernel finishes its exit: wait until no thread named like
    // the program (a worker) is left, for at most a second.
    let read_threads = || -> (usize, Vec<String>) {
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let extra = tids
            .iter()
            .filter(|t| **t != pid.to_string())
            .map(|t| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm"))
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            })
            .collect();
        (tids.len(), extra)
    };
    let (mut tasks, mut extra_threads) = read_threads();
    for _ in 0..50 {
        if !extra_threads.iter().any(|t: &String| t == "sm_caller") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        (tasks, extra_threads) = read_threads();
    }
    let snap = RegionReader::open(&region).unwrap().snapshot().unwrap();
    let throttled_ns = snap
        .slots
        .iter()
        .filter(|s| s.phase == SlotPhase::Live)
        .map(|s| s.throttled_ns)
        .sum();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = support::text(&out.stderr);
    assert!(out.status.success(), "{json}\n{stderr}");
    assert_eq!(field(&json, "errors"), 0.0, "{json}");
    let share = field(&json, "measured_launches") * (LAUNCH_US * 1000) as f64
        / field(&json, "measured_ns")
        * 100.0;
    Run {
        json,
        stderr,
        share,
        throttled_ns,
        tasks,
        extra_threads,
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
        // The only thread a limit may start is the feedback loop's (which exits without NVML).
        assert!(
            r.extra_threads.iter().all(|t| t == "vgpu-sm"),
            "{:?}",
            r.extra_threads
        );
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

/// What the stand-in NVML reports for the process: `scale` x its true share (`fake_nvml.c`).
fn feedback_run(limit: u8, scale: &str, extra: &[(&str, &str)], warm_ms: u64) -> (Run, f64) {
    let nvml = fake_nvml().to_str().unwrap();
    let mut env = vec![
        ("VGPU_REAL_LIBNVML", nvml),
        ("FAKE_NVML_SM_SCALE", scale),
        ("LIBCUDA_LOG_LEVEL", "3"),
    ];
    env.extend_from_slice(extra);
    let r = run_env("kernel", 1, Some(&limit.to_string()), warm_ms, 3000, &env);
    let reported = r.share * scale.parse::<f64>().unwrap();
    eprintln!(
        "limit {limit}%, NVML scale {scale} {extra:?}: true share {:.1}%, NVML share {reported:.1}%\n{}",
        r.share,
        r.stderr
            .lines()
            .filter(|l| l.contains("SM feedback") || l.contains("open-loop"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    (r, reported)
}

/// Runs until NVML's share is within 5 points of the limit (bounded attempts).
fn feedback_near(limit: u8, scale: &str) -> Run {
    let mut seen = Vec::new();
    for _ in 0..ATTEMPTS {
        // 9 s of warm-up: the loop converges in about 5 s (sm_feedback_tests.rs).
        let (r, reported) = feedback_run(limit, scale, &[], 9000);
        if (reported - f64::from(limit)).abs() < 5.0 {
            return r;
        }
        seen.push(format!("{reported:.1}% ({})", r.json.trim()));
    }
    panic!("limit {limit}%, NVML scale {scale}: NVML shares {seen:?}");
}

#[test]
fn feedback_raises_the_duty_cycle_when_nvml_sees_half_of_it() {
    // Open loop (VGPU_SM_FEEDBACK=0), NVML sees half the share: about 20 for a limit of 40.
    let (open, reported) = feedback_run(40, "0.5", &[("VGPU_SM_FEEDBACK", "0")], 2000);
    assert!(reported < 25.0, "open loop: {reported:.1}% {}", open.json);
    assert!(open.extra_threads.is_empty(), "{:?}", open.extra_threads);
    // Closed loop: the duty cycle rises until NVML sees 40.
    let r = feedback_near(40, "0.5");
    assert!(r.share > 70.0, "true share {:.1}%", r.share);
    assert_eq!(r.extra_threads, ["vgpu-sm"]);
    assert!(
        r.stderr.contains("SM feedback device 0: target 40%"),
        "{}",
        r.stderr
    );
}

#[test]
fn feedback_lowers_the_duty_cycle_when_nvml_sees_more() {
    let r = feedback_near(60, "1.5");
    assert!(r.share < 50.0, "true share {:.1}%", r.share);
}

#[test]
fn without_nvml_or_without_our_pid_the_share_stays_open_loop() {
    let mut seen = Vec::new();
    for _ in 0..ATTEMPTS {
        let (missing, _) = feedback_run(
            40,
            "0.5",
            &[("VGPU_REAL_LIBNVML", "/nonexistent/libnvidia-ml.so.1")],
            1000,
        );
        let (foreign, _) = feedback_run(40, "0.5", &[("FAKE_NVML_FOREIGN_PID", "1")], 6000);
        assert!(
            missing
                .stderr
                .contains("could not be loaded; SM shares stay open-loop"),
            "{}",
            missing.stderr
        );
        assert!(
            foreign
                .stderr
                .contains("(another pid namespace?); the SM share of device 0 stays open-loop"),
            "{}",
            foreign.stderr
        );
        if (missing.share - 40.0).abs() < 5.0 && (foreign.share - 40.0).abs() < 5.0 {
            return;
        }
        seen.push(format!("{:.1}% / {:.1}%", missing.share, foreign.share));
    }
    panic!("open-loop shares (NVML missing / our pid never reported): {seen:?}");
}
