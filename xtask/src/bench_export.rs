//! `cargo xtask bench export`: what exporting costs.
//!
//! 1. The daemon's CPU (share of one core) under the agent benchmark's paced load of probed calls,
//!    with exporting off (`--metrics-listen off`, no OTLP) and on at the default settings
//!    (`/metrics` scraped every second by this benchmark, OTLP/HTTP spans with the default
//!    sampling to a local sink that answers every export), interleaved off/on/off/on.
//! 2. The scrape of a synthetic model of 100 containers x 40 APIs over every API kind, at the
//!    default (series per kind) and with `--metrics-per-api`: body size, fold + encode per
//!    refresh, and the HTTP scrape (gzip and plain), p50/p99 (the `scrape_benchmark` test in
//!    release mode, agent/src/export/scrape_bench.rs). The default's target: under 1 MB and a
//!    scrape under 50 ms at p99.
//!
//! Needs root (real eBPF). Prints a table and a JSON line (`bench-export: {...}`).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use crate::{
    bench_agent::{Guard, measure},
    util::{self, cmd, repo_root},
};

const LOAD_RATE: u64 = 50_000;
const ROUNDS: usize = 2;
const WINDOW: Duration = Duration::from_secs(10);

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// An OTLP/HTTP sink: reads each request and answers 200 with an empty protobuf body (an empty
/// `ExportTraceServiceResponse`). Counts requests.
fn sink(requests: Arc<AtomicU64>) -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let requests = Arc::clone(&requests);
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    let Ok(n) = c.read(&mut chunk) else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() < i + 4 + len {
                        continue;
                    }
                    buf.drain(..i + 4 + len);
                    requests.fetch_add(1, Relaxed);
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
                    );
                }
            });
        }
    });
    Ok(port)
}

fn scrape(port: u16) -> Result<usize> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n"
    )?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    Ok(body.len())
}

/// One measurement: a daemon (exporting or not) under the paced load; its CPU share of a core.
fn one(bin: &Path, lib: &Path, work: &Path, exporting: bool, sink_port: u16) -> Result<f64> {
    let socket = work.join(format!("agent-{exporting}.sock"));
    let metrics_port = free_port()?;
    let mut c = Command::new(bin.join("vgpu-agent"));
    c.args(["run", "--interval", "1s", "--no-nvml", "--socket"])
        .arg(&socket)
        .arg("--libcuda")
        .arg(lib)
        .env("VGPU_LOG", "warn");
    if exporting {
        c.arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .args(["--otlp-protocol", "http", "--otlp-endpoint"])
            .arg(format!("http://127.0.0.1:{sink_port}"));
    } else {
        c.args(["--metrics-listen", "off"]);
    }
    let daemon = Guard(c.spawn()?);
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        ensure!(
            t.elapsed() < Duration::from_secs(30),
            "the daemon did not start"
        );
        sleep(Duration::from_millis(50));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = exporting.then(|| {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let _ = scrape(metrics_port);
                sleep(Duration::from_secs(1));
            }
        })
    });
    let load = Guard(
        Command::new(bin.join("cuda-exercise"))
            .arg("--lib")
            .arg(lib)
            .args(["steady", "--api", "cuStreamSynchronize", "--rate"])
            .arg(LOAD_RATE.to_string())
            .args(["--seconds", "16"])
            .stdout(Stdio::null())
            .spawn()?,
    );
    sleep(Duration::from_secs(3));
    let (cpu, _) = measure(daemon.0.id(), WINDOW)?;
    drop(load);
    stop.store(true, Relaxed);
    if let Some(s) = scraper {
        let _ = s.join();
    }
    drop(daemon);
    Ok(cpu)
}

pub fn run() -> Result<()> {
    if !util::is_root() {
        bail!(
            "the export benchmark loads eBPF probes: run it as root (sudo cargo xtask bench export)"
        );
    }
    crate::setup::run()?;
    util::run(&mut cmd(
        "cargo",
        [
            "build",
            "--release",
            "-p",
            "vgpu-agent",
            "-p",
            "cuda-exercise",
            "-p",
            "sim-cuda",
        ],
    ))?;
    let bin = repo_root().join("target/release");
    let work = std::env::temp_dir().join(format!("vgpu-bench-export-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let lib = work.join("libcuda.so.1");
    std::fs::copy(bin.join("libsimcuda.so"), &lib)?;
    let requests = Arc::new(AtomicU64::new(0));
    let sink_port = sink(Arc::clone(&requests))?;

    let (mut off, mut on) = (vec![], vec![]);
    for round in 0..ROUNDS {
        for exporting in [false, true] {
            util::step(&format!(
                "export: round {} of {ROUNDS}, exporting {}",
                round + 1,
                if exporting { "on" } else { "off" }
            ));
            let cpu = one(&bin, &lib, &work, exporting, sink_port)?;
            if exporting {
                on.push(cpu)
            } else {
                off.push(cpu)
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (off_m, on_m) = (mean(&off), mean(&on));
    println!("\nconfiguration         CPU (share of one core, mean of {ROUNDS})");
    println!("exporting off         {:.2}%  {:?}", off_m * 100.0, off);
    println!("exporting on          {:.2}%  {:?}", on_m * 100.0, on);
    println!(
        "difference            {:+.2}% of one core",
        (on_m - off_m) * 100.0
    );

    util::step("export: scrape of 100 containers x 40 APIs, per kind and per API");
    let out = util::output(&mut cmd(
        "cargo",
        [
            "test",
            "--release",
            "-p",
            "vgpu-agent",
            "--bin",
            "vgpu-agent",
            "scrape_benchmark",
            "--",
            "--ignored",
            "--nocapture",
        ],
    ))
    .unwrap_or_default();
    let scrape_line = out
        .lines()
        .find_map(|l| l.strip_prefix("scrape-bench: "))
        .map(str::to_owned)
        .unwrap_or_default();
    let scrape: serde_json::Value = serde_json::from_str(&scrape_line).unwrap_or_default();
    for mode in ["per_kind", "per_api"] {
        let m = &scrape[mode];
        println!(
            "scrape {mode:9} {:>9} bytes ({:>8} gzip), {:>6} series; encode p50/p99 {} ms; \
             scrape gzip {} ms, plain {} ms",
            m["bytes"],
            m["gzip_bytes"],
            m["series"],
            m["encode_p50_p99_ms"],
            m["scrape_gzip_p50_p99_ms"],
            m["scrape_plain_p50_p99_ms"]
        );
    }
    ensure!(
        scrape["per_kind"]["under_1mb_and_50ms"] == true,
        "the default scrape misses its target (under 1 MB, p99 under 50 ms): {scrape_line}"
    );
    println!(
        "bench-export: {}",
        json!({
            "load_calls_per_s": LOAD_RATE,
            "cpu_off": off, "cpu_on": on,
            "cpu_difference_share_of_core": on_m - off_m,
            "otlp_requests": requests.load(Relaxed),
            "scrape": scrape,
        })
    );
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
