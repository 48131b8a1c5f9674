//! `cargo xtask bench agent`: what the agent daemon costs.
//!
//! 1. Idle, then under a paced load of 50,000 probed calls per second from a simulated-driver
//!    process: the daemon's CPU (utime + stime from /proc) as a share of one core, and its RSS.
//! 2. 1,000 short-lived GPU processes started and ended one after another: the daemon's RSS
//!    sampled along the way, and the entries left in its kernel maps once the exited processes
//!    have been removed from the model.
//!
//! Needs root (real eBPF). Prints a table and a JSON line (`bench-agent: {...}`).

use std::{
    fs,
    io::Read,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::util::{self, cmd, repo_root};

const LOAD_RATE: u64 = 50_000;
const LOAD_SECONDS: f64 = 20.0;
const SHORT_LIVED: usize = 1_000;

fn ticks_per_second() -> f64 {
    util::output(Command::new("getconf").arg("CLK_TCK"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').context("stat format")? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / ticks_per_second())
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    Ok(kb * 1024)
}

fn snapshot(socket: &Path) -> Result<Value> {
    let mut s = UnixStream::connect(socket)?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(serde_json::from_str(&body)?)
}

pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

/// CPU share of one core and mean RSS of `pid` over `window`.
pub(crate) fn measure(pid: u32, window: Duration) -> Result<(f64, u64)> {
    let (c0, t0) = (cpu_seconds(pid)?, Instant::now());
    let mut rss = Vec::new();
    while t0.elapsed() < window {
        sleep(Duration::from_millis(500));
        rss.push(rss_bytes(pid)?);
    }
    let share = (cpu_seconds(pid)? - c0) / t0.elapsed().as_secs_f64();
    Ok((share, rss.iter().sum::<u64>() / rss.len().max(1) as u64))
}

pub fn run() -> Result<()> {
    if !util::is_root() {
        bail!(
            "the agent benchmark loads eBPF probes: run it as root (sudo cargo xtask bench agent)"
        );
    }
    crate::setup::run()?;
    util::run(&mut cmd(
        "cargo",
        [
            "build",
            "--release",
            "-p",
            "vgpu-agent",
            "-p",
            "cuda-exercise",
            "-p",
            "sim-cuda",
        ],
    ))?;
    let bin = repo_root().join("target/release");
    let work = std::env::temp_dir().join(format!("vgpu-bench-agent-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    let lib: PathBuf = work.join("libcuda.so.1");
    fs::copy(bin.join("libsimcuda.so"), &lib)?;
    let socket = work.join("agent.sock");

    let daemon = Guard(
        Command::new(bin.join("vgpu-agent"))
            .args([
                "run",
                "--interval",
                "1s",
                "--no-nvml",
                "--exited-retention",
                "2s",
                "--socket",
            ])
            .arg(&socket)
            .arg("--libcuda")
            .arg(&lib)
            .env("VGPU_LOG", "warn")
            .spawn()?,
    );
    let agent_pid = daemon.0.id();
    let t = Instant::now();
    while UnixStream::connect(&socket).is_err() {
        ensure!(
            t.elapsed() < Duration::from_secs(30),
            "the daemon did not start"
        );
        sleep(Duration::from_millis(50));
    }
    sleep(Duration::from_secs(2));

    util::step("agent: idle");
    let (idle_cpu, idle_rss) = measure(agent_pid, Duration::from_secs(5))?;

    util::step(&format!(
        "agent: under {LOAD_RATE} probed calls/s for {LOAD_SECONDS} s"
    ));
    let load = Guard(
        Command::new(bin.join("cuda-exercise"))
            .arg("--lib")
            .arg(&lib)
            .args([
                "steady",
                "--api",
                "cuStreamSynchronize",
                "--rate",
                &LOAD_RATE.to_string(),
                "--seconds",
            ])
            .arg(LOAD_SECONDS.to_string())
            .stdout(Stdio::null())
            .spawn()?,
    );
    sleep(Duration::from_secs(3));
    let (load_cpu, load_rss) = measure(agent_pid, Duration::from_secs(12))?;
    // The model must have seen the load (else the figure measures nothing).
    let snap = snapshot(&socket)?;
    let seen_rate = snap["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["key"]["pid"] == load.0.id()))
        .and_then(|p| p["rates"]["calls_per_s"].as_f64())
        .unwrap_or(0.0);
    drop(load);

    util::step(&format!("agent: {SHORT_LIVED} short-lived GPU processes"));
    let mut rss_samples = Vec::new();
    let started = Instant::now();
    for i in 0..SHORT_LIVED {
        let status = Command::new(bin.join("cuda-exercise"))
            .arg("--lib")
            .arg(&lib)
            .args([
                "counts",
                "--per-api",
                "1",
                "--init",
                "--apis",
                "cuMemAlloc_v2,cuMemFree_v2,cuStreamSynchronize",
            ])
            .stdout(Stdio::null())
            .status()?;
        ensure!(status.success(), "short-lived process {i} failed");
        // Spread over the run (~40 s) rather than a burst: the model keeps exited processes for
        // the retention time, so a burst measures that backlog, not a leak.
        sleep(Duration::from_millis(30));
        if i % 100 == 99 {
            rss_samples.push(rss_bytes(agent_pid)?);
        }
    }
    let churn_seconds = started.elapsed().as_secs_f64();
    // Past the retention, plus two refreshes: every exited process is gone from model and maps.
    sleep(Duration::from_secs(5));
    let snap = snapshot(&socket)?;
    let processes_left = snap["processes"].as_array().map(|p| p.len()).unwrap_or(0);
    let maps = snap["agent"]["map_entries"].clone();
    let lost = snap["agent"]["events_lost"].clone();
    drop(daemon);
    let _ = fs::remove_dir_all(&work);

    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let rss_growth = rss_samples
        .last()
        .copied()
        .unwrap_or(0)
        .saturating_sub(rss_samples.first().copied().unwrap_or(0));
    let result = json!({
        "idle_cpu_share": idle_cpu,
        "idle_rss_mib": mib(idle_rss),
        "load_calls_per_s_seen": seen_rate,
        "load_cpu_share": load_cpu,
        "load_rss_mib": mib(load_rss),
        "short_lived_processes": SHORT_LIVED,
        "churn_seconds": churn_seconds,
        "rss_mib_every_100": rss_samples.iter().map(|b| mib(*b)).collect::<Vec<_>>(),
        "rss_growth_mib_100_to_1000": mib(rss_growth),
        "processes_left_in_model": processes_left,
        "map_entries_after": maps,
        "events_lost": lost,
    });
    println!("\n| measure | value | goal |\n|---|---|---|");
    println!(
        "| agent CPU, idle | {:.2}% of one core | |",
        idle_cpu * 100.0
    );
    println!(
        "| agent CPU, {LOAD_RATE} probed calls/s (model saw {seen_rate:.0}/s) | {:.2}% of one core | < 2% |",
        load_cpu * 100.0
    );
    println!(
        "| agent RSS, under load | {:.1} MiB | < 64 MiB |",
        mib(load_rss)
    );
    println!(
        "| agent RSS growth from process 100 to 1000 | {:.2} MiB | flat |",
        mib(rss_growth)
    );
    println!("| processes left in the model after they all exited | {processes_left} | 0 |");
    println!("| kernel map entries after | {maps} | stats 0, live 0, allocs 0 |");
    println!("bench-agent: {result}");
    Ok(())
}
