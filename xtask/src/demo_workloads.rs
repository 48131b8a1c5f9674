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

/// Who one set of workloads are: the docker container's id, and the pod's uid and container id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    pub plain: String,
    pub limited: String,
    pub pod_uid: String,
}

impl Ids {
    /// The demo's own ([`PLAIN_ID`], [`LIMITED_ID`], [`POD_UID`]).
    pub fn demo() -> Ids {
        Ids {
            plain: PLAIN_ID.to_string(),
            limited: LIMITED_ID.to_string(),
            pod_uid: POD_UID.to_string(),
        }
    }

    /// Ids of one run tagged `tag` (a test's pid): the container ids start with the tag's 8 hex
    /// digits (a filter on [`Ids::run_tag`] shows this run's two containers and nobody else's,
    /// the demo's included), and their 12-character short forms, as `top` shows them, differ.
    pub fn tagged(tag: u32) -> Ids {
        Ids {
            plain: format!("{tag:08x}{}", &PLAIN_ID[8..]),
            limited: format!("{tag:08x}{}", &LIMITED_ID[8..]),
            pod_uid: format!("{}{tag:012x}", &POD_UID[..24]),
        }
    }

    /// What this set's container ids begin with.
    pub fn run_tag(&self) -> &str {
        &self.plain[..8]
    }

    /// The short id `top` shows for a group's container.
    pub fn short(&self, group: Group) -> &str {
        match group {
            Group::Plain => &self.plain[..12],
            Group::Limited => &self.limited[..12],
        }
    }
}
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
    /// Who the workloads are.
    pub ids: Ids,
}

impl Paths {
    /// The pod's region file.
    pub fn region_file(&self) -> PathBuf {
        self.regions
            .join(format!("pod{}", self.ids.pod_uid))
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

/// The two cgroups below `top`, shaped like docker's and a Kubernetes pod's, of the workloads
/// `ids`.
pub fn cgroup(top: &Path, ids: &Ids, group: Group) -> PathBuf {
    match group {
        Group::Plain => top.join("docker").join(&ids.plain),
        Group::Limited => top
            .join("kubepods/burstable")
            .join(format!("pod{}", ids.pod_uid))
            .join(&ids.limited),
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
        cgroup(top, &p.ids, w.group).display()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_ids_are_nobody_elses_and_a_filter_on_the_tag_finds_both_containers() {
        let (a, b, demo) = (Ids::tagged(4242), Ids::tagged(4243), Ids::demo());
        for ids in [&a, &b, &demo] {
            assert_eq!(ids.plain.len(), 64, "{ids:?}");
            assert_eq!(ids.limited.len(), 64, "{ids:?}");
            assert!(
                ids.plain
                    .bytes()
                    .chain(ids.limited.bytes())
                    .all(|c| c.is_ascii_hexdigit())
            );
            assert_eq!(ids.pod_uid.len(), 36, "{ids:?}");
            assert_ne!(ids.short(Group::Plain), ids.short(Group::Limited));
        }
        // `top`'s filter keeps a container whose id contains the text: the run's tag keeps both of
        // its containers and neither of another run's nor the demo's.
        let tag = a.run_tag();
        assert!(a.plain.contains(tag) && a.limited.contains(tag));
        for other in [&b, &demo] {
            assert!(
                !other.plain.contains(tag) && !other.limited.contains(tag),
                "{other:?}"
            );
            assert_ne!(other.pod_uid, a.pod_uid);
            for g in [Group::Plain, Group::Limited] {
                assert_ne!(other.short(g), a.short(g));
                assert_ne!(
                    cgroup(Path::new("/sys/fs/cgroup/t"), other, g),
                    cgroup(Path::new("/sys/fs/cgroup/t"), &a, g)
                );
            }
        }
    }
}
