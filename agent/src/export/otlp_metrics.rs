//! The GPU time per container as OTLP metrics, beside the spans ([`super::otlp`]), to the same
//! endpoint (`--otlp-endpoint`, `/v1/metrics` added to a bare HTTP address): the same two series
//! `/metrics` shows (docs/metrics.md), with the same bounds.
//!
//! - `vgpu.container.gpu_busy` (gauge, ratio): per container, device and `source` (`limiter`:
//!   the kernel time the limiter timed; `nvml`: NVML's per-process samples beside it).
//! - `vgpu.container.kernel.time` (counter, seconds, cumulative): per container, its top 8 kernel
//!   names by GPU time and the rest as `other`.
//!
//! Each carries the attributes `container`, `pod`, `namespace`, and `device` and `source`, or
//! `kernel`. The daemon hands every snapshot to [`GpuTimeMetrics::update`]; the SDK's periodic
//! reader (a thread of its own) reads the latest at each export, every `interval`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry::{KeyValue, metrics::MeterProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use super::{
    ExportError,
    exposition::Value,
    gpu_use::{Samples, gpu_time_series},
    metrics::container_labels,
    otlp::{EXPORT_TIMEOUT, OtlpConfig, OtlpProtocol, agent_resource, grpc_runtime, http_url},
};
use crate::model::Snapshot;

/// The series of the latest snapshot, as the readers' callbacks observe them.
#[derive(Debug, Default)]
struct Readings {
    busy: Vec<(Vec<KeyValue>, f64)>,
    kernels: Vec<(Vec<KeyValue>, f64)>,
}

/// The running metrics pipeline; exports what is left and stops when dropped.
pub struct GpuTimeMetrics {
    provider: SdkMeterProvider,
    readings: Arc<Mutex<Readings>>,
    /// tonic's runtime (gRPC only): the exporter's channel runs on it.
    _runtime: Option<tokio::runtime::Runtime>,
}

impl GpuTimeMetrics {
    /// Starts exporting to `cfg`'s endpoint every `interval`.
    pub fn start(
        cfg: &OtlpConfig,
        hostname: &str,
        interval: Duration,
    ) -> Result<GpuTimeMetrics, ExportError> {
        let err = |e: opentelemetry_otlp::ExporterBuildError| ExportError::Otlp(e.to_string());
        let (exporter, runtime) = match cfg.protocol {
            OtlpProtocol::Grpc => {
                let rt = grpc_runtime("otlp-metrics")?;
                let exporter = {
                    let _guard = rt.enter();
                    opentelemetry_otlp::MetricExporter::builder()
                        .with_tonic()
                        .with_endpoint(cfg.endpoint.clone())
                        .with_timeout(EXPORT_TIMEOUT)
                        .build()
                        .map_err(err)?
                };
                (exporter, Some(rt))
            }
            OtlpProtocol::Http => (
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(http_url(&cfg.endpoint, "/v1/metrics"))
                    .with_timeout(EXPORT_TIMEOUT)
                    .build()
                    .map_err(err)?,
                None,
            ),
        };
        let reader = PeriodicReader::builder(exporter)
            .with_interval(interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(agent_resource(hostname))
            .build();
        let readings = Arc::new(Mutex::new(Readings::default()));
        let meter = provider.meter("vgpu-agent");
        let busy = Arc::clone(&readings);
        meter
            .f64_observable_gauge("vgpu.container.gpu_busy")
            .with_unit("1")
            .with_description(
                "Share of the device's time the container's processes kept it busy, by source \
                 (limiter: the kernel time the limiter timed; nvml: NVML's per-process samples)",
            )
            .with_callback(move |o| {
                for (attrs, v) in &busy.lock().expect("not poisoned").busy {
                    o.observe(*v, attrs);
                }
            })
            .build();
        let kernels = Arc::clone(&readings);
        meter
            .f64_observable_counter("vgpu.container.kernel.time")
            .with_unit("s")
            .with_description(
                "GPU time of the container's kernels as the limiter timed them: its top 8 kernel \
                 names by time and the rest as other",
            )
            .with_callback(move |o| {
                for (attrs, v) in &kernels.lock().expect("not poisoned").kernels {
                    o.observe(*v, attrs);
                }
            })
            .build();
        log::info!(
            "exporting containers' GPU time as OTLP metrics to {} ({:?}) every {:?}",
            cfg.endpoint,
            cfg.protocol,
            interval
        );
        Ok(GpuTimeMetrics {
            provider,
            readings,
            _runtime: runtime,
        })
    }

    /// Takes the series of `snap` for the next export.
    pub fn update(&self, snap: &Snapshot) {
        let by_key: HashMap<&str, _> = snap
            .containers
            .iter()
            .map(|c| (c.key.as_str(), c))
            .collect();
        let labels_of = |key: &str| container_labels(by_key.get(key).copied(), key);
        let (busy, kernels) = gpu_time_series(snap, &labels_of);
        let r = Readings {
            busy: attributes(busy, &["device", "source"]),
            kernels: attributes(kernels, &["kernel"]),
        };
        *self.readings.lock().expect("not poisoned") = r;
    }

    /// Exports now (the periodic reader exports on its own).
    #[cfg(test)]
    fn flush(&self) -> Result<(), ExportError> {
        self.provider
            .force_flush()
            .map_err(|e| ExportError::Otlp(e.to_string()))
    }
}

impl Drop for GpuTimeMetrics {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            log::debug!("OTLP metrics shutdown: {e}");
        }
    }
}

/// Label values (the container's three, then `extra`) as OTLP attributes.
fn attributes(samples: Samples, extra: &[&'static str]) -> Vec<(Vec<KeyValue>, f64)> {
    const CONTAINER: [&str; 3] = ["container", "pod", "namespace"];
    samples
        .into_iter()
        .filter_map(|(labels, v)| {
            let Value::Float(v) = v else { return None };
            let attrs = CONTAINER
                .iter()
                .chain(extra)
                .zip(labels)
                .map(|(k, l)| KeyValue::new(*k, l))
                .collect();
            Some((attrs, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpListener,
        sync::mpsc,
    };

    use opentelemetry_proto::tonic::{
        collector::metrics::v1::{
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
        common::v1::{KeyValue as PbKeyValue, any_value},
        metrics::v1::{metric, number_data_point},
    };
    use prost::Message;

    use super::*;

    /// One OTLP/HTTP export: the path and the decoded request.
    fn receive_one(listener: TcpListener, tx: mpsc::Sender<(String, ExportMetricsServiceRequest)>) {
        let (mut conn, _) = listener.accept().expect("a connection");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let (start, len, path) = loop {
            let n = conn.read(&mut chunk).expect("the request");
            assert!(n > 0, "the connection closed before its head");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse::<usize>().unwrap())
                    .expect("a Content-Length");
                break (i + 4, len, path);
            }
        };
        while buf.len() < start + len {
            let n = conn.read(&mut chunk).expect("the body");
            assert!(n > 0, "the connection closed inside the body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let req = ExportMetricsServiceRequest::decode(&buf[start..start + len])
            .expect("an OTLP ExportMetricsServiceRequest");
        let body = ExportMetricsServiceResponse {
            partial_success: None,
        }
        .encode_to_vec();
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(&body);
        let _ = tx.send((path, req));
    }

    /// Exports the fixture's snapshot now, as `node-1`, to a receiver on `port` (the periodic
    /// export an hour away).
    fn export_fixture(protocol: OtlpProtocol, port: u16) -> GpuTimeMetrics {
        let cfg = OtlpConfig {
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol,
            queue: 16,
            metrics_interval: Some(Duration::from_secs(3600)),
            container_rate: 0.0,
            container_event_rate: 0.0,
        };
        let m = GpuTimeMetrics::start(&cfg, "node-1", Duration::from_secs(3600))
            .expect("the exporter starts");
        m.update(&crate::tui::fixture::snapshot());
        m.flush().expect("the export is accepted");
        m
    }

    fn attr(attrs: &[PbKeyValue], key: &str) -> String {
        attrs
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.clone())
            .map(|v| match v {
                any_value::Value::StringValue(s) => s,
                other => format!("{other:?}"),
            })
            .unwrap_or_default()
    }

    /// The fixture's trainer pod: its busy share by source and its kernel time reach an OTLP/HTTP
    /// receiver as metrics, with the container's attributes, as `/metrics` shows them.
    #[test]
    fn a_containers_gpu_time_reaches_an_otlp_receiver_as_metrics() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        let receiver = std::thread::spawn(move || receive_one(listener, tx));
        let _m = export_fixture(OtlpProtocol::Http, port);
        let (path, req) = rx.recv_timeout(Duration::from_secs(20)).expect("an export");
        receiver.join().unwrap();
        assert_eq!(path, "/v1/metrics");
        let rm = &req.resource_metrics[0];
        let res = &rm.resource.as_ref().unwrap().attributes;
        assert_eq!(attr(res, "service.name"), "vgpu-agent");
        assert_eq!(attr(res, "host.name"), "node-1");
        let metrics: Vec<_> = rm.scope_metrics.iter().flat_map(|s| &s.metrics).collect();
        let busy = metrics
            .iter()
            .find(|m| m.name == "vgpu.container.gpu_busy")
            .expect("the busy gauge");
        let Some(metric::Data::Gauge(g)) = &busy.data else {
            panic!("{busy:?}")
        };
        let limiter = g
            .data_points
            .iter()
            .find(|p| {
                attr(&p.attributes, "container") == "pytorch"
                    && attr(&p.attributes, "source") == "limiter"
            })
            .expect("the trainer's limiter share");
        assert_eq!(attr(&limiter.attributes, "pod"), "trainer-0");
        assert_eq!(attr(&limiter.attributes, "namespace"), "ml-team");
        assert_eq!(attr(&limiter.attributes, "device"), "0");
        let Some(number_data_point::Value::AsDouble(v)) = limiter.value else {
            panic!("{limiter:?}")
        };
        assert!((v - 0.34).abs() < 1e-9, "{v}");
        assert!(
            g.data_points
                .iter()
                .any(|p| attr(&p.attributes, "source") == "nvml"),
            "NVML's share beside it"
        );
        let kernels = metrics
            .iter()
            .find(|m| m.name == "vgpu.container.kernel.time")
            .expect("the kernel counter");
        assert_eq!(kernels.unit, "s");
        let Some(metric::Data::Sum(sum)) = &kernels.data else {
            panic!("{kernels:?}")
        };
        assert!(sum.is_monotonic);
        let names: Vec<String> = sum
            .data_points
            .iter()
            .filter(|p| attr(&p.attributes, "container") == "pytorch")
            .map(|p| attr(&p.attributes, "kernel"))
            .collect();
        assert_eq!(names.len(), 4, "the top names and other: {names:?}");
        assert!(names.contains(&"flash_fwd_kernel".to_string()), "{names:?}");
        assert!(names.contains(&"other".to_string()), "{names:?}");
    }

    struct Grpc(mpsc::Sender<ExportMetricsServiceRequest>);

    #[tonic::async_trait]
    impl MetricsService for Grpc {
        async fn export(
            &self,
            request: tonic::Request<ExportMetricsServiceRequest>,
        ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
            let _ = self.0.send(request.into_inner());
            Ok(tonic::Response::new(ExportMetricsServiceResponse {
                partial_success: None,
            }))
        }
    }

    /// Over gRPC (the default transport): the export runs from the SDK's reader thread on the
    /// exporter's own runtime, and arrives.
    #[test]
    fn over_grpc_too() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(MetricsServiceServer::new(Grpc(tx)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let m = export_fixture(OtlpProtocol::Grpc, port);
        let req = rx.recv_timeout(Duration::from_secs(20)).expect("an export");
        let names: Vec<&str> = req.resource_metrics[0]
            .scope_metrics
            .iter()
            .flat_map(|s| &s.metrics)
            .map(|m| m.name.as_str())
            .collect();
        assert!(names.contains(&"vgpu.container.gpu_busy"), "{names:?}");
        assert!(names.contains(&"vgpu.container.kernel.time"), "{names:?}");
        drop(m);
    }

    #[test]
    fn http_endpoints_get_the_metrics_path_once() {
        assert_eq!(
            http_url("http://h:4318", "/v1/metrics"),
            "http://h:4318/v1/metrics"
        );
        assert_eq!(
            http_url("http://h:4318/", "/v1/metrics"),
            "http://h:4318/v1/metrics"
        );
        assert_eq!(
            http_url("http://h:4318/custom/path", "/v1/metrics"),
            "http://h:4318/custom/path"
        );
    }

    #[test]
    fn labels_become_attributes_in_order() {
        let a = attributes(
            vec![(
                vec![
                    "c".into(),
                    "p".into(),
                    "ns".into(),
                    "0".into(),
                    "limiter".into(),
                ],
                Value::Float(0.25),
            )],
            &["device", "source"],
        );
        assert_eq!(a.len(), 1);
        let keys: Vec<String> = a[0].0.iter().map(|kv| kv.key.to_string()).collect();
        assert_eq!(keys, ["container", "pod", "namespace", "device", "source"]);
        assert_eq!(a[0].0[4].value.as_str(), "limiter");
        assert_eq!(a[0].1, 0.25);
    }
}
