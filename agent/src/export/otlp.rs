//! OTLP traces of sampled calls. The return probes write a [`SpanEvent`] to the `SPANS` ring
//! buffer for every NCCL call, every call slower than `--trace-slow` and one in
//! `--trace-sample-rate` of the others; a reader thread drains the ring, keeps at most so many
//! spans of each kind per second per container ([`super::sampling`]: `--trace-container-rate`
//! rate-sampled ones, `--trace-container-event-rate` NCCL and slow-call ones; over: counted as
//! `container_rate`, per container too), and queues them in a bounded queue (`--otlp-queue`,
//! full: counted as `queue_full`), and an exporter thread batches the queue
//! (512 spans or 1 s), groups each batch by container, and hands each group to
//! opentelemetry-otlp's span exporter (gRPC with tonic on a runtime of its own, or HTTP/protobuf)
//! with that container's resource: `service.name`, `host.name`, `container.id`,
//! `container.name`, `k8s.pod.name`, `k8s.pod.uid`, `k8s.namespace.name`. Resources are per
//! container, so the SDK's provider (one resource) is not used; its exporter and `SpanData` are.
//!
//! Every string a tenant chose (the thread name, and the container's names in the resource) is
//! made inert ([`crate::sanitize::inert`]) here as well as in the model, so that no span carries
//! a control character whatever the snapshot it was resolved from.
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

use agent_common::{ApiId, maps::SpanEvent};
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

use super::{
    ExportError,
    metrics::SpanCounters,
    sampling::{SpanRates, kind_name},
};
use crate::{model::Snapshot, sanitize::inert};

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
    /// How often the containers' GPU time is exported as metrics (`None`: never;
    /// [`super::otlp_metrics`]).
    pub metrics_interval: Option<Duration>,
    /// Rate-sampled spans per second per container at most (0: no limit).
    pub container_rate: f64,
    /// NCCL spans, and slow-call spans, per second per container at most (each; 0: no limit).
    pub container_event_rate: f64,
}

const BATCH: usize = 512;
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// How long one export (spans or metrics) may take.
pub(super) const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

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
                KeyValue::new("host.name", inert(&snap.hostname).into_owned()),
                KeyValue::new("container.name", inert(&c.name).into_owned()),
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
                    kv.push(KeyValue::new(k, inert(v).into_owned()));
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

    /// The container key of a process (`unknown` when not in the last snapshot).
    pub fn container_of(&self, pid: u32) -> String {
        self.by_pid
            .lock()
            .expect("not poisoned")
            .get(&pid)
            .map_or_else(|| "unknown".to_owned(), |r| r.0.clone())
    }

    fn resource(&self, pid: u32, host: &str) -> Arc<(String, Resource)> {
        if let Some(r) = self.by_pid.lock().expect("not poisoned").get(&pid) {
            return Arc::clone(r);
        }
        Arc::new(("unknown".into(), agent_resource(host)))
    }
}

/// The resource of what the agent itself exports (metrics, and spans of no known container).
pub(super) fn agent_resource(host: &str) -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "vgpu-agent"),
            KeyValue::new("host.name", inert(host).into_owned()),
        ])
        .build()
}

/// The tokio runtime a tonic exporter's channel runs on: one worker thread of its own.
pub(super) fn grpc_runtime(name: &str) -> Result<tokio::runtime::Runtime, ExportError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(ExportError::Thread)
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
            let rt = grpc_runtime("otlp-grpc")?;
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
                .with_endpoint(http_url(&cfg.endpoint, "/v1/traces"))
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(err)?;
            Ok((exporter, Transport::Http))
        }
    }
}

/// `http://host:4318` -> `http://host:4318` + `signal` (`/v1/traces`, `/v1/metrics`); a URL with
/// a path is kept.
pub(super) fn http_url(endpoint: &str, signal: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, r)| r);
    if after_scheme.contains('/') {
        trimmed.to_owned()
    } else {
        format!("{trimmed}{signal}")
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
        let (stop, counters, ids) = (Arc::clone(&stop), Arc::clone(&counters), Arc::clone(&ids));
        let rates = SpanRates::new(cfg.container_rate, cfg.container_event_rate);
        std::thread::Builder::new()
            .name("span-ring".into())
            .spawn(move || {
                let mut admit = Admission {
                    rates,
                    ids: &ids,
                    counters: &counters,
                    tx,
                };
                read_ring(ring, &mut admit, &stop)
            })
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

/// What the ring's reader does with each event: its container's bucket for its kind, then the
/// bounded queue; what does not pass is counted, in total and per container.
struct Admission<'a> {
    rates: SpanRates,
    ids: &'a Identities,
    counters: &'a SpanCounters,
    tx: SyncSender<SpanEvent>,
}

impl Admission<'_> {
    /// Queues the event or counts why not; false once the exporter is gone.
    fn offer(&mut self, ev: SpanEvent) -> bool {
        if !self.rates.admit(&ev) {
            self.counters.container_rate.fetch_add(1, Relaxed);
            self.counters.count_container_drop(
                &self.ids.container_of(ev.tgid),
                kind_name(ev.reason),
                "container_rate",
            );
            return true;
        }
        match self.tx.try_send(ev) {
            Ok(()) => true,
            Err(TrySendError::Full(ev)) => {
                self.counters.queue_full.fetch_add(1, Relaxed);
                self.counters.count_container_drop(
                    &self.ids.container_of(ev.tgid),
                    kind_name(ev.reason),
                    "queue_full",
                );
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

fn read_ring(mut ring: RingBuf<MapData>, admit: &mut Admission<'_>, stop: &AtomicBool) {
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
            if !admit.offer(ev) {
                return;
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
        KeyValue::new("gpu.sampled_by", kind_name(ev.reason)),
        KeyValue::new("process.pid", i64::from(ev.tgid)),
        KeyValue::new("thread.id", i64::from(ev.tid)),
        KeyValue::new(
            "thread.name",
            inert(&String::from_utf8_lossy(&ev.task[..task_len])).into_owned(),
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
    use agent_common::maps::{SPAN_NCCL, SPAN_SAMPLED, SPAN_SLOW};

    #[test]
    fn http_endpoints_get_the_traces_path_once() {
        assert_eq!(
            http_url("http://127.0.0.1:4318", "/v1/traces"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://c:4318/", "/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            http_url("https://c/otlp/v1/traces", "/v1/traces"),
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

    fn event(tgid: u32, cgroup_id: u64, reason: u8, end_ns: u64) -> SpanEvent {
        SpanEvent {
            start_ns: end_ns.saturating_sub(1000),
            end_ns,
            cgroup_id,
            bytes: 0,
            comm: 0,
            stream: 0,
            tgid,
            tid: tgid,
            result: 0,
            api: ApiId::from_name("ncclAllReduce").unwrap().0,
            reason,
            _pad: 0,
            task: [0; 16],
        }
    }

    #[test]
    fn escape_codes_in_a_thread_name_are_exported_inert() {
        let mut task = [0u8; 16];
        let hostile = b"\x1b]0;pwn\x07\x1b[2J\r\x9b";
        task[..hostile.len()].copy_from_slice(hostile);
        let ev = SpanEvent {
            task,
            ..event(42, 7, SPAN_SLOW, 2_000_000)
        };
        let s = span_of(&ev, 0, 1, 1);
        let name = s
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "thread.name")
            .unwrap()
            .value
            .to_string();
        assert!(!name.chars().any(char::is_control), "{name:?}");
        assert!(name.starts_with("\\x1b]0;pwn\\x07\\x1b[2J\\r"), "{name:?}");
        // The span as the OTLP exporter encodes it (the protobuf's string field): no control
        // byte reaches the wire.
        let proto = opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope(
            vec![s],
            &opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema::default(),
        );
        let bytes = prost::Message::encode_to_vec(&proto[0]);
        assert!(
            !bytes.windows(2).any(|w| w == b"\x1b]" || w == b"\x1b["),
            "an escape sequence in the encoded span"
        );
        assert!(bytes.windows(4).any(|w| w == b"\\x1b"));
    }

    #[test]
    fn a_containers_nccl_flood_does_not_crowd_out_anothers_spans() {
        const QUEUE: usize = 64;
        let ids = Identities::default();
        let counters = SpanCounters::default();
        let (tx, rx) = sync_channel::<SpanEvent>(QUEUE);
        let mut admit = Admission {
            rates: SpanRates::new(10.0, 20.0),
            ids: &ids,
            counters: &counters,
            tx,
        };
        // Container 1 (pid 100) floods 100,000 NCCL calls in one second; container 2 (pid 200)
        // makes 10 NCCL calls, 5 slow ones and 5 rate-sampled ones, spread over the same second.
        // No exporter drains the queue meanwhile: the queue alone would be full after 64.
        let s = 1_000_000_000u64;
        for i in 0..100_000u64 {
            assert!(admit.offer(event(100, 1, SPAN_NCCL, s + i * 10_000)));
            if i % 5_000 == 0 {
                let t = s + i * 10_000;
                let reason = match (i / 5_000) % 4 {
                    0 | 1 => SPAN_NCCL,
                    2 => SPAN_SLOW,
                    _ => SPAN_SAMPLED,
                };
                assert!(admit.offer(event(200, 2, reason, t)));
            }
        }
        let queued: Vec<SpanEvent> = rx.try_iter().collect();
        let of = |tgid: u32| queued.iter().filter(|e| e.tgid == tgid).count();
        assert_eq!(of(200), 20, "every span of the quiet container is queued");
        // The flood kept to its container's NCCL rate: the bucket's one second's worth (20) and
        // what refilled over the second the flood lasted (20 less one call's interval).
        assert!((39..=40).contains(&of(100)), "{}", of(100));
        assert_eq!(counters.queue_full.load(Relaxed), 0);
        let drops = counters.container_drops();
        let flood = drops[&("unknown".to_owned(), "nccl", "container_rate")];
        assert_eq!(flood as usize, 100_000 - of(100));
        assert_eq!(drops.len(), 1, "{drops:?}");
        println!(
            "flood: {} of 100000 NCCL spans queued, {flood} dropped; quiet container: {} of 20",
            of(100),
            of(200)
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
