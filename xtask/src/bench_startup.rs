//! `cargo xtask bench startup`: the limiter's own start-up time when many processes start
//! together, against the simulated driver: N processes of `cuda-exercise pairs --count 1`
//! (cuInit, context, one allocation) spawned at once on one fresh region, each under the limiter
//! with its log at `info`. Per process the limiter's start-up self-time is what
//! `scripts/gpu/bench-limiter.sh` adds up on the GPU machine: initialisation + slot claim (wall
//! clock, from the log) + hook self-time during start-up (the region's `hook_ns`); the log also
//! gives the CPU time of initialisation and claim, so wall time splits into work and waiting
//! (descheduled, or for another process). Reported per round: the slowest process's self-time and
//! its CPU share; then medians over rounds. Builds are interleaved round by round.
//!
//! Options: `--procs 8,32,64`, `--rounds R`, `--precreate` (a process initialises the region
//! first and exits, so that nobody waits for an initialiser), `--limiter NAME=PATH` (more builds of
//! `libvgpu_limiter.so` to compare; `this` is the tree's own release build). Prints a table and a
//! JSON line (`bench-startup: {...}`).

use crate::bench_fixtures::SimFixtures;
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

/// One process's start-up figures, microseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Startup {
    init: f64,
    init_cpu: f64,
    claim: f64,
    claim_cpu: f64,
    hook: f64,
}

impl Startup {
    fn total(&self) -> f64 {
        self.init + self.claim + self.hook
    }
    fn cpu(&self) -> f64 {
        self.init_cpu + self.claim_cpu
    }
}

/// `<prefix> in N us (cpu M us)` from a log line: (N, M); M is absent (0) in older builds.
fn figures(log: &str, prefix: &str) -> Option<(f64, f64)> {
    let line = log.lines().find(|l| l.contains(prefix))?;
    let after = &line[line.find(prefix)? + prefix.len()..];
    let rest = after.split_once(" in ")?.1;
    let wall = rest.split_whitespace().next()?.parse().ok()?;
    let cpu = rest
        .split_once("(cpu ")
        .and_then(|(_, c)| c.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Some((wall, cpu))
}

fn round(
    exercise: &Path,
    libcuda: &Path,
    limiter: &Path,
    (procs, precreate): (usize, bool),
    region: &Path,
) -> Result<Vec<Startup>> {
    crate::bench_fixtures::remove_region(region);
    // `--precreate`: one process initialises the region (and the control block) and exits
    // first, so that no one waits for an initialiser.
    let spawn = |n: usize| {
        (0..n)
            .map(|_| {
                let mut c = Command::new(exercise);
                for (k, _) in std::env::vars_os() {
                    let k = k.to_string_lossy().into_owned();
                    if k.starts_with("CUDA_") || k.starts_with("VGPU_") || k.starts_with("SIMCUDA_")
                    {
                        c.env_remove(k);
                    }
                }
                c.arg("--lib")
                    .arg(libcuda)
                    .args(["pairs", "--count", "1"])
                    .env("LD_PRELOAD", limiter)
                    .env("CUDA_DEVICE_MEMORY_LIMIT", "64g")
                    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
                    .env("LIBCUDA_LOG_LEVEL", "3")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<Vec<_>, _>>()
    };
    if precreate {
        for k in spawn(1)? {
            ensure!(
                k.wait_with_output()?.status.success(),
                "the pre-creating process failed"
            );
        }
    }
    let kids = spawn(procs)?;
    let mut out = Vec::new();
    for k in kids {
        let o = k.wait_with_output()?;
        ensure!(o.status.success(), "a start-up process failed: {o:?}");
        let log = String::from_utf8_lossy(&o.stderr);
        let (init, init_cpu) = figures(&log, "initialised").context("no initialisation line")?;
        let (claim, claim_cpu) = figures(&log, "claimed slot").context("no claim line")?;
        let text = String::from_utf8_lossy(&o.stdout);
        let v: Value = serde_json::from_str(text.lines().last().context("no output")?)?;
        let hook = v["limiter"]["hook_ns_total"].as_f64().unwrap_or(0.0) / 1000.0;
        out.push(Startup {
            init,
            init_cpu,
            claim,
            claim_cpu,
            hook,
        });
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String]) -> Result<()> {
    let (mut procs, mut rounds, mut extra) = (vec![8, 32, 64], 5usize, Vec::new());
    let mut precreate = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--procs" => {
                procs = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--rounds" => rounds = value()?.parse()?,
            "--precreate" => precreate = true,
            "--limiter" => {
                let v = value()?;
                let (name, path) = v.split_once('=').context("--limiter NAME=PATH")?;
                extra.push((name.to_string(), PathBuf::from(path)));
            }
            other => bail!("unknown option {other:?} (--procs, --rounds, --precreate, --limiter)"),
        }
    }
    let SimFixtures { bin, tmp, libcuda } = crate::bench_fixtures::sim_fixtures("bench-startup")?;
    let exercise = bin.join("cuda-exercise");
    // Regions on tmpfs, as in production (docs/region.md, "Start-up").
    let region =
        PathBuf::from("/dev/shm").join(format!("bench-startup-{}.region", std::process::id()));
    let mut builds = vec![("this".to_string(), bin.join("libvgpu_limiter.so"))];
    builds.extend(extra);
    let mut report = serde_json::Map::new();
    println!("(slowest process per round: init + claim + hooks, wall us; its init+claim CPU us)");
    for &n in &procs {
        let mut per: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); builds.len()];
        for _ in 0..rounds {
            for (b, (_, lib)) in builds.iter().enumerate() {
                let all = round(&exercise, &libcuda, lib, (n, precreate), &region)?;
                let slowest = all
                    .iter()
                    .max_by(|a, b| a.total().total_cmp(&b.total()))
                    .copied()
                    .unwrap_or_default();
                let med = median(all.iter().map(Startup::total).collect());
                per[b].push((slowest.total(), slowest.cpu(), med));
            }
        }
        let mut row = serde_json::Map::new();
        for (b, (name, _)) in builds.iter().enumerate() {
            let s = &per[b];
            println!(
                "{n:>3} procs {name:<10} slowest {:>7.0} us (cpu {:>5.0} us; rounds {:?})   median process {:>6.0} us",
                median(s.iter().map(|x| x.0).collect()),
                median(s.iter().map(|x| x.1).collect()),
                s.iter().map(|x| x.0.round()).collect::<Vec<_>>(),
                median(s.iter().map(|x| x.2).collect()),
            );
            row.insert(
                name.clone(),
                json!({
                    "slowest_us": s.iter().map(|x| x.0).collect::<Vec<_>>(),
                    "slowest_cpu_us": s.iter().map(|x| x.1).collect::<Vec<_>>(),
                    "median_process_us": s.iter().map(|x| x.2).collect::<Vec<_>>(),
                }),
            );
        }
        report.insert(n.to_string(), Value::Object(row));
    }
    println!(
        "bench-startup: {}",
        json!({"device": "sim-cuda (release)", "rounds": rounds, "procs": report})
    );
    crate::bench_fixtures::remove_region(&region);
    let _ = fs::remove_dir_all(&tmp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::figures;

    #[test]
    fn log_figures_parse_with_and_without_cpu() {
        let log = "[vgpu-limiter 1] INFO: initialised in 312 us (cpu 250 us): memory limits [..]\n\
                   [vgpu-limiter 1] INFO: claimed slot 97 of /dev/shm/r in 57 us\n";
        assert_eq!(figures(log, "initialised"), Some((312.0, 250.0)));
        assert_eq!(figures(log, "claimed slot"), Some((57.0, 0.0)));
        assert_eq!(figures(log, "nothing"), None);
    }
}
