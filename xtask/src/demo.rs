//! `cargo xtask demo`: `vgpu-agent top` on a machine without a GPU. Starts simulated-driver
//! workloads (`testing/`) in two cgroups shaped like a docker container and a Kubernetes pod, one
//! of them under the limiter working near its limit (`demo_workloads`, which the end-to-end test
//! of `top` shares), opens `top` on them in this terminal, and removes everything (processes,
//! cgroups, files) when `top` exits or the demo is told to stop (its terminal closed, SIGINT,
//! SIGTERM); killed outright, it still takes its workloads with it.

use std::{
    path::PathBuf,
    process::{Child, Command, ExitStatus},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    demo_workloads::{self as w, Group, Paths},
    util::{self, cmd, repo_root},
};

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
    let dir = std::env::temp_dir().join(format!("vgpu-demo-{}", std::process::id()));
    let ids = w::Ids::demo();
    let mut demo = Demo {
        dir: dir.clone(),
        cgroups: vec![
            w::cgroup(&top_cgroup, &ids, Group::Plain),
            w::cgroup(&top_cgroup, &ids, Group::Limited),
        ],
        top_cgroup: top_cgroup.clone(),
        children: Vec::new(),
    };
    for cg in &demo.cgroups {
        std::fs::create_dir_all(cg).with_context(|| format!("creating {}", cg.display()))?;
    }
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir)?;
    let paths = Paths {
        exercise: bin.join("cuda-exercise"),
        lib: lib_dir.join("libcuda.so.1"),
        limiter: bin.join("libvgpu_limiter.so"),
        regions: dir.join("regions"),
        ids,
    };
    std::fs::copy(bin.join("libsimcuda.so"), &paths.lib).context("copying the simulated driver")?;
    w::prepare(&paths)?;
    for workload in w::workloads(&paths) {
        demo.children
            .push(w::start(&paths, &top_cgroup, &workload).context("starting a workload")?);
    }
    println!(
        "demo: two containers on a simulated GPU (testing/sim-cuda, {cap} of memory, no NVIDIA \
         driver: top's header says so, and the SM% column stays `-`):\n\
         - docker container {plain}: a process launching kernels and a process that fills the \
         device and frees the older half, again and again, no limiter;\n\
         - pod {pod} container {limited}: under the limiter (libvgpu_limiter.so) with a {limit} \
         limit. The limiter charges each process {ctx} for its context before its first \
         allocation, then one process allocates {chunk} at a time until the limiter refuses one \
         and frees the older half: the bar moves between about 60% and 95% of the limit and \
         DENIED grows every round.\n\
         The limiter's region is {region}. Press ? for help, e for what the header's lost and \
         errors count, q to quit.",
        cap = w::CAPACITY,
        plain = paths.ids.short(Group::Plain),
        pod = paths.ids.pod_uid,
        limited = paths.ids.short(Group::Limited),
        limit = w::LIMIT,
        ctx = w::CONTEXT_CHARGE,
        chunk = w::LIMITED_CHUNK,
        region = paths.region_file().display(),
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    let status = run_top(Command::new(bin.join("vgpu-agent")).args(w::top_args(&paths)))?;
    drop(demo);
    // Relaxed: see `on_stop_signal`.
    if !status.success() && !STOP.load(Ordering::Relaxed) {
        bail!("vgpu-agent top failed ({status})");
    }
    Ok(())
}

/// Set by SIGHUP, SIGINT and SIGTERM while `top` runs.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Relaxed: a flag polled by the same process; nothing else is published with it.
    STOP.store(true, Ordering::Relaxed);
}

/// Runs `top` until it exits, or until the demo is told to stop (its terminal closed: SIGHUP;
/// SIGINT; SIGTERM), then stops `top` too: either way the caller removes the workloads, cgroups
/// and files after. (Were the demo killed outright, the workloads would still end with it: see
/// `demo_workloads::start`.)
fn run_top(top: &mut Command) -> Result<ExitStatus> {
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
    let mut child = top.spawn().context("starting vgpu-agent top")?;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if STOP.load(Ordering::Relaxed) {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            return Ok(child.wait()?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
