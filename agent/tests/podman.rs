//! The agent and the limiter in real containers (Debian's podman with runc; root):
//!
//! - a workload started with `--device` naming a device of `vgpu-agent cdi generate`'s spec gets
//!   the limiter and its limit, in a region of its own;
//! - the agent's image (`cargo xtask image`) runs with exactly what deploy/base/daemonset.yaml asks of
//!   a runtime (the flags are derived from the manifest), attaches its probes to the workloads'
//!   driver, names their containers as podman does and reads the limiter's region, and serves
//!   all of it on /metrics.

mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use region::reader::{DeviceSnapshot, RegionReader};
use serde_json::Value;
use support::{podman::*, *};

const GIB: u64 = 1 << 30;
/// What the limiter charges per process for its context (its default `VGPU_CONTEXT_BYTES`).
const CONTEXT: u64 = 544 << 20;

/// Waits for a container's first output line (the workload's JSON).
fn first_line(c: &Container) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(line) = c.logs().lines().find(|l| l.starts_with('{')) {
            return serde_json::from_str(line).unwrap();
        }
        assert!(Instant::now() < deadline, "no output from {}", c.name);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn workload(name: &str, rootfs: &Path, extra: &[String], command: &[&str]) -> Container {
    let mut flags: Vec<String> = extra.to_vec();
    // stdin open: `hold` keeps its allocation until stdin closes (at removal).
    flags.extend(["-i".into(), "--rootfs".into(), rootfs.display().to_string()]);
    flags.push("/usr/bin/cuda-exercise".into());
    flags.extend(command.iter().map(|s| (*s).to_owned()));
    Container::run(name, &flags)
}

/// The region of a container whose process `pid` maps it, read from the host through
/// `/proc/<pid>/root` (the tmpfs is the container's own), once `ready` accepts it.
fn region_when(pid: u32, what: &str, ready: impl Fn(&DeviceSnapshot) -> bool) -> DeviceSnapshot {
    let path = PathBuf::from(format!(
        "/proc/{pid}/root/var/lib/vgpu-agent/region/vgpu.cache"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        // Resolved inside the container's root, as the agent does (a plain open refuses the
        // `/proc/<pid>/root` magic link).
        let read =
            tenant_fs::open_operator_path(Path::new("/proc"), &path, tenant_fs::Access::Read)
                .map_err(|e| e.to_string())
                .and_then(|f| RegionReader::from_file(f).map_err(|e| e.to_string()))
                .and_then(|r| r.snapshot().map_err(|e| e.to_string()));
        if let Ok(snapshot) = read {
            let dev = snapshot.devices[0].clone();
            if ready(&dev) {
                return dev;
            }
            last = Some(dev);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "the region at {} never showed {what}: {last:?}",
        path.display()
    );
}

#[test]
fn a_cdi_device_gives_a_podman_container_the_limiter_and_a_limit_of_its_own() {
    let _serial = serial();
    if !privileged() || !available() {
        return;
    }
    let tmp = tempdir();
    let rootfs = workload_rootfs(tmp.path());
    let spec = CdiSpec::install_and_generate(tmp.path(), &["small:mem=1g,sm=50"]);
    let prefix = format!("vgpu-cdi-{}", std::process::id());
    let device = spec.device("small");
    // The simulated device holds 8 GiB: a refusal below that is the limiter's.
    let sim = "--env=SIMCUDA_CAPACITY=8g".to_owned();

    // Allocates 64 MiB at a time until refused, frees half, again, until stopped.
    let limited = workload(
        &format!("{prefix}-a"),
        &rootfs,
        &[device.clone(), sim.clone()],
        &["pressure", "--chunk", "64m", "--delay-ms", "50"],
    );
    let pid = limited.pid();

    // The CDI edits are in place: the limiter preloaded (by /etc/ld.so.preload, not the
    // environment) and mapped, HAMi's variables set, the region on a tmpfs of its own.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    for var in [
        "CUDA_DEVICE_MEMORY_LIMIT=1g",
        "CUDA_DEVICE_SM_LIMIT=50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/lib/vgpu-agent/region/vgpu.cache",
    ] {
        assert!(environ.split('\0').any(|e| e == var), "{var} in {environ}");
    }
    assert!(!environ.contains("LD_PRELOAD="), "{environ}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" /var/lib/vgpu-agent/region ") && l.contains(" - tmpfs ")),
        "{mounts}"
    );

    // The limit holds: allocations past 1 GiB (context included) are denied, and the region
    // says so.
    let dev = region_when(pid, "a denial", |d| d.denied >= 1);
    assert_eq!(dev.memory_limit, GIB);
    assert!(dev.reserved <= GIB, "{dev:?}");
    assert!(dev.reserved >= CONTEXT, "the context is charged: {dev:?}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains("/usr/local/lib/vgpu-agent/libvgpu_limiter.so"),
        "the limiter is not mapped:\n{maps}"
    );

    // Another container asking for the same device has a limit of its own: 300 MiB fit there
    // while the first container is at its limit.
    let other = workload(
        &format!("{prefix}-b"),
        &rootfs,
        &[device, sim],
        &["hold", "--bytes", "300m"],
    );
    assert_eq!(first_line(&other)["result"], 0, "{}", other.logs());
    let other_dev = region_when(other.pid(), "the second container's hold", |d| {
        d.reserved == CONTEXT + (300 << 20)
    });
    assert_eq!(other_dev.denied, 0);

    // Stopped, the workload reports what the limiter refused.
    podman(&["stop", "-t", "10", &limited.name]);
    let report = first_line(&limited);
    assert!(report["refused"].as_u64().unwrap() >= 1, "{report}");
    assert!(report["allocations"].as_u64().unwrap() >= 1, "{report}");
}

/// Polls /metrics in the agent's network namespace until `ready` accepts it.
fn metrics_when(agent: &Container, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok((200, body)) = http_get_in_netns(agent.pid(), 9400, "/metrics") {
            if ready(&body) {
                return body;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "/metrics never showed {what}; agent log:\n{}\nlast /metrics:\n{last}",
        agent.logs()
    );
}

fn status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("{field} in {status}"))
        .trim()
}

#[test]
fn the_daemonsets_agent_in_podman_names_podman_containers_and_reads_their_limiter() {
    let _serial = serial();
    if !privileged() || !available() {
        return;
    }
    let tmp = tempdir();
    let id = std::process::id();
    let rootfs = workload_rootfs(tmp.path());
    let spec = CdiSpec::install_and_generate(tmp.path(), &["small:mem=1g"]);
    let image = AgentImage::build_and_load(tmp.path(), &format!("localhost/vgpu-agent-test:{id}"));

    // Two workloads allocating in rounds: one plain, one under the limiter through CDI.
    let plain_name = format!("vgpu-test-{id}-plain");
    let limited_name = format!("vgpu-test-{id}-limited");
    let pressure = ["pressure", "--chunk", "64m", "--delay-ms", "100"];
    let plain = workload(
        &plain_name,
        &rootfs,
        &["--env=SIMCUDA_CAPACITY=1g".into()],
        &pressure,
    );
    let limited = workload(
        &limited_name,
        &rootfs,
        &[spec.device("small"), "--env=SIMCUDA_CAPACITY=8g".into()],
        &pressure,
    );

    // The agent, exactly as the DaemonSet runs it (but its socket directory, which is the
    // test's own).
    let ds = daemonset();
    let sock_dir = tmp.path().join("run");
    let (mut flags, args) = flags_from_daemonset(&ds, &BTreeMap::from([("run", sock_dir.clone())]));
    flags.push(image.tag.clone());
    flags.extend(args);
    let agent = Container::run(&format!("vgpu-test-{id}-agent"), &flags);
    let agent_pid = agent.pid();

    // The runtime applied the securityContext: only the DaemonSet's capabilities, no new
    // privileges, no seccomp filter, a read-only root, the host's pids.
    let status = std::fs::read_to_string(format!("/proc/{agent_pid}/status")).unwrap();
    let cap_eff = u64::from_str_radix(status_field(&status, "CapEff:"), 16).unwrap();
    // DAC_READ_SEARCH, SYS_PTRACE, PERFMON, BPF, CHECKPOINT_RESTORE
    let want: u64 = [2u32, 19, 38, 39, 40].iter().map(|b| 1u64 << b).sum();
    assert_eq!(cap_eff, want, "CapEff {cap_eff:#x}");
    assert_eq!(status_field(&status, "NoNewPrivs:"), "1");
    assert_eq!(status_field(&status, "Seccomp:"), "0");
    let mounts = std::fs::read_to_string(format!("/proc/{agent_pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap();
    assert!(root.split(' ').nth(5).unwrap().starts_with("ro"), "{root}");
    assert!(
        std::fs::read_link(format!("/proc/{agent_pid}/ns/pid")).unwrap()
            == std::fs::read_link("/proc/self/ns/pid").unwrap()
    );

    // Probes attached to the workloads' driver, calls counted under podman's names.
    let plain_allocs = [
        ("container", plain_name.as_str()),
        ("kind", "alloc"),
        ("source", "probes"),
    ];
    let body = metrics_when(&agent, "the plain workload's allocations by name", |m| {
        series(m, "vgpu_api_calls_total", &plain_allocs)
            .iter()
            .any(|v| *v > 0.0)
    });
    assert_eq!(series(&body, "vgpu_agent_probes_up", &[]), [1.0]);
    assert!(series(&body, "vgpu_agent_probed_libraries", &[])[0] >= 1.0);
    // The limiter's region, read through the limited workload's processes.
    let limited_label = [("container", limited_name.as_str())];
    let body = metrics_when(&agent, "the limited workload's denials", |m| {
        series(m, "vgpu_container_allocations_denied_total", &limited_label)
            .iter()
            .any(|v| *v > 0.0)
    });
    assert_eq!(
        series(&body, "vgpu_container_memory_limit_bytes", &limited_label),
        [GIB as f64]
    );
    let held = series(
        &body,
        "vgpu_container_memory_used_bytes",
        &[("container", &limited_name), ("view", "limiter")],
    );
    assert!(
        !held.is_empty() && held.iter().all(|v| *v <= GIB as f64),
        "{held:?}"
    );
    // Names are not ids: neither container shows as `podman <id>`.
    for c in [&plain, &limited] {
        let short = &c.id()[..12];
        assert!(!body.contains(short), "{} shown by id", c.name);
    }
    // The agent's model socket is where the DaemonSet puts it.
    assert!(sock_dir.join("agent.sock").exists());
}
