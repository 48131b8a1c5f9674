//! `cargo xtask bench pairs-cold`: the limiter's self-time per 1 MiB cuMemAlloc_v2 + cuMemFree_v2
//! pair when every call finds the caches cold, as when eight processes share a GPU and the driver
//! serialises their calls (each process enters the limiter once every few hundred microseconds).
//!
//! The simulated driver reads a private buffer at the end of every alloc and free
//! (`SIMCUDA_SWEEP`, small pages, so caches and TLB are both swept) and reports how long it spent
//! inside itself (`simcuda_last_call_ns`); `cuda-exercise pairs --outside` times each call alone
//! and subtracts that. What remains is the time outside the driver: for a native run the cost of
//! calling and timing a cold function, under the limiter that plus everything the limiter does
//! (entry, accounting, recording: more than the region's `hook_ns`, which leaves out the hook's
//! entry and its final record). Native and each limiter build are interleaved, `--runs` rounds;
//! the self-time of a build is its pair time outside the driver minus native's in the same round,
//! reported as the median over rounds, with the region's `hook_ns` per pair beside it.
//!
//! Options: `--sweep 2m,64m` (buffer sizes, each a separate table), `--pairs N` per run,
//! `--runs R`, `--limiter NAME=PATH` (more builds of `libvgpu_limiter.so` to compare, e.g. one
//! built from an earlier commit; `this` is the tree's own release build), `--sleep-us N` (every
//! alloc and free also sleeps N us inside the driver, as a call does that waits there for other
//! processes' calls: the thread leaves its core, and the kernel's and other work on that core
//! evict what the limiter left in the caches; the sweep still times the call). Prints a table
//! and a JSON line (`bench-pairs-cold: {...}`).

use crate::bench_fixtures::SimFixtures;
use std::{collections::BTreeMap, fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

struct Options {
    sweeps: Vec<String>,
    pairs: u64,
    runs: usize,
    limiters: Vec<(String, PathBuf)>,
    sleep_us: u64,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        sweeps: vec!["2m".into(), "64m".into()],
        pairs: 400,
        runs: 5,
        limiters: Vec::new(),
        sleep_us: 0,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--sweep" => o.sweeps = value()?.split(',').map(str::to_string).collect(),
            "--pairs" => o.pairs = value()?.parse()?,
            "--runs" => o.runs = value()?.parse()?,
            "--limiter" => {
                let v = value()?;
                let (name, path) = v.split_once('=').context("--limiter NAME=PATH")?;
                o.limiters.push((name.to_string(), PathBuf::from(path)));
            }
            "--sleep-us" => o.sleep_us = value()?.parse()?,
            other => {
                bail!("unknown option {other:?} (--sweep, --pairs, --runs, --limiter, --sleep-us)")
            }
        }
    }
    ensure!(
        o.runs > 0 && o.pairs > 0,
        "--runs and --pairs must be positive"
    );
    Ok(o)
}

/// One process's figures.
#[derive(Clone, Copy, Default)]
struct Sample {
    alloc: f64,
    free: f64,
    pair: f64,
    /// Region `hook_ns` per alloc + per free (limited runs).
    hook: f64,
}

fn one_run(
    exercise: &PathBuf,
    libcuda: &PathBuf,
    limiter: Option<&PathBuf>,
    sweep: &str,
    o: &Options,
    region: &PathBuf,
) -> Result<Sample> {
    let mut c = Command::new(exercise);
    c.arg("--lib").arg(libcuda);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CUDA_") || k.starts_with("VGPU_") || k.starts_with("SIMCUDA_") {
            c.env_remove(k);
        }
    }
    c.env("SIMCUDA_SWEEP", format!("alloc={sweep},free={sweep}"));
    if o.sleep_us > 0 {
        let us = o.sleep_us;
        c.env("SIMCUDA_DELAY_US", format!("alloc={us},free={us}"));
    }
    if let Some(lib) = limiter {
        crate::bench_fixtures::remove_region(region);
        c.env("LD_PRELOAD", lib)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "64g")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
            .env("VGPU_CONTEXT_BYTES", "0");
    }
    c.args(["pairs", "--outside", "--count", &o.pairs.to_string()]);
    let out = c.output()?;
    ensure!(
        out.status.success(),
        "cuda-exercise failed: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().context("no output")?)?;
    ensure!(v["errors"].as_u64() == Some(0), "errors in {v}");
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let per_call = |api: &str| {
        let a = &v["limiter"]["apis"][api];
        a["hook_ns"].as_f64().unwrap_or(0.0) / a["calls"].as_f64().unwrap_or(1.0)
    };
    Ok(Sample {
        alloc: f("alloc_outside_median_ns"),
        free: f("free_outside_median_ns"),
        pair: f("pair_outside_median_ns"),
        hook: per_call("cuMemAlloc_v2") + per_call("cuMemFree_v2"),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let SimFixtures { bin, tmp, libcuda } =
        crate::bench_fixtures::sim_fixtures("bench-pairs-cold")?;
    let exercise = bin.join("cuda-exercise");
    let region = PathBuf::from("/dev/shm").join(format!("bench-pairs-cold-{}", std::process::id()));
    let mut configs: Vec<(String, Option<PathBuf>)> = vec![
        ("native".into(), None),
        ("this".into(), Some(bin.join("libvgpu_limiter.so"))),
    ];
    configs.extend(o.limiters.iter().map(|(n, p)| (n.clone(), Some(p.clone()))));
    let mut report = serde_json::Map::new();
    for sweep in &o.sweeps {
        println!(
            "\nsweep {sweep} per call, sleep {} us per call, {} pairs per run, {} interleaved runs \
             (medians over runs, ns)",
            o.sleep_us, o.pairs, o.runs
        );
        let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
        for _ in 0..o.runs {
            for (name, lib) in &configs {
                let s = one_run(&exercise, &libcuda, lib.as_ref(), sweep, &o, &region)?;
                samples.entry(name.as_str()).or_default().push(s);
            }
        }
        let native = samples["native"].clone();
        println!(
            "{:<10} {:>9} {:>9} {:>9} {:>12} {:>14}",
            "build", "alloc", "free", "pair", "self/pair", "hook_ns/pair"
        );
        let mut table = serde_json::Map::new();
        for (name, _) in &configs {
            let s = &samples[name.as_str()];
            let field = |f: fn(&Sample) -> f64| median(s.iter().map(f).collect());
            let self_time = median(
                s.iter()
                    .zip(&native)
                    .map(|(l, n)| l.pair - n.pair)
                    .collect(),
            );
            let hook = field(|x| x.hook);
            println!(
                "{name:<10} {:>9.0} {:>9.0} {:>9.0} {:>12.0} {:>14.0}",
                field(|x| x.alloc),
                field(|x| x.free),
                field(|x| x.pair),
                self_time,
                hook
            );
            table.insert(
                name.clone(),
                json!({
                    "alloc_outside": s.iter().map(|x| x.alloc).collect::<Vec<_>>(),
                    "free_outside": s.iter().map(|x| x.free).collect::<Vec<_>>(),
                    "pair_outside": s.iter().map(|x| x.pair).collect::<Vec<_>>(),
                    "hook_per_pair": s.iter().map(|x| x.hook).collect::<Vec<_>>(),
                    "self_per_pair_median": self_time,
                }),
            );
        }
        report.insert(sweep.clone(), Value::Object(table));
    }
    println!(
        "bench-pairs-cold: {}",
        json!({"device": "sim-cuda (release)", "pairs": o.pairs, "runs": o.runs,
            "sleep_us": o.sleep_us, "sweeps": report})
    );
    crate::bench_fixtures::remove_region(&region);
    let _ = fs::remove_dir_all(&tmp);
    Ok(())
}
