//! `cargo xtask demo`: `vgpu-agent top` on a machine without a GPU. Starts simulated-driver
//! workloads (`testing/`) in two cgroups shaped like a docker container and a Kubernetes pod, one
//! of them under the limiter with a limit it keeps hitting, opens `top` on them in this terminal,
//! and removes everything (processes, cgroups, files) when `top` exits.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd, repo_root};

const PLAIN_ID: &str = "de30a1b2c3d4e5f60718293a4b5c6d7e8f901234567890123456789012345678";
const LIMITED_ID: &str = "de30f1e2d3c4b5a69788796a5b4c3d2e1f0fedcba9876543210fedcba9876543";
const POD_UID: &str = "5eed0000-de30-4000-8000-00000000de30";
const LIMIT: &str = "512m";

fn cgroup2_root() -> Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            right.starts_with("cgroup2 ").then(|| PathBuf::from(mount))
        })
        .context("no cgroup2 file system is mounted: the demo needs cgroup v2")
}

/// What the demo made, removed when dropped (also on an error or a panic in between).
struct Demo {
    dir: PathBuf,
    cgroups: Vec<PathBuf>,
    top_cgroup: PathBuf,
    children: Vec<Child>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        for cg in &self.cgroups {
            // cgroup.kill (Linux 5.14) ends every process in the cgroup at once.
            if std::fs::write(cg.join("cgroup.kill"), "1").is_err()
                && let Ok(pids) = std::fs::read_to_string(cg.join("cgroup.procs"))
            {
                for pid in pids.split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for cg in &self.cgroups {
            for _ in 0..50 {
                let mut p = cg.clone();
                while p.starts_with(&self.top_cgroup) && std::fs::remove_dir(&p).is_ok() {
                    p.pop();
                }
                if !cg.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        println!(
            "demo: workloads stopped, cgroups and {} removed",
            self.dir.display()
        );
    }
}

/// Starts `script` with `sh`, in `cgroup` (the shell moves itself there before running anything,
/// so every process it starts is in the cgroup from its first instruction).
fn start_in(cgroup: &Path, script: &str, env: &[(&str, String)]) -> Result<Child> {
    let full = format!(
        "echo $$ > '{}/cgroup.procs' || exit 1\n{script}",
        cgroup.display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &full])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    // Its own process group: keys typed into top never reach it.
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    c.spawn().context("starting a workload")
}

pub fn run() -> Result<()> {
    if !util::is_root() {
        bail!(
            "the demo needs root: it creates cgroups and loads eBPF probes. Run `sudo -E ./x demo` (or `sudo -E cargo xtask demo`)"
        );
    }
    crate::setup::run()?;
    util::step("building vgpu-agent, the limiter, the simulated driver and cuda-exercise");
    util::run(&mut cmd(
        "cargo",
        [
            "build",
            "--release",
            "-p",
            "vgpu-agent",
            "-p",
            "limiter",
            "-p",
            "sim-cuda",
            "-p",
            "cuda-exercise",
        ],
    ))?;
    let bin = repo_root().join("target/release");
    let root = cgroup2_root()?;
    let top_cgroup = root.join(format!("vgpu-demo-{}", std::process::id()));
    let plain_cg = top_cgroup.join("docker").join(PLAIN_ID);
    let limited_cg = top_cgroup
        .join("kubepods/burstable")
        .join(format!("pod{POD_UID}"))
        .join(LIMITED_ID);
    let dir = std::env::temp_dir().join(format!("vgpu-demo-{}", std::process::id()));
    let mut demo = Demo {
        dir: dir.clone(),
        cgroups: vec![plain_cg.clone(), limited_cg.clone()],
        top_cgroup,
        children: Vec::new(),
    };
    for cg in &demo.cgroups {
        std::fs::create_dir_all(cg).with_context(|| format!("creating {}", cg.display()))?;
    }
    let lib_dir = dir.join("lib");
    let regions = dir.join("regions");
    let region_dir = regions.join(format!("pod{POD_UID}"));
    std::fs::create_dir_all(&lib_dir)?;
    std::fs::create_dir_all(&region_dir)?;
    let lib = lib_dir.join("libcuda.so.1");
    std::fs::copy(bin.join("libsimcuda.so"), &lib).context("copying the simulated driver")?;

    let exercise = format!(
        "'{}' --lib '{}'",
        bin.join("cuda-exercise").display(),
        lib.display()
    );
    // The sim: 8 GiB per device; launches keep the device busy for 200 us; synchronisation waits.
    let sim = vec![
        ("SIMCUDA_CAPACITY", "8g".to_string()),
        ("SIMCUDA_LAUNCH_US", "200".to_string()),
        ("SIMCUDA_DELAY_US", "alloc=40,free=20".to_string()),
    ];
    // "train": kernel launches for hours (each call takes 500 us in the sim), long-lived so the
    // table is not flooded with short-lived processes.
    let mut launching = sim.clone();
    launching.push((
        "SIMCUDA_DELAY_US",
        "launch=500,alloc=40,free=20".to_string(),
    ));
    launching.retain(|(k, v)| *k != "SIMCUDA_DELAY_US" || v.starts_with("launch"));
    demo.children.push(start_in(
        &plain_cg,
        &format!("exec {exercise} launches --count 10000000"),
        &launching,
    )?);
    // A long-lived process that fills the simulated device (8 GiB) and frees half, again and
    // again (`--seconds`: it must not watch its stdin, which is /dev/null).
    demo.children.push(start_in(
        &plain_cg,
        &format!("exec {exercise} pressure --chunk 256m --delay-ms 500 --seconds 86400"),
        &sim,
    )?);
    // "serve", under the limiter: allocates until refused, frees half, again, forever.
    let mut limited = sim.clone();
    limited.extend([
        (
            "LD_PRELOAD",
            bin.join("libvgpu_limiter.so").display().to_string(),
        ),
        ("VGPU_REAL_LIBCUDA", lib.display().to_string()),
        ("CUDA_DEVICE_MEMORY_LIMIT", LIMIT.to_string()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            region_dir.join("vgpu.cache").display().to_string(),
        ),
    ]);
    demo.children.push(start_in(
        &limited_cg,
        &format!("exec {exercise} pressure --chunk 48m --delay-ms 250 --seconds 86400"),
        &limited,
    )?);
    let mut limited_launching = limited.clone();
    limited_launching.retain(|(k, _)| *k != "SIMCUDA_DELAY_US");
    limited_launching.push(("SIMCUDA_DELAY_US", "launch=1000".to_string()));
    demo.children.push(start_in(
        &limited_cg,
        &format!("exec {exercise} launches --count 10000000"),
        &limited_launching,
    )?);

    println!(
        "demo: two containers on a simulated GPU (testing/sim-cuda, 8 GiB):\n\
         - docker container {}: a process launching kernels and a \
         process that fills the simulated device and frees half, again and again, no limiter;\n\
         - pod {POD_UID} container {}: under the limiter (libvgpu_limiter.so) with a {LIMIT} limit \
         that it keeps hitting: its allocations are denied every round.\n\
         The limiter's region is {}: when the limiter writes it, top shows the pod's limit as a \
         bar, its denials and throttling. A limiter that does not write regions yet still \
         enforces the limit inside the process (allocations past it fail), but top cannot see \
         that: the pod's row then says `no limiter` and shows what the probes see.\n\
         There is no NVIDIA driver here, so top's header says so. Press ? for help, q to quit.",
        &PLAIN_ID[..12],
        &LIMITED_ID[..12],
        region_dir.join("vgpu.cache").display()
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = Command::new(bin.join("vgpu-agent"))
        .args([
            "top",
            "--no-daemon",
            "--probe-launches",
            "sampled",
            "--launch-window",
            "2s",
            "--launch-period",
            "6s",
            "--region-dir",
        ])
        .arg(&regions)
        .status()
        .context("starting vgpu-agent top")?;
    drop(demo);
    if !status.success() {
        bail!("vgpu-agent top failed ({status})");
    }
    Ok(())
}
