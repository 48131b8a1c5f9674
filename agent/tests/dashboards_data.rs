//! Every panel of dashboards/*.json has data when a real Prometheus scrapes real agents watching
//! simulated-driver workloads under the limiter and real NCCL calls: one agent at the default
//! (series per API kind), one with `--metrics-per-api` (root).

#[allow(dead_code)]
#[path = "../src/export/defs.rs"]
mod defs;
mod support;

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{dashboards::*, prometheus::*, *};

/// The rate window that stands for Grafana's `$__rate_interval` (Prometheus scrapes every second).
const RATE_INTERVAL: &str = "10s";

/// A panel's target expressions with the dashboard variables of one agent filled in: its
/// instance, every namespace, pod, container and kind.
fn expand(expr: &str, instance: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$instance", instance)
        .replace("$namespace", ".*")
        .replace("$pod", ".*")
        .replace("$container", ".*")
        .replace("$kind", ".*")
}

/// Whether every metric a panel names comes from NVML (GPU devices: none without a GPU).
fn nvml_only(p: &Value) -> bool {
    p["targets"].as_array().unwrap().iter().all(|t| {
        parse(t["expr"].as_str().unwrap()).0.iter().all(|s| {
            defs::ALL
                .iter()
                .find(|d| d.series_names().contains(&s.metric))
                .is_some_and(|d| d.source.starts_with("gpus[]"))
        })
    })
}

/// An agent run as a daemon with its own socket and /metrics port.
fn agent(dir: &Path, name: &str, regions: &Path, extra: &[&str]) -> (Reaped, u16) {
    let port = free_port();
    let child = Command::new(agent_bin())
        .args(["run", "--interval", "200ms", "--no-nvml", "--region-dir"])
        .arg(regions)
        .arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .arg(format!("--metrics-listen=127.0.0.1:{port}"))
        .args(extra)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let agent = Reaped(child);
    wait_until(
        Duration::from_secs(60),
        || http_get(port, "/metrics").is_ok_and(|(s, _)| s == 200),
        "the agent's /metrics",
    );
    (agent, port)
}

/// Waits until the agent serving `socket` has attached to every library in `libs`.
fn wait_attached(socket: &Path, libs: &[&Path]) {
    wait_until(
        Duration::from_secs(30),
        || {
            let mut body = String::new();
            std::os::unix::net::UnixStream::connect(socket)
                .and_then(|mut s| s.read_to_string(&mut body))
                .is_ok()
                && serde_json::from_str::<Value>(&body).is_ok_and(|snap| {
                    libs.iter().all(|lib| {
                        snap["agent"]["libraries"].as_array().is_some_and(|l| {
                            l.iter()
                                .any(|l| l["path"] == lib.to_string_lossy().as_ref())
                        })
                    })
                })
        },
        "the agents to attach to the workloads' libraries",
    );
}

/// Workloads killed when the test ends, however it ends (the limited ones would run a minute).
struct Killed(Vec<Workload>);

impl Drop for Killed {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

#[test]
fn every_panel_has_data_from_prometheus_scraping_real_agents() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let Some(nccl) = std::env::var_os("VGPU_TEST_LIBNCCL")
        .map(PathBuf::from)
        .filter(|p| p.exists())
    else {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none(),
            "VGPU_TEST_LIBNCCL must point at libnccl.so.2 (cargo xtask setup unpacks it)"
        );
        eprintln!("skipping: VGPU_TEST_LIBNCCL is not set (the NCCL panels need it)");
        return;
    };
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    // A copy of its own (its own inode), as for the simulated driver: other tests' agents probe
    // the shared file at the same time.
    let shared_nccl = nccl;
    let nccl = dir.path().join("nccl/libnccl.so.2");
    std::fs::create_dir_all(nccl.parent().unwrap()).unwrap();
    std::fs::copy(&shared_nccl, &nccl).unwrap();
    let regions = dir.path().join("regions");
    std::fs::create_dir_all(&regions).unwrap();
    let id = format!("{:016x}", std::process::id() as u64 * 0x9e37_79b9 + 0xda5b).repeat(4);
    let cg = TestCgroup::new(&format!("vgpu-dash-{}/docker/{id}", std::process::id()));

    // Two agents (probe cost measured at start): the default and --metrics-per-api.
    let (_kinds, kinds_port) = agent(dir.path(), "kinds", &regions, &[]);
    let (_apis, apis_port) = agent(dir.path(), "apis", &regions, &["--metrics-per-api"]);
    let prom = Prometheus::start(dir.path(), &[kinds_port, apis_port]);

    // One container: two processes under the limiter (a 512 MiB limit kept hit: allocations,
    // denials, memory held; launches at a 50% SM share: throttling), one without (every traced
    // API through the probes: copies, lifecycle) and NCCL calls through the real libnccl.
    let limited = |args: &[&str]| {
        let mut c = exercise(&lib);
        c.args(args)
            .env("LD_PRELOAD", limiter_lib())
            .env("VGPU_REAL_LIBCUDA", &lib)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", regions.join("ctr.cache"))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "512m")
            .env("CUDA_DEVICE_SM_LIMIT", "50")
            .env("VGPU_CONTEXT_BYTES", "0")
            .env("SIMCUDA_LAUNCH_US", "500");
        c
    };
    let mut counts = exercise(&lib);
    counts.args(["counts", "--per-api", "2", "--init"]);
    let mut nccl_calls = exercise(&nccl);
    nccl_calls.args(["nccl", "--per-api", "3"]);
    let start = |i: usize, cmd: Command| {
        let wdir = dir.path().join(format!("w{i}"));
        std::fs::create_dir_all(&wdir).unwrap();
        let w = Workload::start(cmd, &wdir);
        cg.add(w.pid());
        w
    };
    // The probes attach to the libraries the first workloads loaded; the limited processes start
    // after that, so the probes see their whole life and compare their memory with the limiter's
    // (the drift panels' series).
    let mut workloads = Killed(vec![start(0, counts), start(1, nccl_calls)]);
    for name in ["kinds", "apis"] {
        wait_attached(&dir.path().join(format!("{name}.sock")), &[&lib, &nccl]);
    }
    workloads.0.push(start(
        2,
        limited(&[
            "pressure",
            "--chunk",
            "64m",
            "--delay-ms",
            "100",
            "--seconds",
            "60",
        ]),
    ));
    workloads.0.push(start(
        3,
        limited(&["paced", "--seconds", "60", "--sync-every", "16"]),
    ));
    for w in &workloads.0 {
        w.go();
    }

    // Until every agent shows denials, throttling and NCCL bytes, and rates have two samples.
    let started = Instant::now();
    for port in [kinds_port, apis_port] {
        let i = format!("instance=\"127.0.0.1:{port}\"");
        for q in [
            format!("sum(vgpu_container_allocations_denied_total{{{i}}})"),
            format!("sum(vgpu_throttled_seconds_total{{{i}}})"),
            format!("sum(vgpu_api_bytes_total{{{i},kind=\"nccl\"}})"),
            format!("sum(vgpu_api_hook_seconds_total{{{i}}})"),
        ] {
            prom.value_when(&q, |v| v > 0.0, Duration::from_secs(45));
        }
        // Measured at start (a loaded machine can measure 0: still a value).
        let q = format!("max(vgpu_agent_probe_cost_seconds{{{i}}})");
        prom.value_when(&q, |v| v >= 0.0, Duration::from_secs(45));
    }
    std::thread::sleep(Duration::from_secs(3));

    let mut missing = vec![];
    let mut checked = 0;
    for (port, per_api) in [(kinds_port, false), (apis_port, true)] {
        let instance = format!("127.0.0.1:{port}");
        for (path, d) in dashboards() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            for p in panels(&d).into_iter().filter(|p| p["type"] != "row") {
                let title = p["title"].as_str().unwrap();
                let results: Vec<Vec<Value>> = p["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| prom.query(&expand(t["expr"].as_str().unwrap(), &instance)))
                    .collect();
                checked += 1;
                if results.iter().all(Vec::is_empty) {
                    if !nvml_only(p) {
                        missing.push(format!("{name}: {title} (per_api {per_api})"));
                    }
                    continue;
                }
                // Panels by (kind, api) show APIs exactly when the agent exports them.
                let by_api = p["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t["expr"].as_str().unwrap().contains("by (kind, api)"));
                if by_api {
                    let with_api = results
                        .iter()
                        .flatten()
                        .any(|r| r["metric"]["api"].as_str().is_some_and(|a| !a.is_empty()));
                    assert_eq!(with_api, per_api, "{name}: {title}: {results:?}");
                }
            }
            // The node, container and kind variables have values.
            for v in d["templating"]["list"].as_array().unwrap() {
                let var = v["name"].as_str().unwrap();
                if !["instance", "container", "kind"].contains(&var) {
                    continue;
                }
                let q = v["query"]["query"].as_str().unwrap();
                let (sel, label) = q
                    .strip_prefix("label_values(")
                    .and_then(|q| q.strip_suffix(')'))
                    .and_then(|q| q.rsplit_once(','))
                    .unwrap();
                let q = format!("group by ({}) ({})", label.trim(), expand(sel, &instance));
                assert!(!prom.query(&q).is_empty(), "{name}: variable {var}: {q}");
            }
        }
    }
    assert!(
        missing.is_empty(),
        "panels without data after {:?}: {missing:#?}",
        started.elapsed()
    );
    assert!(checked >= 80, "only {checked} panels checked (two agents)");
    drop(workloads);
    drop(cg);
}
