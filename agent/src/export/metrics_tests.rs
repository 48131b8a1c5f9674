use std::{collections::BTreeMap, sync::Arc};

use super::*;
use crate::export::{
    defs::{self, Def, Type, Unit},
    encode::{Body, Format, Latest},
};
use crate::model::{
    AgentStatus, Container, LimiterProcess, MemoryViews, Process, ProcessKey, RegionDevice,
    RegionInfo, Snapshot, Source,
};

pub(crate) fn api(name: &str, kind: &str, source: Source, calls: u64, ns_each: u64) -> ApiUsage {
    let mut hist = vec![0; HIST_BUCKETS];
    hist[agent_common::hist::bucket_of(ns_each)] = calls;
    ApiUsage {
        api: name.into(),
        kind: kind.into(),
        source,
        calls,
        errors: calls / 10,
        bytes: calls * 4096,
        total_ns: calls * ns_each,
        hook_ns: if source == Source::Limiter {
            calls * 50
        } else {
            0
        },
        denied: 0,
        hist,
        latency: None,
    }
}

pub(crate) fn process(pid: u32, container: &str, apis: Vec<ApiUsage>) -> Process {
    Process {
        key: ProcessKey {
            pid,
            start_ticks: u64::from(pid) * 7,
        },
        alive: true,
        comm: format!("train{pid}"),
        cmdline: String::new(),
        container: container.into(),
        cgroup_path: None,
        memory: MemoryViews {
            probes: Some(1 << 20),
            probes_allocations: Some(2),
            ..Default::default()
        },
        apis,
        limiter: None,
        nvml: vec![],
        communicators: vec![],
        alloc_sizes: vec![],
        rates: None,
    }
}

pub(crate) fn container(key: &str, pod: Option<&str>, processes: &[&Process]) -> Container {
    Container {
        key: key.into(),
        name: match pod {
            Some(p) => format!("ml/{p}/{key}"),
            None => key.into(),
        },
        containerised: true,
        runtime: Some("containerd".into()),
        container_id: Some(key.into()),
        pod_uid: None,
        pod_name: pod.map(str::to_owned),
        namespace: pod.map(|_| "ml".to_owned()),
        qos: None,
        processes: processes.iter().map(|p| p.key).collect(),
        regions: vec![],
    }
}

pub(crate) fn snapshot(containers: Vec<Container>, processes: Vec<Process>) -> Snapshot {
    Snapshot {
        schema: crate::model::SCHEMA.into(),
        hostname: "node-1".into(),
        taken_at_unix_ms: 1_700_000_000_000,
        interval_seconds: 1.0,
        driver_version: None,
        cuda_driver_version: None,
        agent: AgentStatus::default(),
        gpus: vec![],
        containers,
        processes,
    }
}

/// `containers` containers of one process each, `apis` APIs per process (the scrape benchmark's
/// model).
pub(crate) fn synthetic(containers: usize, apis: usize) -> Snapshot {
    let names: Vec<&str> = agent_common::api::APIS.iter().map(|s| s.name).collect();
    let mut cs = vec![];
    let mut ps = vec![];
    for c in 0..containers {
        let apis = (0..apis)
            .map(|i| {
                api(
                    names[i % names.len()],
                    "copy",
                    Source::Probes,
                    1000 + i as u64,
                    5000,
                )
            })
            .collect();
        let p = process(1000 + c as u32, &format!("c{c:03}"), apis);
        cs.push(container(
            &format!("c{c:03}"),
            Some(&format!("pod-{c}")),
            &[&p],
        ));
        ps.push(p);
    }
    snapshot(cs, ps)
}

fn sample<'a>(e: &'a Exposition, def: &Def, labels: &[&str]) -> Option<&'a Value> {
    e.family(def)
        .iter()
        .find(|(l, _)| labels.iter().all(|want| l.iter().any(|v| v == want)))
        .map(|(_, v)| v)
}

fn int(e: &Exposition, def: &Def, labels: &[&str]) -> u64 {
    match sample(e, def, labels) {
        Some(Value::Int(n)) => *n,
        other => panic!("{} {labels:?}: {other:?}", def.base),
    }
}

fn view() -> MetricsView {
    MetricsView::new(MetricsOptions::default(), Arc::new(SpanCounters::default()))
}

#[test]
fn containers_aggregate_their_processes_and_stay_monotonic_when_one_leaves() {
    let a = process(
        10,
        "ctr-a",
        vec![api("cuMemAlloc_v2", "alloc", Source::Probes, 5, 3000)],
    );
    let b = process(
        11,
        "ctr-a",
        vec![api("cuMemAlloc_v2", "alloc", Source::Probes, 7, 3000)],
    );
    let ca = container("ctr-a", Some("trainer-0"), &[&a, &b]);
    let mut v = view();
    let e = v.update(&snapshot(vec![ca.clone()], vec![a.clone(), b.clone()]));
    let labels = ["trainer-0", "ml", "cuMemAlloc_v2", "probes"];
    assert_eq!(int(&e, &defs::API_CALLS, &labels), 12);
    assert_eq!(int(&e, &defs::CONTAINER_PROCESSES, &["trainer-0"]), 2);
    // The container label is the container's own name, not namespace/pod/container.
    assert_eq!(e.family(&defs::API_CALLS)[0].0[0], "ctr-a");

    // b leaves the model: its 7 calls stay in the container's counter; a goes on counting.
    let mut a2 = a.clone();
    a2.apis[0] = api("cuMemAlloc_v2", "alloc", Source::Probes, 9, 3000);
    let e = v.update(&snapshot(vec![ca.clone()], vec![a2.clone()]));
    assert_eq!(int(&e, &defs::API_CALLS, &labels), 16);
    assert_eq!(int(&e, &defs::CONTAINER_PROCESSES, &["trainer-0"]), 1);

    // A live process whose counters went back cannot pull the container's counter down.
    let e = v.update(&snapshot(vec![ca.clone()], vec![a.clone()]));
    assert_eq!(int(&e, &defs::API_CALLS, &labels), 16);

    // Every process gone: the container's series remain with their totals.
    let e = v.update(&snapshot(vec![], vec![]));
    assert_eq!(int(&e, &defs::API_CALLS, &labels), 16);
}

#[test]
fn histogram_buckets_are_the_log2_bounds_in_seconds() {
    let p = process(
        10,
        "c",
        vec![
            api("cuCtxSynchronize", "sync", Source::Probes, 3, 2_000_000),
            api("cuMemcpyHtoD_v2", "copy", Source::Probes, 4, 500),
        ],
    );
    let c = container("c", None, &[&p]);
    let e = view().update(&snapshot(vec![c], vec![p]));
    let Some(Value::Histogram(sum, count, buckets)) =
        sample(&e, &defs::API_LATENCY, &["cuCtxSynchronize"])
    else {
        panic!("no histogram");
    };
    assert_eq!(*count, 3);
    assert!((sum - 0.006).abs() < 1e-12);
    assert_eq!(buckets.len(), 14);
    assert_eq!(buckets[0].0, 1024e-9);
    assert_eq!(buckets[1].0, 4096e-9);
    assert_eq!(buckets[12].0, (1u64 << 34) as f64 / 1e9);
    assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
    // 2 ms = 2_000_000 ns lies in [2^20, 2^21) ns: it counts under le = 2^22 ns (the bounds go
    // by factors of 4), none under le = 2^20 ns.
    let at = buckets.iter().position(|(_, n)| *n > 0).unwrap();
    assert_eq!(buckets[at], ((1u64 << 22) as f64 / 1e9, 3));
    assert_eq!(buckets[at - 1], ((1u64 << 20) as f64 / 1e9, 0));
    // Calls under 1 us count under the first bound.
    let Some(Value::Histogram(_, _, small)) = sample(&e, &defs::API_LATENCY, &["cuMemcpyHtoD_v2"])
    else {
        panic!("no histogram");
    };
    assert_eq!(small[0].1, 4);
    // Synchronisation time is the sync APIs' total.
    match sample(&e, &defs::SYNC, &["c"]) {
        Some(Value::Float(s)) => assert!((s - 0.006).abs() < 1e-12),
        other => panic!("{other:?}"),
    }
}

#[test]
fn regions_limits_and_limiter_figures() {
    let mut p = process(
        10,
        "c",
        vec![api("cuMemAlloc_v2", "alloc", Source::Limiter, 2, 900)],
    );
    p.limiter = Some(LimiterProcess {
        region: "/r".into(),
        slot: 0,
        held: vec![3 << 30, 0],
        context_bytes: vec![0, 0],
        throttled_ns: 1_500_000_000,
        dropped_records: 0,
        shard_problems: vec![],
    });
    let mut c = container("c", Some("p"), &[&p]);
    c.regions.push(RegionInfo {
        path: "/r".into(),
        format: "vgpu".into(),
        devices: vec![
            RegionDevice {
                index: 0,
                memory_limit: 4 << 30,
                sm_limit_pct: 50,
                reserved: 3 << 30,
                denied: 4,
            },
            RegionDevice {
                index: 1,
                memory_limit: 0,
                sm_limit_pct: 0,
                reserved: 0,
                denied: 0,
            },
        ],
        problems: vec![],
        read_retries: 0,
        writable_by_others: None,
    });
    let e = view().update(&snapshot(vec![c], vec![p]));
    assert_eq!(int(&e, &defs::CONTAINER_MEMORY_LIMIT, &["p", "0"]), 4 << 30);
    assert_eq!(
        e.family(&defs::CONTAINER_MEMORY_LIMIT).len(),
        1,
        "unlimited: no series"
    );
    assert_eq!(int(&e, &defs::CONTAINER_MEMORY_RESERVED, &["p", "1"]), 0);
    assert_eq!(int(&e, &defs::CONTAINER_DENIED, &["p", "0"]), 4);
    assert_eq!(
        int(&e, &defs::CONTAINER_MEMORY_USED, &["p", "0", "limiter"]),
        3 << 30
    );
    assert_eq!(
        int(&e, &defs::CONTAINER_MEMORY_USED, &["p", "probes"]),
        1 << 20
    );
    assert_eq!(int(&e, &defs::API_DENIED, &["cuMemAlloc_v2", "limiter"]), 0);
    assert_eq!(
        sample(&e, &defs::CONTAINER_SM_LIMIT, &["p", "0"]),
        Some(&Value::Float(0.5))
    );
    assert_eq!(
        sample(&e, &defs::THROTTLED, &["p"]),
        Some(&Value::Float(1.5))
    );
}

#[test]
fn pid_labels_only_when_asked() {
    let p = process(
        42,
        "c",
        vec![api("cuMemFree_v2", "free", Source::Probes, 3, 900)],
    );
    let c = container("c", None, &[&p]);
    let s = snapshot(vec![c], vec![p]);
    assert!(
        view()
            .update(&s)
            .family(&defs::PROCESS_API_CALLS)
            .is_empty()
    );
    let mut v = MetricsView::new(
        MetricsOptions { pid_labels: true },
        Arc::new(SpanCounters::default()),
    );
    assert_eq!(
        int(&v.update(&s), &defs::PROCESS_API_CALLS, &["42", "train42"]),
        3
    );
}

#[test]
fn the_exposition_is_openmetrics_with_every_family_named_in_the_table() {
    let mut s = synthetic(3, 5);
    s.agent.events_lost = BTreeMap::from([("stack_full".to_owned(), 2)]);
    s.containers[0].regions.push(RegionInfo {
        path: "/r".into(),
        format: "hami".into(),
        devices: vec![RegionDevice {
            index: 0,
            memory_limit: 1 << 30,
            sm_limit_pct: 30,
            reserved: 1 << 29,
            denied: 1,
        }],
        problems: vec![],
        read_retries: 0,
        writable_by_others: None,
    });
    s.gpus.push(crate::model::GpuDevice {
        index: 0,
        uuid: Some("GPU-1".into()),
        name: Some("H200".into()),
        utilization_pct: Some(40),
        memory_used: Some(1 << 30),
        memory_total: Some(141 << 30),
        power_mw: None,
        temperature_c: None,
    });
    let text = Body::encode(&view().update(&s)).text(Format::OpenMetrics);
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE vgpu_api_latency_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT vgpu_api_latency_seconds seconds"),
        "{text}"
    );
    assert!(
        text.contains("vgpu_agent_events_lost_total{cause=\"stack_full\"} 2"),
        "{text}"
    );
    assert!(
        text.contains(
            "vgpu_api_calls_total{container=\"c000\",pod=\"pod-0\",namespace=\"ml\",api=\"cuMemAlloc_v2\",kind=\"copy\",source=\"probes\"} 1000"
        ),
        "{text}"
    );
    assert!(text.contains("vgpu_container_sm_limit_ratio{"), "{text}");
    assert!(
        text.contains("vgpu_gpu_utilization_ratio{device=\"0\"} 0.4"),
        "{text}"
    );
    let names = defs::metric_names();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(
            names.iter().any(|n| n == name),
            "{name} is not in defs::ALL"
        );
    }
}

/// The reference table of docs/metrics.md, from [`defs::ALL`].
fn docs_table() -> String {
    let mut t = String::from(
        "| metric | type | unit | labels | meaning | source in the model |\n|---|---|---|---|---|---|\n",
    );
    for d in defs::ALL {
        let kind = match d.kind {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        };
        let names = d.series_names().join("`, `");
        t.push_str(&format!(
            "| `{names}` | {kind} | {} | {} | {} | {} |\n",
            d.unit.map_or("-", Unit::as_str),
            defs::label_names(d).join(", "),
            if d.per_process {
                format!("{} (opt-in)", d.help)
            } else {
                d.help.to_owned()
            }
            .replace('|', "\\|"),
            d.source.replace('|', "\\|"),
        ));
    }
    t
}

/// docs/metrics.md holds the table generated from the code (`VGPU_BLESS=1` rewrites it).
#[test]
fn docs_list_every_metric() {
    const BEGIN: &str = "<!-- metrics table: generated from agent/src/export/defs.rs -->\n";
    const END: &str = "<!-- end of metrics table -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let (head, rest) = doc.split_once(BEGIN).expect("table start marker");
    let (_, tail) = rest.split_once(END).expect("table end marker");
    let want = format!("{head}{BEGIN}{}{END}{tail}", docs_table());
    if std::env::var_os("VGPU_BLESS").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    assert!(
        doc == want,
        "docs/metrics.md is out of date: run with VGPU_BLESS=1"
    );
}

/// The scrape benchmark (docs/benchmarks.md): a model of 100 containers x 40 APIs. Per refresh:
/// the time to fold a snapshot in and to encode the body; per scrape: an HTTP GET of the body
/// as Prometheus asks for it (OpenMetrics, gzip) and uncompressed; p50/p99 of 200 rounds, each a
/// refresh then one scrape of each kind (so every gzip scrape compresses a new body).
/// `cargo test --release -p vgpu-agent --bin vgpu-agent scrape_benchmark -- --ignored --nocapture`
#[test]
#[ignore = "a benchmark: run it in release mode"]
fn scrape_benchmark() {
    use std::{
        io::{Read, Write},
        time::Instant,
    };
    let snap = synthetic(100, 40);
    let mut v = view();
    let latest = Arc::new(Latest::default());
    let addr =
        crate::export::http::serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&latest)).unwrap();
    let pct = |xs: &mut Vec<f64>, q: f64| {
        xs.sort_by(f64::total_cmp);
        xs[((xs.len() - 1) as f64 * q).round() as usize]
    };
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
    let (mut size, mut gz_size) = (0, 0);
    for _ in 0..200 {
        let t = Instant::now();
        let e = v.update(&snap);
        fold.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let body = Body::encode(&e);
        encode.push(t.elapsed().as_secs_f64() * 1e3);
        latest.set(body);
        let (ms, n) = scrape("Accept-Encoding: gzip\r\n");
        gzip.push(ms);
        gz_size = n;
        let (ms, n) = scrape("");
        plain.push(ms);
        size = n;
    }
    let series = snap.processes.len() * 40;
    let fig = |xs: &mut Vec<f64>| format!("{:.2}, {:.2}", pct(xs, 0.5), pct(xs, 0.99));
    let (f, e, g, p) = (
        fig(&mut fold),
        fig(&mut encode),
        fig(&mut gzip),
        fig(&mut plain),
    );
    println!(
        "scrape-bench: {{\"containers\": 100, \"apis\": 40, \"api_series\": {series}, \"bytes\": {size}, \
         \"gzip_bytes\": {gz_size}, \"fold_p50_p99_ms\": [{f}], \"encode_p50_p99_ms\": [{e}], \
         \"scrape_gzip_p50_p99_ms\": [{g}], \"scrape_plain_p50_p99_ms\": [{p}], \"target_50ms_met\": {}}}",
        pct(&mut gzip, 0.99) < 50.0 && pct(&mut plain, 0.99) < 50.0
    );
    assert!(size > 1 << 20, "the scrape returned the whole exposition");
    assert!(
        gz_size > 1 << 10 && gz_size < size / 4,
        "gzip: {gz_size} of {size}"
    );
}
