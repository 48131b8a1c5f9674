//! `cargo xtask bench limiter`: what the preloaded limiter costs, against the simulated driver
//! (issue 4, point 8). Native and limited runs are interleaved (A B A B ...), `RUNS` of each, and
//! reported as medians with their spread (min..max over runs) and as limited/native ratios:
//!
//! - launches: `cuda-exercise launch-loop` (cuLaunchKernel through a pointer resolved once, the
//!   median of 1,000,000 individually timed launches per run);
//! - 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pairs: `cuda-exercise pairs`, median pair time, with 1 and
//!   with 8 processes timing at once after a barrier (the slowest process's median);
//! - start-up of 8, 32 and 64 processes started together (cuInit + context + one allocation):
//!   the slowest process's wall time from spawn to exit.
//!
//! The limited runs use a 64 GiB limit, a fresh region per run and `VGPU_CONTEXT_BYTES=0`.
//! Prints a table and a JSON line (`bench-limiter: {...}`). `scripts/gpu/bench-limiter.sh` runs
//! the same comparison against the real driver on the GPU machine.

use crate::bench::SimFixtures;
use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

const RUNS: usize = 3;
const LAUNCHES: u64 = 1_000_000;
const PAIRS: u64 = 100_000;

struct Env {
    exercise: PathBuf,
    limiter: PathBuf,
    libcuda: PathBuf,
    tmp: PathBuf,
}

impl Env {
    fn command(&self, limited: bool, tag: &str) -> Command {
        let mut c = Command::new(&self.exercise);
        c.arg("--lib").arg(&self.libcuda).stderr(Stdio::inherit());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CUDA_") || k.starts_with("VGPU_") || k.starts_with("SIMCUDA_") {
                c.env_remove(k);
            }
        }
        if limited {
            let region = self.tmp.join(format!("{tag}.region"));
            crate::bench::remove_region(&region);
            c.env("LD_PRELOAD", &self.limiter)
                .env("CUDA_DEVICE_MEMORY_LIMIT", "64g")
                .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
                .env("VGPU_CONTEXT_BYTES", "0");
        }
        c
    }
}

fn json_of(out: &std::process::Output) -> Result<Value> {
    ensure!(
        out.status.success(),
        "cuda-exercise failed: {:?}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("no output")?;
    Ok(serde_json::from_str(line)?)
}

fn launch_run(env: &Env, limited: bool, run: usize) -> Result<f64> {
    let out = env
        .command(limited, &format!("launch-{run}"))
        .args(["launch-loop", "--count", &LAUNCHES.to_string()])
        .output()?;
    Ok(json_of(&out)?["launch_ns"].as_f64().unwrap_or(0.0))
}

/// `procs` processes time `PAIRS` pairs each after a common barrier; the slowest median.
fn pairs_run(env: &Env, limited: bool, procs: usize, run: usize) -> Result<f64> {
    let tag = format!("pairs-{procs}-{run}-{limited}");
    let barrier = env.tmp.join(format!("{tag}.go"));
    let _ = fs::remove_file(&barrier);
    let kids = (0..procs)
        .map(|_| {
            env.command(limited, &tag)
                .args(["pairs", "--count", &PAIRS.to_string(), "--barrier"])
                .arg(&barrier)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Start-up of all of them is far below this; the barrier then opens for everyone at once.
    std::thread::sleep(Duration::from_millis(300 + 20 * procs as u64));
    fs::write(&barrier, "")?;
    let mut worst: f64 = 0.0;
    for k in kids {
        let v = json_of(&k.wait_with_output()?)?;
        worst = worst.max(v["pair_median_ns"].as_f64().unwrap_or(0.0));
    }
    Ok(worst)
}

/// `procs` processes started together; the slowest one's spawn-to-exit time in seconds.
fn startup_run(env: &Env, limited: bool, procs: usize, run: usize) -> Result<f64> {
    let tag = format!("startup-{procs}-{run}");
    let t0 = Instant::now();
    let kids = (0..procs)
        .map(|_| {
            env.command(limited, &tag)
                .args(["pairs", "--count", "1"])
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut worst = Duration::ZERO;
    for mut k in kids {
        ensure!(k.wait()?.success(), "a start-up process failed");
        worst = worst.max(t0.elapsed());
    }
    Ok(worst.as_secs_f64())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Interleaves native and limited runs of `f`; returns the JSON summary and prints a row
/// (seconds are shown as milliseconds).
fn compare(name: &str, unit: &str, mut f: impl FnMut(bool, usize) -> Result<f64>) -> Result<Value> {
    let (mut native, mut limited) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        native.push(f(false, run)?);
        limited.push(f(true, run)?);
    }
    let (n, l) = (median(&mut native), median(&mut limited));
    let (scale, shown) = if unit == "s" {
        (1000.0, "ms")
    } else {
        (1.0, unit)
    };
    let spread = |v: &[f64]| format!("{:.0}..{:.0}", v[0] * scale, v[v.len() - 1] * scale);
    println!(
        "{name:<26} native {:>8.0} {shown} ({})   limiter {:>8.0} {shown} ({})   {:+.0} {shown}   x{:.3}",
        n * scale,
        spread(&native),
        l * scale,
        spread(&limited),
        (l - n) * scale,
        l / n,
    );
    Ok(
        json!({"native": native, "limited": limited, "native_median": n,
              "limited_median": l, "delta": l - n, "ratio": l / n, "unit": unit}),
    )
}

pub fn run() -> Result<()> {
    let SimFixtures { bin, tmp, libcuda } = crate::bench::sim_fixtures("bench-limiter")?;
    let env = Env {
        exercise: bin.join("cuda-exercise"),
        limiter: bin.join("libvgpu_limiter.so"),
        libcuda,
        tmp: tmp.clone(),
    };
    println!("(medians of {RUNS} interleaved runs; spread = min..max; start-up spread in ms)");
    let launch = compare("launch, ns", "ns", |l, r| launch_run(&env, l, r))?;
    let pairs1 = compare("alloc+free 1 MiB, 1 proc", "ns", |l, r| {
        pairs_run(&env, l, 1, r)
    })?;
    let pairs8 = compare("alloc+free 1 MiB, 8 procs", "ns", |l, r| {
        pairs_run(&env, l, 8, r)
    })?;
    let mut startup = serde_json::Map::new();
    for n in [8, 32, 64] {
        let v = compare(&format!("start-up, {n} procs"), "s", |l, r| {
            startup_run(&env, l, n, r)
        })?;
        startup.insert(n.to_string(), v);
    }
    println!(
        "bench-limiter: {}",
        json!({"device": "sim-cuda (release)", "launch": launch, "pairs_1": pairs1,
               "pairs_8": pairs8, "startup": startup, "runs": RUNS})
    );
    let _ = fs::remove_dir_all(&tmp);
    Ok(())
}
