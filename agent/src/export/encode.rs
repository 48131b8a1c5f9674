//! Encoding an [`Exposition`] as OpenMetrics text with prometheus-client.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit as PcUnit},
};

use super::{
    defs::{self, Type, Unit},
    metrics::{Exposition, FamilyData, Value},
};

/// The latest exposition, encoded at each scrape by prometheus-client.
#[derive(Debug, Default)]
pub struct SharedExposition(pub Mutex<Arc<Exposition>>);

impl Collector for SharedExposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let expo = self.0.lock().map(|g| Arc::clone(&g)).unwrap_or_default();
        for fam in &expo.families {
            encode_family(&mut encoder, fam)?;
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

fn encode_family(enc: &mut DescriptorEncoder, fam: &FamilyData) -> Result<(), std::fmt::Error> {
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

/// A registry whose only collector is `shared`.
pub fn registry(shared: Arc<SharedExposition>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(shared));
    r
}

/// Encodes the registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut s = String::with_capacity(64 << 10);
    prometheus_client::encoding::text::encode(&mut s, registry)?;
    Ok(s)
}
