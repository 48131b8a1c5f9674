//! The encoder against the reference: prometheus-client encoding the same families.

use std::io::Read;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit as PcUnit},
};

use super::*;
use crate::export::{
    defs::Unit,
    metrics::{MetricsOptions, MetricsView, SpanCounters},
};

/// One exposition, encoded by prometheus-client.
#[derive(Debug)]
struct Reference(Exposition);

impl Collector for Reference {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for fam in &self.0.families {
            reference_family(&mut encoder, fam)?;
        }
        Ok(())
    }
}

fn pc_unit(u: Unit) -> PcUnit {
    match u {
        Unit::Seconds => PcUnit::Seconds,
        Unit::Bytes => PcUnit::Bytes,
        // Prometheus names shares `_ratio` (prometheus-client says `ratios`).
        Unit::Ratio => PcUnit::Other("ratio".into()),
    }
}

fn reference_family(enc: &mut DescriptorEncoder, fam: &FamilyData) -> Result<(), std::fmt::Error> {
    let def = fam.def;
    let unit = def.unit.map(pc_unit);
    let mtype = match def.kind {
        Type::Counter => MetricType::Counter,
        Type::Gauge => MetricType::Gauge,
        Type::Histogram => MetricType::Histogram,
    };
    let names = defs::label_names(def);
    let mut m = enc.encode_descriptor(def.base, def.help, unit.as_ref(), mtype)?;
    for (values, v) in &fam.samples {
        let labels: Vec<(&str, &str)> = names
            .iter()
            .copied()
            .zip(values.iter().map(String::as_str))
            .collect();
        let mut s = m.encode_family(&labels)?;
        match (def.kind, v) {
            (Type::Counter, Value::Int(n)) => s.encode_counter::<NoLabelSet, _, u64>(n, None)?,
            (Type::Counter, Value::Float(x)) => s.encode_counter::<NoLabelSet, _, f64>(x, None)?,
            (Type::Gauge, Value::Int(n)) => s.encode_gauge(&(*n as i64))?,
            (Type::Gauge, Value::Float(x)) => s.encode_gauge(x)?,
            (_, Value::Histogram(sum, count, buckets)) => {
                s.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
            }
            _ => return Err(std::fmt::Error),
        }
    }
    Ok(())
}

/// What prometheus-client writes for an exposition (OpenMetrics text).
pub(crate) fn reference(e: &Exposition) -> String {
    let mut r = Registry::default();
    r.register_collector(Box::new(Reference(e.clone())));
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
    s
}

/// OpenMetrics text to the Prometheus text format 0.0.4, line by line: counters' `# HELP` and
/// `# TYPE` name the `_total` series; `# UNIT` and `# EOF` go.
fn to_prometheus_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::new();
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|r| r.strip_suffix(" counter"))
        {
            out.push_str(&format!("# TYPE {name}_total counter\n"));
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let total = if counters.contains(name) {
                "_total"
            } else {
                ""
            };
            out.push_str(&format!("# HELP {name}{total} {help}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A model with every family: 3 containers, a region, a GPU, agent figures, odd label values.
fn exposition() -> Exposition {
    use crate::model::{GpuDevice, RegionDevice, RegionInfo};
    let mut s = crate::export::metrics::tests::synthetic(3, 5);
    s.agent.events_lost = [("stack_full".to_owned(), 2)].into();
    // A label value that needs escaping.
    s.containers[1].name = "ml/pod-1/we\"ird\\na\nme".into();
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
    s.gpus.push(GpuDevice {
        index: 0,
        uuid: Some("GPU-1".into()),
        name: Some("H200".into()),
        utilization_pct: Some(40),
        memory_used: Some(1 << 30),
        memory_total: Some(141 << 30),
        power_mw: None,
        temperature_c: None,
    });
    let mut v = MetricsView::new(
        MetricsOptions { pid_labels: true },
        Arc::new(SpanCounters::default()),
    );
    v.update(&s)
}

#[test]
fn openmetrics_is_what_prometheus_client_writes_byte_for_byte() {
    let e = exposition();
    let body = Body::encode(&e);
    let want = reference(&e);
    let got = body.text(Format::OpenMetrics);
    assert!(want.contains("we\\\"ird\\\\na\\nme"), "{want}");
    assert!(want.contains("vgpu_api_latency_seconds_bucket{le=\"+Inf\",container="));
    assert!(want.contains("vgpu_agent_probes_up{} 1\n"), "{want}");
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {i}");
    }
    assert_eq!(got, want);
    assert_eq!(body.len(Format::OpenMetrics), want.len());
}

#[test]
fn text_format_differs_only_in_the_heads() {
    let e = exposition();
    let body = Body::encode(&e);
    let want = to_prometheus_text(&reference(&e));
    assert_eq!(body.text(Format::Text), want);
    assert_eq!(body.len(Format::Text), want.len());
    assert!(want.contains("# TYPE vgpu_api_calls_total counter\n"));
    assert!(!want.contains("# UNIT") && !want.contains("# EOF"));
}

#[test]
fn gzip_holds_the_same_text_and_is_made_once() {
    let body = Body::encode(&exposition());
    for f in [Format::OpenMetrics, Format::Text] {
        let gz = body.gzipped(f);
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, body.text(f));
        assert!(gz.len() < text.len() / 3, "{} of {}", gz.len(), text.len());
        assert!(std::ptr::eq(gz, body.gzipped(f)), "kept, not made again");
    }
}

#[test]
fn an_empty_body_is_a_valid_exposition() {
    let b = Body::default();
    assert_eq!(b.text(Format::OpenMetrics), "# EOF\n");
    assert_eq!(b.text(Format::Text), "");
}
