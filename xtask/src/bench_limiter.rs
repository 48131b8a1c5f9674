//! `cargo xtask bench limiter`: what the preloaded limiter costs, against the simulated driver.
//! Native and limited runs are interleaved (A B A B ...), `RUNS` of each, and
//! reported as medians with their spread (min..max over runs) and as limited/native ratios:
//!
//! - launches: `cuda-exercise launch-loop` (cuLaunchKernel through a pointer resolved once, the
//!   median of 1,000,000 individually timed launches per run), with the limiter's GPU-time
//!   sampling at its default (`auto`) and again with it off (`VGPU_GPU_TIME_SAMPLE=off`): the
//!   difference is what sampling adds to a launch;
//! - 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pairs: `cuda-exercise pairs`, median pair time, with 1 and
//!   with 8 processes timing at once after a barrier (the slowest process's median);
//! - start-up of 8, 32 and 64 processes started together (cuInit + context + one allocation):
//!   the slowest process's wall time from spawn to exit.
//!
//! The limited runs use a 64 GiB limit, a fresh region per run and `VGPU_CONTEXT_BYTES=0`.
//! `--limiter NAME=PATH` adds another build of `libvgpu_limiter.so` (e.g. one of an earlier
//! commit) to the comparison; the configurations' order rotates every run. Prints a table and a
//! JSON line (`bench-limiter: {...}`). `scripts/gpu/bench-limiter.sh` runs the same comparison
//! against the real driver on the GPU machine.

use crate::bench_fixtures::SimFixtures;
use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

const RUNS: usize = 3;
const LAUNCHES: u64 = 1_000_000;
const PAIRS: u64 = 100_000;

struct Env {
    exercise: PathBuf,
    /// The limiter builds, by name (`this`: the tree's release build).
    limiters: Vec<(String, PathBuf)>,
    libcuda: PathBuf,
    tmp: PathBuf,
}

/// Native (`None`) or under the limiter build of that index.
type Config = Option<usize>;

impl Env {
    fn command(&self, limited: Config, tag: &str) -> Command {
        let mut c = Command::new(&self.exercise);
        c.arg("--lib").arg(&self.libcuda).stderr(Stdio::inherit());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CUDA_") || k.starts_with("VGPU_") || k.starts_with("SIMCUDA_") {
                c.env_remove(k);
            }
        }
        if let Some(i) = limited {
            let region = self.tmp.join(format!("{tag}.region"));
            crate::bench_fixtures::remove_region(&region);
            c.env("LD_PRELOAD", &self.limiters[i].1)
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

fn launch_run(env: &Env, limited: Config, run: usize, sampling: Option<&str>) -> Result<f64> {
    let mut cmd = env.command(limited, &format!("launch-{run}"));
    if let Some(s) = sampling {
        cmd.env("VGPU_GPU_TIME_SAMPLE", s);
    }
    let out = cmd
        .args(["launch-loop", "--count", &LAUNCHES.to_string()])
        .output()?;
    Ok(json_of(&out)?["launch_ns"].as_f64().unwrap_or(0.0))
}

/// `procs` processes time `PAIRS` pairs each after a common barrier; the slowest median.
fn pairs_run(env: &Env, limited: Config, procs: usize, run: usize) -> Result<f64> {
    let who = limited.map_or_else(|| "native".to_string(), |i| format!("build{i}"));
    let tag = format!("pairs-{procs}-{run}-{who}");
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
fn startup_run(env: &Env, limited: Config, procs: usize, run: usize) -> Result<f64> {
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

/// Interleaves native and limited runs of `f` (the order rotating every run); returns the JSON
/// summary and prints a row per build (seconds are shown as milliseconds).
fn compare(
    env: &Env,
    name: &str,
    unit: &str,
    mut f: impl FnMut(Config, usize) -> Result<f64>,
) -> Result<Value> {
    let configs: Vec<Config> = std::iter::once(None)
        .chain((0..env.limiters.len()).map(Some))
        .collect();
    let mut runs = vec![Vec::new(); configs.len()];
    for run in 0..RUNS {
        for k in 0..configs.len() {
            let c = (k + run) % configs.len();
            runs[c].push(f(configs[c], run)?);
        }
    }
    let (scale, shown) = if unit == "s" {
        (1000.0, "ms")
    } else {
        (1.0, unit)
    };
    let spread = |v: &[f64]| format!("{:.0}..{:.0}", v[0] * scale, v[v.len() - 1] * scale);
    let mut native = runs[0].clone();
    let n = median(&mut native);
    let mut builds = serde_json::Map::new();
    for (i, (build, _)) in env.limiters.iter().enumerate() {
        let mut limited = runs[i + 1].clone();
        let l = median(&mut limited);
        println!(
            "{name:<26} native {:>8.0} {shown} ({})   {build} {:>8.0} {shown} ({})   {:+.0} {shown}   x{:.3}",
            n * scale,
            spread(&native),
            l * scale,
            spread(&limited),
            (l - n) * scale,
            l / n,
        );
        builds.insert(
            build.clone(),
            json!({"limited": limited, "limited_median": l, "delta": l - n, "ratio": l / n}),
        );
    }
    let this = &builds["this"];
    Ok(
        json!({"native": native, "limited": this["limited"], "native_median": n,
              "limited_median": this["limited_median"], "delta": this["delta"],
              "ratio": this["ratio"], "unit": unit, "builds": builds}),
    )
}

pub fn run(args: &[String]) -> Result<()> {
    let mut extra = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--limiter", Some(v)) => {
                let (name, path) = v.split_once('=').context("--limiter NAME=PATH")?;
                ensure!(name != "this", "`this` names the tree's own build");
                extra.push((name.to_string(), PathBuf::from(path)));
            }
            _ => bail!("unknown option {a:?} (--limiter NAME=PATH)"),
        }
    }
    let SimFixtures { bin, tmp, libcuda } = crate::bench_fixtures::sim_fixtures("bench-limiter")?;
    let mut limiters = vec![("this".to_string(), bin.join("libvgpu_limiter.so"))];
    limiters.extend(extra);
    let env = Env {
        exercise: bin.join("cuda-exercise"),
        limiters,
        libcuda,
        tmp: tmp.clone(),
    };
    println!("(medians of {RUNS} interleaved runs; spread = min..max; start-up spread in ms)");
    let launch = compare(&env, "launch, ns", "ns", |l, r| {
        launch_run(&env, l, r, None)
    })?;
    let launch_unsampled = compare(&env, "launch, sampling off, ns", "ns", |l, r| {
        launch_run(&env, l, r, Some("off"))
    })?;
    let pairs1 = compare(&env, "alloc+free 1 MiB, 1 proc", "ns", |l, r| {
        pairs_run(&env, l, 1, r)
    })?;
    let pairs8 = compare(&env, "alloc+free 1 MiB, 8 procs", "ns", |l, r| {
        pairs_run(&env, l, 8, r)
    })?;
    let mut startup = serde_json::Map::new();
    for n in [8, 32, 64] {
        let v = compare(&env, &format!("start-up, {n} procs"), "s", |l, r| {
            startup_run(&env, l, n, r)
        })?;
        startup.insert(n.to_string(), v);
    }
    println!(
        "bench-limiter: {}",
        json!({"device": "sim-cuda (release)", "launch": launch,
               "launch_sampling_off": launch_unsampled, "pairs_1": pairs1,
               "pairs_8": pairs8, "startup": startup, "runs": RUNS})
    );
    let _ = fs::remove_dir_all(&tmp);
    Ok(())
}
