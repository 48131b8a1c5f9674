//! What a node's `/metrics` costs: its series and bytes per container and per node (checked
//! against docs/metrics.md in every test run), and the scrape benchmark (`cargo xtask bench
//! export`; docs/benchmarks.md).

use std::{
    io::{Read, Write},
    sync::Arc,
    time::Instant,
};

use super::{
    MetricsOptions, MetricsView, SpanCounters,
    tests::{synthetic, with_a_region_and_a_gpu},
};
use crate::export::encode::{Body, Format, Latest};

/// The benchmark's model: 100 containers of one process, 40 APIs each over every kind.
const CONTAINERS: usize = 100;
const APIS: usize = 40;

fn view(per_api: bool) -> MetricsView {
    MetricsView::new(
        MetricsOptions {
            per_api,
            ..Default::default()
        },
        Arc::new(SpanCounters::default()),
    )
}

/// (series with a `container` label, series without, bytes) of an OpenMetrics body.
fn count(text: &str) -> (usize, usize, usize) {
    let samples = text.lines().filter(|l| !l.starts_with('#'));
    let (with, without) = samples.fold((0, 0), |(w, wo), l| {
        if l.contains("container=\"") {
            (w + 1, wo)
        } else {
            (w, wo + 1)
        }
    });
    (with, without, text.len())
}

/// The figures docs/metrics.md states: series per container at the default and with
/// `--metrics-per-api`, series of the node itself, and the default body for 100 containers.
#[test]
fn series_and_bytes_per_container_and_node_are_what_the_docs_say() {
    let mut figures = vec![];
    for per_api in [false, true] {
        let snap = with_a_region_and_a_gpu(synthetic(CONTAINERS, APIS));
        let text = Body::encode(&view(per_api).update(&snap)).text(Format::OpenMetrics);
        let (with, without, bytes) = count(&text);
        assert_eq!(with % CONTAINERS, 0, "every container has the same series");
        figures.push((with / CONTAINERS, without, bytes));
    }
    let [(kind, node, bytes), (api, node_api, bytes_api)] = figures[..] else {
        unreachable!()
    };
    assert_eq!(
        node, node_api,
        "the node's own series do not depend on the mode"
    );
    assert!(
        bytes < 1_000_000,
        "the default body for {CONTAINERS} containers is {bytes} bytes"
    );
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .unwrap();
    for said in [
        format!("{kind} series per container by default"),
        format!("{api} with `--metrics-per-api`"),
        format!("{node} series of its own"),
        format!("{} kB at the default", bytes.div_ceil(1000)),
        format!("{} kB with `--metrics-per-api`", bytes_api.div_ceil(1000)),
    ] {
        assert!(
            doc.contains(&said),
            "docs/metrics.md should say \"{said}\" (series per container {kind} / {api}, node \
             {node}, bytes {bytes} / {bytes_api})"
        );
    }
}

fn pct(xs: &mut [f64], q: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// One mode of the scrape benchmark, as JSON: per refresh the time to fold the snapshot in and
/// to encode the body (and deflate it, as a refresh does once a scraper asked for gzip); per scrape an HTTP GET of the body as Prometheus asks for it
/// (OpenMetrics, gzip) and uncompressed; p50/p99 of `rounds` rounds, each a refresh then one
/// scrape of each kind (every scrape gets a new body).
fn bench(per_api: bool, rounds: usize) -> String {
    let snap = with_a_region_and_a_gpu(synthetic(CONTAINERS, APIS));
    let mut v = view(per_api);
    let latest = Arc::new(Latest::with_snapshot_age());
    let addr =
        crate::export::http::serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&latest)).unwrap();
    let scrape = |encoding: &str| {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0\r\n{encoding}\r\n"
        )
        .unwrap();
        let mut body = Vec::new();
        s.read_to_end(&mut body).unwrap();
        (t.elapsed().as_secs_f64() * 1e3, body.len())
    };
    let (mut fold, mut encode, mut plain, mut gzip) = (vec![], vec![], vec![], vec![]);
    let (mut size, mut gz_size, mut series) = (0, 0, 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let e = v.update(&snap);
        fold.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let body = Body::encode(&e);
        let encoded = t.elapsed();
        let text = body.text(Format::OpenMetrics);
        // Setting the body deflates it once a scraper has asked for gzip (the first round's
        // scrape did), as the daemon's refresh does.
        let t = Instant::now();
        latest.set(body);
        encode.push((encoded + t.elapsed()).as_secs_f64() * 1e3);
        let (with, without, _) = count(&text);
        series = with + without;
        let (ms, n) = scrape("Accept-Encoding: gzip\r\n");
        gzip.push(ms);
        gz_size = n;
        let (ms, n) = scrape("");
        plain.push(ms);
        size = n;
    }
    let fig = |xs: &mut Vec<f64>| format!("[{:.2}, {:.2}]", pct(xs, 0.5), pct(xs, 0.99));
    let met = size < 1_000_000 && pct(&mut gzip, 0.99) < 50.0 && pct(&mut plain, 0.99) < 50.0;
    assert!(
        gz_size > 1 << 10 && gz_size < size / 4,
        "gzip: {gz_size} of {size}"
    );
    format!(
        "{{\"series\": {series}, \"bytes\": {size}, \"gzip_bytes\": {gz_size}, \
         \"fold_p50_p99_ms\": {}, \"encode_p50_p99_ms\": {}, \"scrape_gzip_p50_p99_ms\": {}, \
         \"scrape_plain_p50_p99_ms\": {}, \"under_1mb_and_50ms\": {met}}}",
        fig(&mut fold),
        fig(&mut encode),
        fig(&mut gzip),
        fig(&mut plain),
    )
}

/// The scrape benchmark (docs/benchmarks.md): 100 containers x 40 APIs, at the default (per
/// kind) and with `--metrics-per-api`. The response sizes include the HTTP head.
/// `cargo test --release -p vgpu-agent --bin vgpu-agent scrape_benchmark -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark: run it in release mode"]
fn scrape_benchmark() {
    let per_kind = bench(false, 200);
    let per_api = bench(true, 50);
    println!(
        "scrape-bench: {{\"containers\": {CONTAINERS}, \"apis\": {APIS}, \"per_kind\": {per_kind}, \
         \"per_api\": {per_api}}}"
    );
}
