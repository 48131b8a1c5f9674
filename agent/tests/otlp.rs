//! OTLP spans of sampled calls, received by a receiver built on the official OTLP protocol
//! definitions (`opentelemetry-proto`): a tonic TraceService for gRPC, and protobuf
//! `ExportTraceServiceRequest` bodies decoded with prost for HTTP. A simulated-driver workload in
//! a docker-shaped cgroup makes synchronisation calls slowed to 2 ms by `SIMCUDA_DELAY_US`: they
//! pass the 1 ms slow threshold and become spans (those on the stream it created name it);
//! fast calls (sampling off) do not. Rate-sampled calls keep to their container's rate. Root.

mod support;

use std::{
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value},
};
use prost::Message;
use serde_json::Value;
use support::*;

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

struct Grpc(Received);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A gRPC OTLP receiver on a free port, on a runtime of its own (dropped with the test).
fn grpc_receiver(received: Received) -> (u16, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Grpc(received)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (port, rt)
}

/// An OTLP/HTTP receiver: POST /v1/traces with a protobuf body.
fn http_receiver(received: Received) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            // Head, then Content-Length bytes of body.
            let (head_end, len) = loop {
                let n = conn.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break (None, 0);
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                    if head.starts_with("post /v1/metrics ") {
                        // The containers' GPU time, exported beside the spans: not this test's.
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        break (None, 0);
                    }
                    assert!(head.starts_with("post /v1/traces "), "{head}");
                    assert!(
                        head.contains("content-type: application/x-protobuf"),
                        "{head}"
                    );
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse::<usize>().unwrap())
                        .expect("a Content-Length");
                    break (Some(i + 4), len);
                }
            };
            let Some(start) = head_end else { continue };
            while buf.len() < start + len {
                let n = conn.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let req = ExportTraceServiceRequest::decode(&buf[start..start + len])
                .expect("an OTLP ExportTraceServiceRequest");
            received.lock().unwrap().push(req);
            let body = ExportTraceServiceResponse {
                partial_success: None,
            }
            .encode_to_vec();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(&body);
        }
    });
    port
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn int(attrs: &[KeyValue], key: &str) -> i64 {
    match attr(attrs, key) {
        Some(any_value::Value::IntValue(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn string(attrs: &[KeyValue], key: &str) -> String {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(v)) => v.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn snapshot(socket: &Path) -> Option<Value> {
    let mut body = String::new();
    std::os::unix::net::UnixStream::connect(socket)
        .and_then(|mut s| s.read_to_string(&mut body))
        .ok()?;
    serde_json::from_str(&body).ok()
}

const DELAY_US: u64 = 2000;

/// Runs the workload beside an agent exporting to `endpoint`; checks what `received` got.
fn spans_arrive(protocol: &str, endpoint: &str, received: &Received) {
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let id = format!(
        "{:016x}",
        u64::from(std::process::id()) * 0x2545_f491 + 0xabc
    )
    .repeat(4);
    let cg = TestCgroup::new(&format!("vgpu-otlp-{}/docker/{id}", std::process::id()));
    let socket = dir.path().join("agent.sock");
    let _agent = Agent(
        Command::new(agent_bin())
            .args(["run", "--interval", "200ms", "--no-calibrate", "--no-nvml"])
            .args(["--metrics-listen", "off", "--trace-slow", "1ms"])
            .args(["--trace-sample-rate", "0", "--otlp-protocol", protocol])
            .args(["--otlp-endpoint", endpoint])
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    wait_until(
        Duration::from_secs(30),
        || snapshot(&socket).is_some(),
        "the agent's socket",
    );
    let wdir = dir.path().join("w");
    std::fs::create_dir_all(&wdir).unwrap();
    let mut cmd = exercise(&lib);
    cmd.args(["counts", "--per-api", "3", "--init", "--stream", "--apis"])
        .arg("cuCtxSynchronize,cuMemAlloc_v2,cuStreamSynchronize")
        .env(
            "SIMCUDA_DELAY_US",
            format!("cuCtxSynchronize={DELAY_US},cuStreamSynchronize={DELAY_US}"),
        );
    let w = Workload::start(cmd, &wdir);
    std::fs::write(cg.0.join("cgroup.procs"), w.pid().to_string()).unwrap();
    let pid = w.pid();
    let lib_path = lib.display().to_string();
    // Attached, and the process is in the model (its container resolves the span resource).
    wait_until(
        Duration::from_secs(20),
        || {
            snapshot(&socket).is_some_and(|s| {
                s["agent"]["libraries"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|l| l["path"] == lib_path.as_str()))
                    && s["processes"].as_array().is_some_and(|p| {
                        p.iter()
                            .any(|p| p["key"]["pid"] == pid && p["container"] == id.as_str())
                    })
            })
        },
        "the agent to attach and see the workload in its container",
    );
    let t0 = SystemTime::now();
    w.go();
    let made = w.finish();
    let t1 = SystemTime::now();
    assert_eq!(made["calls"]["cuCtxSynchronize"]["calls"], 3);

    let spans_of = |name: &str| {
        let mut out = vec![];
        for req in received.lock().unwrap().iter() {
            for rs in &req.resource_spans {
                let res = rs.resource.clone().unwrap_or_default().attributes;
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        if s.name == name && int(&s.attributes, "process.pid") == i64::from(pid) {
                            out.push((res.clone(), s.clone()));
                        }
                    }
                }
            }
        }
        out
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while (spans_of("cuCtxSynchronize").len() < 3 || spans_of("cuStreamSynchronize").len() < 3)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let spans = spans_of("cuCtxSynchronize");
    assert_eq!(
        spans.len(),
        3,
        "{protocol}: three slow synchronisations became spans"
    );
    assert!(
        spans_of("cuMemAlloc_v2").is_empty(),
        "fast calls are not sampled with --trace-sample-rate 0"
    );
    // The stream the workload created and synchronised: each span names it; an API without a
    // stream argument has no stream attribute.
    let stream = made["stream"].as_u64().expect("the workload's stream");
    assert_ne!(stream, 0);
    let on_stream = spans_of("cuStreamSynchronize");
    assert_eq!(
        on_stream.len(),
        3,
        "{protocol}: three stream synchronisations"
    );
    for (_, s) in &on_stream {
        assert_eq!(string(&s.attributes, "cuda.stream"), format!("{stream:#x}"));
    }
    for (_, s) in &spans {
        assert!(attr(&s.attributes, "cuda.stream").is_none(), "{s:?}");
    }
    let ns = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let slack = 50_000_000; // 50 ms for the clock offset and scheduling
    for (res, s) in &spans {
        assert_eq!(string(&s.attributes, "gpu.api"), "cuCtxSynchronize");
        assert_eq!(string(&s.attributes, "gpu.api.kind"), "sync");
        assert_eq!(int(&s.attributes, "gpu.result"), 0);
        assert_eq!(int(&s.attributes, "gpu.bytes"), 0);
        assert_eq!(string(&s.attributes, "gpu.sampled_by"), "slow");
        assert_eq!(string(&s.attributes, "thread.name"), "cuda-exercise");
        assert_eq!(string(res, "container.id"), id);
        assert_eq!(string(res, "container.runtime"), "docker");
        assert_eq!(string(res, "service.name"), "vgpu-agent");
        assert!(!string(res, "host.name").is_empty());
        assert!(
            s.start_time_unix_nano + slack >= ns(t0) && s.end_time_unix_nano <= ns(t1) + slack,
            "{protocol}: span {}..{} outside the run {}..{}",
            s.start_time_unix_nano,
            s.end_time_unix_nano,
            ns(t0),
            ns(t1)
        );
        let d = s.end_time_unix_nano - s.start_time_unix_nano;
        // At least the delay; the rest is the host's scheduling (the same slack as above).
        assert!(
            (DELAY_US * 1000..DELAY_US * 1000 + slack).contains(&d),
            "{protocol}: span of {d} ns for a {DELAY_US} us delay"
        );
    }
}

#[test]
fn slow_calls_become_spans_over_grpc_and_http() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let grpc: Received = Arc::default();
    let (port, _rt) = grpc_receiver(Arc::clone(&grpc));
    spans_arrive("grpc", &format!("http://127.0.0.1:{port}"), &grpc);

    let http: Received = Arc::default();
    let port = http_receiver(Arc::clone(&http));
    spans_arrive("http", &format!("http://127.0.0.1:{port}"), &http);
}

/// `/metrics` (text format) from the agent on `port`.
fn scrape(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp
}

fn counter(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn rate_sampled_spans_keep_to_their_containers_rate_and_the_rest_are_counted() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    const RATE: u64 = 5;
    const CALLS: u64 = 400;
    let received: Received = Arc::default();
    let port = http_receiver(Arc::clone(&received));
    let metrics = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let id = format!(
        "{:016x}",
        u64::from(std::process::id()) * 0x2545_f491 + 0xdef
    )
    .repeat(4);
    let cg = TestCgroup::new(&format!(
        "vgpu-otlp-rate-{}/docker/{id}",
        std::process::id()
    ));
    let socket = dir.path().join("agent.sock");
    let _agent = Agent(
        Command::new(agent_bin())
            .args(["run", "--interval", "200ms", "--no-calibrate", "--no-nvml"])
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
            .args(["--trace-slow", "0", "--trace-sample-rate", "1"])
            .args(["--trace-container-rate", &RATE.to_string()])
            .args(["--otlp-protocol", "http", "--otlp-endpoint"])
            .arg(format!("http://127.0.0.1:{port}"))
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let lib_path = lib.display().to_string();
    let wdir = dir.path().join("w");
    std::fs::create_dir_all(&wdir).unwrap();
    let mut cmd = exercise(&lib);
    cmd.args([
        "counts",
        "--per-api",
        &CALLS.to_string(),
        "--init",
        "--apis",
    ])
    .arg("cuMemAlloc_v2,cuMemFree_v2");
    let w = Workload::start(cmd, &wdir);
    std::fs::write(cg.0.join("cgroup.procs"), w.pid().to_string()).unwrap();
    let pid = w.pid();
    wait_until(
        Duration::from_secs(30),
        || {
            snapshot(&socket).is_some_and(|s| {
                s["agent"]["libraries"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|l| l["path"] == lib_path.as_str()))
            })
        },
        "the agent to attach to the simulated driver",
    );
    let t0 = Instant::now();
    w.go();
    let made = w.finish();
    let seconds = t0.elapsed().as_secs_f64();
    assert_eq!(made["calls"]["cuMemAlloc_v2"]["calls"], CALLS);
    // Every probed call was a candidate (1 in 1): all but the container's rate are counted.
    let dropped = "vgpu_agent_spans_dropped_total{reason=\"container_rate\"}";
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let min_dropped = 2 * CALLS - RATE * (seconds.ceil() as u64 + 2);
    while Instant::now() < deadline {
        last = scrape(metrics);
        if counter(&last, dropped).is_some_and(|n| n >= min_dropped) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let n = counter(&last, dropped).unwrap_or_else(|| panic!("no {dropped} in {last}"));
    assert!(
        n >= min_dropped,
        "{n} dropped of {} calls in {seconds:.2} s",
        2 * CALLS
    );
    // What went through: at most one second's worth plus the rate over the run (+1 for the
    // cuInit call before it), and some.
    std::thread::sleep(Duration::from_millis(1500));
    let spans: usize = received
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| &r.resource_spans)
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .filter(|s| int(&s.attributes, "process.pid") == i64::from(pid))
        .inspect(|s| assert_eq!(string(&s.attributes, "gpu.sampled_by"), "rate"))
        .count();
    let most = RATE as f64 * (1.0 + seconds) + 1.0;
    assert!(
        spans >= 1 && spans as f64 <= most,
        "{spans} spans in {seconds:.2} s at {RATE}/s (at most {most})"
    );
    assert!(
        counter(
            &last,
            "vgpu_agent_spans_dropped_total{reason=\"queue_full\"}"
        ) == Some(0),
        "{last}"
    );
}
