//! `/metrics` scraped by a real Prometheus (Debian's package, installed by `cargo xtask setup`)
//! while a simulated-driver workload runs in a container-shaped cgroup; the series and values
//! are read back through Prometheus' HTTP API, and `promtool check metrics` judges the
//! exposition. Two agents watch the same workload: one at the default (series per API kind), one
//! with `--metrics-per-api`. Root, like the other daemon tests.

mod support;

use std::{
    io::{Read, Write},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::{prometheus::*, *};

#[test]
fn prometheus_scrapes_the_agent_and_sees_the_workloads_calls() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let id = format!("{:016x}", std::process::id() as u64 * 0x9e37_79b9 + 0xfeed).repeat(4);
    let cg = TestCgroup::new(&format!("vgpu-prom-{}/docker/{id}", std::process::id()));

    // Two agents: the default (per kind) and --metrics-per-api.
    let start = |name: &str, extra: &[&str]| {
        let port = free_port();
        let agent = Reaped(
            Command::new(agent_bin())
                .args(["run", "--interval", "200ms", "--no-calibrate", "--no-nvml"])
                .arg("--socket")
                .arg(dir.path().join(format!("{name}.sock")))
                .arg(format!("--metrics-listen=127.0.0.1:{port}"))
                .args(extra)
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        wait_until(
            Duration::from_secs(30),
            || http_get(port, "/metrics").is_ok_and(|(s, _)| s == 200),
            "the agent's /metrics",
        );
        (agent, port)
    };
    let (_kinds_agent, kinds_port) = start("kinds", &[]);
    let (_agent, metrics_port) = start("apis", &["--metrics-per-api"]);
    let prom = Prometheus::start(dir.path(), &[kinds_port, metrics_port]);
    for port in [kinds_port, metrics_port] {
        prom.value_when(
            &format!("up{{instance=\"127.0.0.1:{port}\"}}"),
            |v| v == 1.0,
            Duration::from_secs(30),
        );
    }

    let wdir = dir.path().join("w");
    std::fs::create_dir_all(&wdir).unwrap();
    let mut cmd = exercise(&lib);
    cmd.args([
        "counts",
        "--per-api",
        "4",
        "--init",
        "--apis",
        "cuMemAlloc_v2,cuMemFree_v2,cuCtxSynchronize,cuMemcpyHtoD_v2",
    ])
    .env("SIMCUDA_DELAY_US", "cuCtxSynchronize=3000");
    let w = Workload::start(cmd, &wdir);
    std::fs::write(cg.0.join("cgroup.procs"), w.pid().to_string()).unwrap();
    let lib_path = lib.display().to_string();
    for socket in ["kinds.sock", "apis.sock"].map(|s| dir.path().join(s)) {
        wait_until(
            Duration::from_secs(20),
            || {
                let mut body = String::new();
                std::os::unix::net::UnixStream::connect(&socket)
                    .and_then(|mut s| s.read_to_string(&mut body))
                    .is_ok()
                    && serde_json::from_str::<Value>(&body).is_ok_and(|snap| {
                        snap["agent"]["libraries"]
                            .as_array()
                            .is_some_and(|l| l.iter().any(|l| l["path"] == lib_path.as_str()))
                    })
            },
            "the agents to attach to the simulated driver",
        );
    }
    // The probes' attachment is exported while the workload holds its library (it is detached
    // a few polls after its last user exits).
    for port in [kinds_port, metrics_port] {
        prom.value_when(
            &format!("vgpu_agent_probes_attached{{instance=\"127.0.0.1:{port}\"}}"),
            |v| v > 0.0,
            Duration::from_secs(20),
        );
    }
    w.go();
    let made = w.finish();

    // The container's label: the runtime and short id the agent derives from the cgroup path.
    let container = format!("docker {}", &id[..12]);
    let apis = format!("instance=\"127.0.0.1:{metrics_port}\",container=\"{container}\"");
    let sel = |api: &str| format!("{apis},api=\"{api}\"");
    for api in [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuCtxSynchronize",
        "cuMemcpyHtoD_v2",
    ] {
        let want = &made["calls"][api];
        let calls = want["calls"].as_u64().unwrap() as f64;
        let errors = want["errors"].as_u64().unwrap() as f64;
        assert_eq!(calls, 4.0);
        let q = format!("sum(vgpu_api_calls_total{{{}}})", sel(api));
        prom.value_when(&q, |v| v == calls, Duration::from_secs(30));
        let q = format!("sum(vgpu_api_errors_total{{{}}})", sel(api));
        prom.value_when(&q, |v| v == errors, Duration::from_secs(10));
        let q = format!("sum(vgpu_api_latency_seconds_count{{{}}})", sel(api));
        prom.value_when(&q, |v| v == calls, Duration::from_secs(10));
    }
    let bytes = made["calls"]["cuMemAlloc_v2"]["bytes"].as_u64().unwrap() as f64;
    prom.value_when(
        &format!("sum(vgpu_api_bytes_total{{{}}})", sel("cuMemAlloc_v2")),
        |v| v == bytes,
        Duration::from_secs(10),
    );
    // The injected 3 ms per synchronisation: a call is never measured faster, so none counts
    // under le = 2^20 ns (1.05 ms); on an idle machine all four count under le = 2^22 ns
    // (4.19 ms; the bounds go by factors of 4), but steal time on a loaded VM moves some up, so
    // only the bound that cannot move is asserted, and that every call is counted.
    let buckets = prom.query(&format!(
        "vgpu_api_latency_seconds_bucket{{{}}}",
        sel("cuCtxSynchronize")
    ));
    let at = |le: &str| -> f64 {
        let b = buckets
            .iter()
            .find(|b| b["metric"]["le"].as_str() == Some(le))
            .unwrap_or_else(|| panic!("no bucket le={le} in {buckets:?}"));
        b["value"][1].as_str().unwrap().parse().unwrap()
    };
    let bound = |k: u32| format!("{}", (1u64 << k) as f64 / 1e9);
    assert_eq!(buckets.len(), 14, "13 bounds and +Inf: {buckets:?}");
    assert_eq!((at(&bound(20)), at("+Inf")), (0.0, 4.0), "{buckets:?}");
    let mut last = 0.0;
    for k in (10..=34).step_by(2) {
        let n = at(&bound(k));
        assert!(n >= last, "cumulative buckets: {buckets:?}");
        last = n;
    }
    let sync = prom.value_when(
        &format!("sum(vgpu_sync_seconds_total{{{apis}}})"),
        |v| v > 0.0,
        Duration::from_secs(10),
    );
    assert!((0.012..0.1).contains(&sync), "sync seconds {sync}");
    let q = format!(
        "histogram_quantile(0.5, sum by (le) (vgpu_api_latency_seconds_bucket{{{}}}))",
        sel("cuCtxSynchronize")
    );
    let p50 = prom.value_when(&q, |v| v > 0.0, Duration::from_secs(10));
    // Between the delay's bucket's lower bound and the next bucket's upper bound (steal time).
    assert!((0.002..=0.0168).contains(&p50), "p50 {p50}");
    // The default agent: the same calls per kind, no api label, no per-container histogram.
    let kinds = format!("instance=\"127.0.0.1:{kinds_port}\",container=\"{container}\"");
    for (kind, want) in [("alloc", 4.0), ("free", 4.0), ("sync", 4.0), ("copy", 4.0)] {
        let q = format!("sum(vgpu_api_calls_total{{{kinds},kind=\"{kind}\"}})");
        prom.value_when(&q, |v| v == want, Duration::from_secs(30));
    }
    assert!(
        prom.query(&format!("vgpu_api_calls_total{{{kinds},api!=\"\"}}"))
            .is_empty(),
        "no api label by default"
    );
    assert!(
        prom.query(&format!("vgpu_api_latency_seconds_count{{{kinds}}}"))
            .is_empty()
    );
    let node_sync = format!(
        "vgpu_node_api_latency_seconds_count{{instance=\"127.0.0.1:{kinds_port}\",kind=\"sync\"}}"
    );
    prom.value_when(&node_sync, |v| v >= 4.0, Duration::from_secs(10));
    let time = prom.value_when(
        &format!("sum(vgpu_api_time_seconds_total{{{kinds},kind=\"sync\"}})"),
        |v| v > 0.0,
        Duration::from_secs(10),
    );
    assert!((0.012..0.1).contains(&time), "sync seconds {time}");
    let age = prom.value_when(
        &format!("vgpu_agent_snapshot_age_seconds{{instance=\"127.0.0.1:{kinds_port}\"}}"),
        |v| v >= 0.0,
        Duration::from_secs(10),
    );
    assert!(age < 5.0, "a running agent's snapshot is fresh: {age} s");

    // Agent health is there.
    prom.value_when(
        &format!("vgpu_agent_probes_up{{instance=\"127.0.0.1:{metrics_port}\"}}"),
        |v| v == 1.0,
        Duration::from_secs(10),
    );

    // promtool accepts the exposition.
    let (_, text) = http_get(metrics_port, "/metrics").unwrap();
    let mut promtool = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(prom);
}
