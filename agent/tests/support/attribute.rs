//! What the `vgpu-agent attribute` tests share: running the command, finding a process or an API
//! in its report, and checking a figure against its truth with retries (the test machines'
//! vCPUs are shared: one burst of steal time during a 50 ms measurement moves it by more than
//! 10%, so each check is measured up to three times, five where a test says why, and must be
//! within its tolerance once).

use std::process::{Command, Stdio};

use serde_json::Value;

use super::*;

pub const ATTEMPTS: usize = 3;

pub fn process_of(report: &Value, pid: u32) -> &Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} missing: {report:#}"))
}

/// A process's row of one API in the report.
pub fn api_of<'a>(process: &'a Value, api: &str) -> Option<&'a Value> {
    process["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == api)
}

/// `Err` describes the miss.
pub fn within(got: f64, truth: f64, tolerance: f64, what: &str) -> Result<(), String> {
    let err = (got - truth).abs() / truth;
    let line = format!(
        "{what}: attributed {got:.6}s, truth {truth:.6}s ({:.1}% off)",
        err * 100.0
    );
    eprintln!("{line}");
    if err <= tolerance { Ok(()) } else { Err(line) }
}

/// Runs `attempt` until it succeeds, at most [`ATTEMPTS`] times.
pub fn measured(attempt: impl FnMut() -> Result<(), String>) {
    measured_n(ATTEMPTS, attempt)
}

/// Runs `attempt`, which makes several checks from one measurement, until every check has been
/// within its tolerance in some attempt, at most [`ATTEMPTS`] times (each check must be within
/// its tolerance once, as the module says; a burst of steal time rarely spares all of one run).
pub fn measured_each<const N: usize>(mut attempt: impl FnMut() -> [Result<(), String>; N]) {
    let mut passed = [false; N];
    let mut misses = Vec::new();
    for _ in 0..ATTEMPTS {
        for (ok, check) in passed.iter_mut().zip(attempt()) {
            match check {
                Ok(()) => *ok = true,
                Err(e) => misses.push(e),
            }
        }
        if passed.iter().all(|&ok| ok) {
            return;
        }
    }
    panic!("some check never within tolerance ({passed:?}): {misses:#?}");
}

/// Runs `attempt` until it succeeds, at most `attempts` times.
pub fn measured_n(attempts: usize, mut attempt: impl FnMut() -> Result<(), String>) {
    let mut misses = Vec::new();
    for _ in 0..attempts {
        match attempt() {
            Ok(()) => return,
            Err(e) => misses.push(e),
        }
    }
    panic!("no attempt within tolerance: {misses:#?}");
}

pub fn attribute_cmd(extra: &[&str]) -> Command {
    let mut agent = Command::new(agent_bin());
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
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    agent
}

/// The median per-call time of `api` in the simulated driver, natively (no probes, no delay).
pub fn sim_own_ns(lib: &std::path::Path, api: &str) -> f64 {
    let mut runs: Vec<f64> = (0..3)
        .map(|_| {
            let out = exercise(lib)
                .args(["latency", "--api", api, "--calls", "1000", "--init"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
            v["p50_ns"].as_f64().unwrap()
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

pub fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The median of `v` (odd lengths; the upper middle otherwise).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
