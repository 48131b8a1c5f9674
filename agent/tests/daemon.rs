//! `vgpu-agent run`: the model served on a Unix socket, with real probes (root).

mod support;

use std::{
    io::Read,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::*;

struct Daemon(Child, PathBuf);

impl Daemon {
    fn start(socket: &Path, args: &[&str]) -> Daemon {
        let child = Command::new(agent_bin())
            .args([
                "run",
                "--interval",
                "200ms",
                "--no-calibrate",
                "--no-nvml",
                "--socket",
            ])
            .arg(socket)
            .args(args)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        wait_until(
            Duration::from_secs(20),
            || UnixStream::connect(socket).is_ok(),
            "the daemon's socket",
        );
        Daemon(child, socket.to_owned())
    }

    fn snapshot(&self) -> Value {
        let mut s = UnixStream::connect(&self.1).unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).expect("a JSON snapshot")
    }

    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        self.0.wait().unwrap()
    }
}

fn process_of(snap: &Value, pid: u32) -> Option<&Value> {
    snap["processes"]
        .as_array()?
        .iter()
        .find(|p| p["key"]["pid"] == pid)
}

#[test]
fn two_processes_in_two_containers_a_corrupt_region_and_no_nvml() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let regions = dir.path().join("regions/poduid_ctr");
    std::fs::create_dir_all(&regions).unwrap();
    // The magic where a region has it (after the state word), then garbage.
    let mut corrupt = vec![0u8; std::mem::offset_of!(region::layout::RegionHeader, magic)];
    corrupt.extend(region::layout::REGION_MAGIC.to_le_bytes());
    corrupt.extend([0xa5u8; 4096]);
    std::fs::write(regions.join("corrupt.cache"), &corrupt).unwrap();

    let docker_id = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
    let k8s_id = "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22";
    let pod_uid = "ac04f3f2-1f2c-11e9-b015-1ebee232acfa";
    let tag = std::process::id();
    let cg_docker = TestCgroup::new(&format!("vgpu-test-{tag}/docker/{docker_id}"));
    let cg_k8s = TestCgroup::new(&format!(
        "vgpu-test-{tag}/kubepods/besteffort/pod{pod_uid}/{k8s_id}"
    ));

    let socket = dir.path().join("agent.sock");
    let region_dir = dir.path().join("regions");
    let daemon = Daemon::start(&socket, &["--region-dir", region_dir.to_str().unwrap()]);

    let mut holders = Vec::new();
    for (i, (cg, bytes)) in [(&cg_docker, 64u64 << 20), (&cg_k8s, 96 << 20)]
        .into_iter()
        .enumerate()
    {
        let wdir = dir.path().join(format!("w{i}"));
        std::fs::create_dir_all(&wdir).unwrap();
        let mut cmd = exercise(&lib);
        cmd.args(["hold", "--bytes", &bytes.to_string()])
            .stdin(Stdio::piped());
        if i == 1 {
            // The pod's process runs under the limiter, with its region where the daemon looks.
            cmd.env("LD_PRELOAD", limiter_lib())
                .env("VGPU_REAL_LIBCUDA", &lib)
                .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
                .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"));
        }
        let w = Workload::start(cmd, &wdir);
        cg.add(w.pid());
        holders.push((w, bytes));
    }
    // Let the daemon find and attach to the library before the allocations.
    wait_until(
        Duration::from_secs(10),
        || {
            daemon.snapshot()["agent"]["libraries"]
                .as_array()
                .is_some_and(|l| !l.is_empty())
        },
        "the daemon to attach to the simulated driver",
    );
    for (w, _) in &holders {
        w.go();
    }
    let pids: Vec<u32> = holders.iter().map(|(w, _)| w.pid()).collect();
    let want: Vec<u64> = holders.iter().map(|(_, b)| *b).collect();
    wait_until(
        Duration::from_secs(10),
        || {
            let s = daemon.snapshot();
            pids.iter()
                .zip(&want)
                .all(|(p, b)| process_of(&s, *p).is_some_and(|p| p["memory"]["probes"] == *b))
        },
        "both processes' live memory in the model",
    );
    let snap = daemon.snapshot();
    assert_eq!(snap["schema"], "vgpu-agent.model/v1");

    // Identity: two containers with the right runtime, ids and pod.
    let containers = snap["containers"].as_array().unwrap();
    let docker = containers
        .iter()
        .find(|c| c["container_id"] == docker_id)
        .expect("the docker container");
    assert_eq!(docker["runtime"], "docker");
    assert_eq!(docker["processes"][0]["pid"], pids[0]);
    let k8s = containers
        .iter()
        .find(|c| c["container_id"] == k8s_id)
        .expect("the pod's container");
    assert_eq!(k8s["pod_uid"], pod_uid);
    assert_eq!(k8s["qos"], "besteffort");
    assert_eq!(k8s["processes"][0]["pid"], pids[1]);

    // Region data: the limited container's region, its limit and what its process holds (the
    // allocation plus the context charge), matched to the process; the other has none.
    let region = k8s["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"].as_str().unwrap().ends_with("ctr.cache"))
        .expect("the limiter's region belongs to the pod's container");
    assert_eq!(region["format"], "vgpu");
    assert_eq!(region["devices"][0]["memory_limit"], 1u64 << 30);
    let limited = process_of(&snap, pids[1]).unwrap();
    let held = limited["limiter"]["held"][0].as_u64().unwrap();
    let context = limited["limiter"]["context_bytes"][0].as_u64().unwrap();
    assert_eq!(held, want[1] + context, "{limited}");
    assert_eq!(region["devices"][0]["reserved"], held);
    assert_eq!(limited["memory"]["limiter"], held);
    let limiter_alloc = limited["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == "cuMemAlloc_v2" && a["source"] == "limiter");
    assert_eq!(
        limiter_alloc.map(|a| a["calls"].as_u64()),
        Some(Some(1)),
        "{limited}"
    );
    assert!(
        process_of(&snap, pids[0]).unwrap()["limiter"].is_null(),
        "the docker container runs without the limiter"
    );

    // eBPF data per process: the hold's cuInit and cuMemAlloc_v2, exactly once each.
    for pid in &pids {
        let p = process_of(&snap, *pid).unwrap();
        assert_eq!(p["alive"], true);
        let alloc = p["apis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["api"] == "cuMemAlloc_v2")
            .unwrap();
        assert_eq!(
            (alloc["calls"].as_u64(), alloc["source"].as_str()),
            (Some(1), Some("probes"))
        );
        assert_eq!(
            p["memory"]["probes_complete"], false,
            "the processes started before the library was attached"
        );
    }

    // The corrupt region is shown with its problem, not hidden.
    let bad = containers
        .iter()
        .flat_map(|c| c["regions"].as_array().unwrap())
        .find(|r| r["path"].as_str().unwrap().ends_with("corrupt.cache"))
        .expect("the corrupt region is in the model");
    assert!(!bad["problems"].as_array().unwrap().is_empty(), "{bad}");
    assert_eq!(snap["agent"]["region_errors"], 1);

    // NVML disabled: said so, nothing invented.
    assert!(snap["gpus"].as_array().unwrap().is_empty());
    assert!(
        snap["agent"]["nvml_problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "NVML disabled")
    );

    // `stat` reads the daemon's model instead of loading probes of its own.
    let out = Command::new(agent_bin())
        .args(["stat", "--json", "--duration", "500ms", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["source"], "daemon");
    let held = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pids[1])
        .expect("held memory is reported");
    assert_eq!(held["live_bytes"], want[1]);

    // A second daemon on the same socket refuses to start.
    let second = Command::new(agent_bin())
        .args(["run", "--no-calibrate", "--no-nvml", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("already serves"));

    for (w, _) in holders {
        let mut child = w.child;
        drop(child.stdin.take());
        let _ = child.wait();
    }
    assert!(daemon.stop().success());
    assert!(!socket.exists(), "the socket is removed on exit");
}
