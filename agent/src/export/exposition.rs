//! What `/metrics` is made of: families of samples with their labels, and the counters they
//! are built from. The metrics view folds snapshots into these; the family builders and the
//! encoders read them.

use std::{collections::BTreeMap, sync::Arc};

use super::defs::{self, Def};
use crate::model::{Source, api_sums::ApiCounts};

/// (container, pod, namespace) label values.
pub(super) type ContainerLabels = [String; 3];

/// (api, kind, source): `api` is empty unless per API, `kind` a [`defs::KINDS`] label; names are
/// interned (by the metrics view): a key is cloned for every process and series at every refresh.
pub(super) type ApiKey = (Arc<str>, &'static str, &'static str);

/// Cumulative figures of one container.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Counters {
    pub(super) apis: BTreeMap<ApiKey, ApiCounts>,
    pub(super) throttled_ns: u64,
    /// What the probes' hits cost the processes (`Process::probe_seconds`), ns.
    pub(super) probe_ns: u64,
    /// What the probes could not record (`Process::probe_losses`), by [`LOSS_REASONS`].
    pub(super) losses: [u64; 3],
}

/// The reasons of `vgpu_container_probe_losses_total`, in the order of [`Counters::losses`].
pub(super) const LOSS_REASONS: [&str; 3] =
    ["allocation_untracked", "call_unaggregated", "row_reset"];

impl Counters {
    pub(super) fn add(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            match self.apis.get_mut(k) {
                Some(mine) => mine.add(t),
                None => {
                    self.apis.insert(k.clone(), t.clone());
                }
            }
        }
        self.throttled_ns += o.throttled_ns;
        self.probe_ns += o.probe_ns;
        for (a, b) in self.losses.iter_mut().zip(o.losses) {
            *a += b;
        }
    }

    pub(super) fn max_with(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            match self.apis.get_mut(k) {
                Some(mine) => mine.max_with(t),
                None => {
                    self.apis.insert(k.clone(), t.clone());
                }
            }
        }
        self.throttled_ns = self.throttled_ns.max(o.throttled_ns);
        self.probe_ns = self.probe_ns.max(o.probe_ns);
        for (a, b) in self.losses.iter_mut().zip(o.losses) {
            *a = (*a).max(b);
        }
    }
}

pub(super) fn source_name(s: Source) -> &'static str {
    match s {
        Source::Probes => "probes",
        Source::Limiter => "limiter",
    }
}

/// One sample: label values in the order of [`FamilyData::names`], and a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    /// Sum (seconds), count, and per-bucket counts with their upper bounds (last: +Inf).
    Histogram(f64, u64, Vec<(f64, u64)>),
}

/// Label values, shared by the families that carry the same series (calls, errors, latency...).
pub type Labels = Arc<[String]>;

#[derive(Clone, Debug)]
pub struct FamilyData {
    pub def: &'static Def,
    /// The label names, as [`defs::labels_in`] gives them for the mode.
    pub names: Vec<&'static str>,
    pub samples: Vec<(Labels, Value)>,
}

impl FamilyData {
    /// A family whose labels do not depend on `--metrics-per-api`.
    pub fn of(def: &'static Def, samples: Vec<(Vec<String>, Value)>) -> FamilyData {
        debug_assert!(!def.labels.contains(&defs::API_LABEL), "{}", def.base);
        FamilyData::new(
            def,
            false,
            samples.into_iter().map(|(l, v)| (l.into(), v)).collect(),
        )
    }

    pub fn new(def: &'static Def, per_api: bool, samples: Vec<(Labels, Value)>) -> FamilyData {
        FamilyData {
            def,
            names: defs::labels_in(def, per_api),
            samples,
        }
    }
}

/// What one scrape encodes.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub families: Vec<FamilyData>,
    /// When the snapshot behind it was taken (Unix ms), for the age a scrape reports.
    pub taken_at_unix_ms: Option<u64>,
}

impl Exposition {
    /// The samples of a family.
    #[cfg(test)]
    pub fn family(&self, def: &Def) -> &[(Labels, Value)] {
        self.families
            .iter()
            .find(|f| f.def.base == def.base)
            .map_or(&[], |f| &f.samples)
    }
}

/// Span pipeline counters, shared with the OTLP exporter.
#[derive(Debug, Default)]
pub struct SpanCounters {
    pub exported: std::sync::atomic::AtomicU64,
    pub queue_full: std::sync::atomic::AtomicU64,
    /// Spans over their container's rate for their kind (`--trace-container-rate`,
    /// `--trace-container-event-rate`).
    pub container_rate: std::sync::atomic::AtomicU64,
    pub export_failed: std::sync::atomic::AtomicU64,
    /// Spans dropped per (container key, span kind, reason); at most [`SPAN_DROP_KEYS`] keys,
    /// the rest counted under the container key `other`.
    by_container: std::sync::Mutex<BTreeMap<SpanDropKey, u64>>,
}

/// (container key, span kind: `nccl`, `slow` or `rate`, reason: `container_rate` or
/// `queue_full`).
pub type SpanDropKey = (String, &'static str, &'static str);

/// Per-container span drop series kept at most (a container's series stay once seen, so that
/// its counters never vanish and come back).
pub const SPAN_DROP_KEYS: usize = 3 * 2 * super::sampling::MAX_CONTAINERS;

impl SpanCounters {
    /// Counts a span of `container` (its key) dropped.
    pub fn count_container_drop(&self, container: &str, kind: &'static str, reason: &'static str) {
        let mut m = self.by_container.lock().unwrap_or_else(|p| p.into_inner());
        let key = (container.to_owned(), kind, reason);
        let key = if m.contains_key(&key) || m.len() < SPAN_DROP_KEYS {
            key
        } else {
            ("other".to_owned(), kind, reason)
        };
        *m.entry(key).or_default() += 1;
    }

    /// Spans dropped per (container key, kind, reason), cumulative.
    pub fn container_drops(&self) -> BTreeMap<SpanDropKey, u64> {
        self.by_container
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
