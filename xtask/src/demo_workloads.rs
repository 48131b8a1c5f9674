//! The demo's workloads and `top` command line (`cargo xtask demo`), shared with the end-to-end
//! test of `top` (`agent/tests/top_tmux.rs` includes this file with `#[path]`), so that the test
//! checks what the demo shows. Plain `std`: it compiles in both crates.
//!
//! Two containers on the simulated driver (`testing/sim-cuda`, 8 GiB): a docker container with
//! a process launching kernels and one filling the device and freeing the older half, again and
//! again, without a limiter; and a Kubernetes pod under the limiter with a [`LIMIT`] limit: one
//! process launching kernels, one allocating [`LIMITED_CHUNK`] chunks until the limiter refuses
//! one, waiting, freeing the older half, again and again. The limiter charges each process's context
//! ([`CONTEXT_CHARGE`], its default, what an H200 takes) before its first allocation, so the
//! pod's memory moves between about 60% and 95% of its limit and every round ends in a denial.
#![allow(dead_code)] // Each includer uses part of it.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

pub const PLAIN_ID: &str = "de30a1b2c3d4e5f60718293a4b5c6d7e8f901234567890123456789012345678";
pub const LIMITED_ID: &str = "de30f1e2d3c4b5a69788796a5b4c3d2e1f0fedcba9876543210fedcba9876543";
pub const POD_UID: &str = "5eed0000-de30-4000-8000-00000000de30";
/// The pod's memory limit: room for two contexts and some allocations.
pub const LIMIT: &str = "2g";
pub const LIMIT_BYTES: u64 = 2 << 30;
/// The context charge per process (`VGPU_CONTEXT_BYTES`, set so the demo does not depend on the
/// limiter's default).
pub const CONTEXT_CHARGE: &str = "544m";
pub const CONTEXT_CHARGE_BYTES: u64 = 544 << 20;
/// What the pod's allocating process asks for at a time.
pub const LIMITED_CHUNK: &str = "128m";
/// The simulated device's memory.
pub const CAPACITY: &str = "8g";

/// Where the workloads' files are.
pub struct Paths {
    /// `cuda-exercise`.
    pub exercise: PathBuf,
    /// The simulated driver, as `libcuda.so.1`.
    pub lib: PathBuf,
    /// `libvgpu_limiter.so`.
    pub limiter: PathBuf,
    /// The directory `top --region-dir` reads; the pod's region goes in a directory below it.
    pub regions: PathBuf,
}

impl Paths {
    /// The pod's region file.
    pub fn region_file(&self) -> PathBuf {
        self.regions
            .join(format!("pod{POD_UID}"))
            .join("vgpu.cache")
    }
}

/// Creates the pod's region directory.
pub fn prepare(p: &Paths) -> std::io::Result<()> {
    std::fs::create_dir_all(p.region_file().parent().expect("a directory"))
}

/// Which cgroup a workload runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// The docker container without a limiter.
    Plain,
    /// The pod's container, under the limiter.
    Limited,
}

/// The two cgroups below `top`, shaped like docker's and a Kubernetes pod's.
pub fn cgroup(top: &Path, group: Group) -> PathBuf {
    match group {
        Group::Plain => top.join("docker").join(PLAIN_ID),
        Group::Limited => top
            .join("kubepods/burstable")
            .join(format!("pod{POD_UID}"))
            .join(LIMITED_ID),
    }
}

pub struct Workload {
    pub group: Group,
    /// `cuda-exercise` arguments after `--lib`.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The four workloads.
pub fn workloads(p: &Paths) -> Vec<Workload> {
    let sim = |delays: &str| {
        vec![
            ("SIMCUDA_CAPACITY".to_string(), CAPACITY.to_string()),
            // Launches keep the device busy for 200 us; synchronisation waits for them.
            ("SIMCUDA_LAUNCH_US".to_string(), "200".to_string()),
            ("SIMCUDA_DELAY_US".to_string(), delays.to_string()),
        ]
    };
    let limited = |mut env: Vec<(String, String)>| {
        env.extend([
            ("LD_PRELOAD".to_string(), p.limiter.display().to_string()),
            ("VGPU_REAL_LIBCUDA".to_string(), p.lib.display().to_string()),
            ("CUDA_DEVICE_MEMORY_LIMIT".to_string(), LIMIT.to_string()),
            ("VGPU_CONTEXT_BYTES".to_string(), CONTEXT_CHARGE.to_string()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
                p.region_file().display().to_string(),
            ),
        ]);
        env
    };
    // Long-lived processes (`--seconds`: they must not watch their stdin, which is /dev/null),
    // so the table is not flooded with short-lived ones.
    vec![
        Workload {
            group: Group::Plain,
            args: strings(&["launches", "--count", "10000000"]),
            env: sim("launch=500"),
        },
        Workload {
            group: Group::Plain,
            args: strings(&[
                "pressure",
                "--chunk",
                "256m",
                "--delay-ms",
                "500",
                "--seconds",
                "86400",
            ]),
            env: sim("alloc=40,free=20"),
        },
        Workload {
            group: Group::Limited,
            args: strings(&[
                "pressure",
                "--chunk",
                LIMITED_CHUNK,
                "--delay-ms",
                "700",
                "--seconds",
                "86400",
            ]),
            env: limited(sim("alloc=40,free=20")),
        },
        Workload {
            group: Group::Limited,
            args: strings(&["launches", "--count", "10000000"]),
            env: limited(sim("launch=1000")),
        },
    ]
}

/// Starts a workload with `sh` in its cgroup below `top` (the shell moves itself there before
/// running anything, so the workload is in the cgroup from its first instruction), in a process
/// group of its own (keys typed into `top` never reach it), with no inherited `SIMCUDA_*`. It is
/// killed when the process that started it ends, however that ends (a closed terminal, SIGTERM,
/// SIGKILL): in a process group of its own, no signal of the terminal would reach it.
pub fn start(p: &Paths, top: &Path, w: &Workload) -> std::io::Result<Child> {
    let script = format!(
        "echo $$ > '{}/cgroup.procs' || exit 1\nexec \"$@\"",
        cgroup(top, w.group).display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &script, "sh"])
        .arg(&p.exercise)
        .arg("--lib")
        .arg(&p.lib)
        .args(&w.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SIMCUDA_") {
            c.env_remove(&k);
        }
    }
    c.envs(w.env.iter().map(|(k, v)| (k, v)));
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent;
    // the setting survives the exec of `sh` and of the workload.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.spawn()
}

/// `vgpu-agent top`'s arguments in the demo.
pub fn top_args(p: &Paths) -> Vec<String> {
    let mut v = strings(&[
        "top",
        "--no-daemon",
        "--probe-launches",
        "sampled",
        "--launch-window",
        "2s",
        "--launch-period",
        "6s",
        "--region-dir",
    ]);
    v.push(p.regions.display().to_string());
    v
}
