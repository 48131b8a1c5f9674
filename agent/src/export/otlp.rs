//! OTLP traces of sampled calls. The return probes write a [`SpanEvent`] to the `SPANS` ring
//! buffer for every NCCL call, every call slower than `--trace-slow` and one in
//! `--trace-sample-rate` of the others; a reader thread drains the ring, keeps at most
//! `--trace-container-rate` of the rate-sampled spans per second per container
//! ([`super::sampling`], over: counted as `container_rate`), and queues them in a bounded queue
//! (`--otlp-queue`, full: counted as `queue_full`), and an exporter thread batches the queue
//! (512 spans or 1 s), groups each batch by container, and hands each group to
//! opentelemetry-otlp's span exporter (gRPC with tonic on a runtime of its own, or HTTP/protobuf)
//! with that container's resource: `service.name`, `host.name`, `container.id`,
//! `container.name`, `k8s.pod.name`, `k8s.pod.uid`, `k8s.namespace.name`. Resources are per
//! container, so the SDK's provider (one resource) is not used; its exporter and `SpanData` are.
//!
//! Times: the events carry CLOCK_MONOTONIC ns; they become wall-clock times with the offset
//! `CLOCK_REALTIME - CLOCK_MONOTONIC` measured at each batch.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::Relaxed},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use agent_common::{
    ApiId,
    maps::{SPAN_NCCL, SPAN_SAMPLED, SPAN_SLOW, SpanEvent},
};
use aya::maps::{MapData, RingBuf};
use opentelemetry::{
    InstrumentationScope, KeyValue,
    trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks},
};

use super::{ExportError, metrics::SpanCounters, sampling::ContainerRate};
use crate::model::Snapshot;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// `http://host:4317` (gRPC) or `http://host:4318` (HTTP; `/v1/traces` is added to a bare
    /// address).
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Spans waiting for export at most (the bounded queue).
    pub queue: usize,
    /// Rate-sampled spans per second per container at most (0: no limit).
    pub container_rate: f64,
}

const BATCH: usize = 512;
const BATCH_DELAY: Duration = Duration::from_secs(1);
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Who a process is, for span resources: pid -> container resource, refreshed from each snapshot.
#[derive(Default)]
pub struct Identities {
    by_pid: Mutex<HashMap<u32, Arc<(String, Resource)>>>,
}

impl Identities {
    pub fn refresh(&self, snap: &Snapshot) {
        let mut resources: HashMap<&str, Arc<(String, Resource)>> = HashMap::new();
        for c in &snap.containers {
            let mut kv = vec![
                KeyValue::new("service.name", "vgpu-agent"),
                KeyValue::new("host.name", snap.hostname.clone()),
                KeyValue::new("container.name", c.name.clone()),
            ];
            let opt = [
                ("container.id", &c.container_id),
                ("k8s.pod.name", &c.pod_name),
                ("k8s.pod.uid", &c.pod_uid),
                ("k8s.namespace.name", &c.namespace),
                ("container.runtime", &c.runtime),
            ];
            for (k, v) in opt {
                if let Some(v) = v {
                    kv.push(KeyValue::new(k, v.clone()));
                }
            }
            let r = Resource::builder_empty().with_attributes(kv).build();
            resources.insert(&c.key, Arc::new((c.key.clone(), r)));
        }
        let mut map = HashMap::new();
        for p in &snap.processes {
            if let Some(r) = resources.get(p.container.as_str()) {
                map.insert(p.key.pid, Arc::clone(r));
            }
        }
        *self.by_pid.lock().expect("not poisoned") = map;
    }

    fn resource(&self, pid: u32, host: &str) -> Arc<(String, Resource)> {
        if let Some(r) = self.by_pid.lock().expect("not poisoned").get(&pid) {
            return Arc::clone(r);
        }
        let r = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "vgpu-agent"),
                KeyValue::new("host.name", host.to_owned()),
            ])
            .build();
        Arc::new(("unknown".into(), r))
    }
}

/// The running pipeline; stops (flushing what is queued) when dropped.
pub struct SpanPipeline {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for SpanPipeline {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

enum Transport {
    Grpc(tokio::runtime::Runtime),
    Http,
}

fn build_exporter(
    cfg: &OtlpConfig,
) -> Result<(opentelemetry_otlp::SpanExporter, Transport), ExportError> {
    let err = |e: opentelemetry_otlp::ExporterBuildError| ExportError::Otlp(e.to_string());
    match cfg.protocol {
        OtlpProtocol::Grpc => {
            // tonic needs a tokio runtime: one worker thread of its own.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("otlp-grpc")
                .enable_all()
                .build()
                .map_err(ExportError::Thread)?;
            let exporter = {
                let _guard = rt.enter();
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(cfg.endpoint.clone())
                    .with_timeout(EXPORT_TIMEOUT)
                    .build()
                    .map_err(err)?
            };
            Ok((exporter, Transport::Grpc(rt)))
        }
        OtlpProtocol::Http => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(http_traces_url(&cfg.endpoint))
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(err)?;
            Ok((exporter, Transport::Http))
        }
    }
}

/// `http://host:4318` -> `http://host:4318/v1/traces`; a URL with a path is kept.
pub fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, r)| r);
    if after_scheme.contains('/') {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

/// Starts the reader and exporter threads.
pub fn start(
    cfg: OtlpConfig,
    ring: RingBuf<MapData>,
    ids: Arc<Identities>,
    counters: Arc<SpanCounters>,
    hostname: String,
) -> Result<SpanPipeline, ExportError> {
    let (exporter, transport) = build_exporter(&cfg)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = sync_channel::<SpanEvent>(cfg.queue.max(1));
    let reader = {
        let (stop, counters) = (Arc::clone(&stop), Arc::clone(&counters));
        let rate = ContainerRate::new(cfg.container_rate);
        std::thread::Builder::new()
            .name("span-ring".into())
            .spawn(move || read_ring(ring, tx, rate, &stop, &counters))
            .map_err(ExportError::Thread)?
    };
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let mut e = Exporter {
                    exporter,
                    transport,
                    ids,
                    counters,
                    hostname,
                    next_id: seed(),
                };
                e.run(rx, &stop);
            })
            .map_err(ExportError::Thread)?
    };
    log::info!(
        "exporting spans of sampled calls to {} (OTLP {:?})",
        cfg.endpoint,
        cfg.protocol
    );
    Ok(SpanPipeline {
        stop,
        threads: vec![reader, writer],
    })
}

fn read_ring(
    mut ring: RingBuf<MapData>,
    tx: SyncSender<SpanEvent>,
    mut rate: ContainerRate,
    stop: &AtomicBool,
    counters: &SpanCounters,
) {
    let fd = ring.as_raw_fd();
    while !stop.load(Relaxed) {
        crate::sys::fd::wait_readable(fd, Duration::from_millis(100));
        while let Some(item) = ring.next() {
            if item.len() < size_of::<SpanEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole SpanEvent (a Pod of integers) at the start of the
            // record; read_unaligned makes no alignment assumption.
            let ev: SpanEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            if ev.reason == SPAN_SAMPLED && !rate.admit(ev.cgroup_id, ev.end_ns) {
                counters.container_rate.fetch_add(1, Relaxed);
                continue;
            }
            match tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    counters.queue_full.fetch_add(1, Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }
}

fn seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 40)
}

/// splitmix64: distinct, well-spread ids from a counter.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `CLOCK_REALTIME - CLOCK_MONOTONIC`, ns.
pub fn monotonic_to_wall_offset() -> i128 {
    use crate::sys::clock::{monotonic_ns, realtime_ns};
    let m0 = monotonic_ns();
    let r = realtime_ns();
    let m1 = monotonic_ns();
    r - (m0 + m1) / 2
}

fn wall(mono_ns: u64, offset: i128) -> SystemTime {
    let ns = (i128::from(mono_ns) + offset).max(0) as u128;
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns as u64)
}

/// A span from an event (pure: unit-tested).
pub fn span_of(ev: &SpanEvent, offset: i128, trace: u128, span: u64) -> SpanData {
    let id = ApiId(ev.api);
    let spec = id.spec();
    let name = spec.map_or("unknown", |s| s.name);
    let task_len = ev
        .task
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.task.len());
    let mut attrs = vec![
        KeyValue::new("gpu.api", name),
        KeyValue::new("gpu.api.kind", spec.map_or("unknown", |s| s.kind.name())),
        KeyValue::new("gpu.result", i64::from(ev.result)),
        KeyValue::new("gpu.bytes", ev.bytes as i64),
        KeyValue::new(
            "gpu.sampled_by",
            match ev.reason {
                SPAN_NCCL => "nccl",
                SPAN_SLOW => "slow",
                _ => "rate",
            },
        ),
        KeyValue::new("process.pid", i64::from(ev.tgid)),
        KeyValue::new("thread.id", i64::from(ev.tid)),
        KeyValue::new(
            "thread.name",
            String::from_utf8_lossy(&ev.task[..task_len]).into_owned(),
        ),
        KeyValue::new("cgroup.id", ev.cgroup_id as i64),
    ];
    if ev.comm != 0 {
        attrs.push(KeyValue::new("nccl.comm", format!("{:#x}", ev.comm)));
    }
    // Where the API takes a stream; 0x0 is the NULL (legacy default) stream.
    if spec.is_some_and(|s| s.stream.is_some()) {
        attrs.push(KeyValue::new("cuda.stream", format!("{:#x}", ev.stream)));
    }
    let status = if ev.result == 0 {
        Status::Unset
    } else {
        Status::error(format!("{name} returned {}", ev.result))
    };
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace.to_be_bytes()),
            SpanId::from_bytes(span.to_be_bytes()),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Client,
        name: Cow::Borrowed(name),
        start_time: wall(ev.start_ns, offset),
        end_time: wall(ev.end_ns.max(ev.start_ns), offset),
        attributes: attrs,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: InstrumentationScope::builder("vgpu-agent")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

struct Exporter {
    exporter: opentelemetry_otlp::SpanExporter,
    transport: Transport,
    ids: Arc<Identities>,
    counters: Arc<SpanCounters>,
    hostname: String,
    next_id: u64,
}

impl Exporter {
    fn run(&mut self, rx: Receiver<SpanEvent>, stop: &AtomicBool) {
        let mut batch: Vec<SpanEvent> = Vec::with_capacity(BATCH);
        let mut first: Option<Instant> = None;
        loop {
            let wait = first.map_or(Duration::from_millis(200), |f| {
                BATCH_DELAY.saturating_sub(f.elapsed())
            });
            match rx.recv_timeout(wait) {
                Ok(ev) => {
                    first.get_or_insert_with(Instant::now);
                    batch.push(ev);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush(&mut batch);
                    break;
                }
            }
            let due = first.is_some_and(|f| f.elapsed() >= BATCH_DELAY);
            if batch.len() >= BATCH || due || stop.load(Relaxed) {
                self.flush(&mut batch);
                first = None;
            }
            if stop.load(Relaxed) {
                while let Ok(ev) = rx.try_recv() {
                    batch.push(ev);
                }
                self.flush(&mut batch);
                break;
            }
        }
        let _ = self.exporter.shutdown();
    }

    fn flush(&mut self, batch: &mut Vec<SpanEvent>) {
        if batch.is_empty() {
            return;
        }
        let offset = monotonic_to_wall_offset();
        let mut groups: BTreeMap<String, (Resource, Vec<SpanData>)> = BTreeMap::new();
        for ev in batch.drain(..) {
            let ident = self.ids.resource(ev.tgid, &self.hostname);
            self.next_id = self.next_id.wrapping_add(1);
            let trace = (u128::from(mix(self.next_id)) << 64) | u128::from(mix(!self.next_id));
            let span = mix(self.next_id ^ 0x5bd1_e995).max(1);
            let (_, spans) = groups
                .entry(ident.0.clone())
                .or_insert_with(|| (ident.1.clone(), Vec::new()));
            spans.push(span_of(&ev, offset, trace.max(1), span));
        }
        for (_, (resource, spans)) in groups {
            let n = spans.len() as u64;
            self.exporter.set_resource(&resource);
            let fut = self.exporter.export(spans);
            let result = match &self.transport {
                Transport::Grpc(rt) => rt.block_on(fut),
                Transport::Http => futures_executor::block_on(fut),
            };
            match result {
                Ok(()) => self.counters.exported.fetch_add(n, Relaxed),
                Err(e) => {
                    log::warn!("exporting {n} spans: {e}");
                    self.counters.export_failed.fetch_add(n, Relaxed)
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_endpoints_get_the_traces_path_once() {
        assert_eq!(
            http_traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(http_traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            http_traces_url("https://c/otlp/v1/traces"),
            "https://c/otlp/v1/traces"
        );
    }

    #[test]
    fn events_become_spans_with_wall_times_and_attributes() {
        let api = ApiId::from_name("ncclAllReduce").unwrap();
        let mut task = [0u8; 16];
        task[..5].copy_from_slice(b"train");
        let ev = SpanEvent {
            start_ns: 1_000_000_000,
            end_ns: 1_002_500_000,
            cgroup_id: 77,
            bytes: 4096,
            comm: 0x10000,
            stream: 0x5000_0001,
            tgid: 42,
            tid: 43,
            result: 5,
            api: api.0,
            reason: SPAN_NCCL,
            _pad: 0,
            task,
        };
        let offset = 1_700_000_000_000_000_000i128;
        let s = span_of(&ev, offset, 9, 3);
        assert_eq!(s.name, "ncclAllReduce");
        assert_eq!(
            s.end_time.duration_since(s.start_time).unwrap(),
            Duration::from_micros(2500)
        );
        assert_eq!(
            s.start_time,
            SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_001_000_000_000)
        );
        let get = |k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .unwrap()
                .value
                .to_string()
        };
        assert_eq!(get("gpu.bytes"), "4096");
        assert_eq!(get("gpu.result"), "5");
        assert_eq!(get("gpu.api.kind"), "nccl");
        assert_eq!(get("gpu.sampled_by"), "nccl");
        assert_eq!(get("thread.name"), "train");
        assert_eq!(get("nccl.comm"), "0x10000");
        assert_eq!(get("cuda.stream"), "0x50000001");
        assert!(matches!(s.status, Status::Error { .. }));
        // An API without a stream argument has no stream attribute.
        let sync = SpanEvent {
            api: ApiId::from_name("cuCtxSynchronize").unwrap().0,
            stream: 0,
            ..ev
        };
        let s = span_of(&sync, offset, 9, 4);
        assert!(
            s.attributes
                .iter()
                .all(|kv| kv.key.as_str() != "cuda.stream")
        );
    }

    #[test]
    fn the_offset_maps_monotonic_to_now() {
        let off = monotonic_to_wall_offset();
        let mono = crate::sys::clock::monotonic_ns() as u64;
        let w = wall(mono, off);
        let d = SystemTime::now()
            .duration_since(w)
            .unwrap_or_else(|e| e.duration());
        assert!(d < Duration::from_millis(50), "{d:?}");
    }
}
