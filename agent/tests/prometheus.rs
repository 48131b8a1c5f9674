//! `/metrics` scraped by a real Prometheus (Debian's package, installed by `cargo xtask setup`)
//! while a simulated-driver workload runs in a container-shaped cgroup; the series and values
//! are read back through Prometheus' HTTP API, and `promtool check metrics` judges the
//! exposition. Root, like the other daemon tests.

mod support;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET on 127.0.0.1; (status, body).
fn http_get(port: u16, target: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Kills and reaps a child on drop (every process the test starts).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Prometheus {
    _child: Reaped,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target_port: u16) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: vgpu-agent\n    scrape_interval: 1s\n    \
                 scrape_timeout: 900ms\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("prometheus starts (cargo xtask setup installs it)");
        let p = Prometheus {
            _child: Reaped(child),
            port,
        };
        wait_until(
            Duration::from_secs(60),
            || http_get(port, "/-/ready").is_ok_and(|(s, _)| s == 200),
            "Prometheus to be ready",
        );
        p
    }

    /// An instant query; the result vector.
    fn query(&self, q: &str) -> Vec<Value> {
        let (status, body) =
            http_get(self.port, &format!("/api/v1/query?query={}", urlencode(q))).unwrap();
        assert_eq!(status, 200, "{q}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"].as_array().unwrap().clone()
    }

    /// The single value of a query that returns one series, once it does.
    fn value_when(&self, q: &str, want: impl Fn(f64) -> bool, timeout: Duration) -> f64 {
        let deadline = Instant::now() + timeout;
        let mut last = vec![];
        while Instant::now() < deadline {
            last = self.query(q);
            if let [one] = last.as_slice() {
                let v: f64 = one["value"][1].as_str().unwrap().parse().unwrap();
                if want(v) {
                    return v;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("{q}: no wanted value within {timeout:?}; last result {last:?}");
    }
}

#[test]
fn prometheus_scrapes_the_agent_and_sees_the_workloads_calls() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    assert!(
        Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists(),
        "Debian's prometheus package is missing: run `cargo xtask setup`"
    );
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let id = format!("{:016x}", std::process::id() as u64 * 0x9e37_79b9 + 0xfeed).repeat(4);
    let cg = TestCgroup::new(&format!("vgpu-prom-{}/docker/{id}", std::process::id()));

    let metrics_port = free_port();
    let socket = dir.path().join("agent.sock");
    let agent = Reaped(
        Command::new(agent_bin())
            .args(["run", "--interval", "200ms", "--no-calibrate", "--no-nvml"])
            .arg("--socket")
            .arg(&socket)
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    wait_until(
        Duration::from_secs(30),
        || http_get(metrics_port, "/metrics").is_ok_and(|(s, _)| s == 200),
        "the agent's /metrics",
    );
    let prom = Prometheus::start(dir.path(), metrics_port);
    prom.value_when(
        &format!("up{{instance=\"127.0.0.1:{metrics_port}\"}}"),
        |v| v == 1.0,
        Duration::from_secs(30),
    );

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
        "the agent to attach to the simulated driver",
    );
    w.go();
    let made = w.finish();

    // The container's label: the runtime and short id the agent derives from the cgroup path.
    let container = format!("docker {}", &id[..12]);
    let sel = |api: &str| format!("container=\"{container}\",api=\"{api}\"");
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
        &format!("sum(vgpu_sync_seconds_total{{container=\"{container}\"}})"),
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
    // Agent health is there.
    prom.value_when(
        "vgpu_agent_probes_up",
        |v| v == 1.0,
        Duration::from_secs(10),
    );
    assert!(!prom.query("vgpu_agent_probes_attached > 0").is_empty());

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
    drop(agent);
}
