//! `/metrics`: a view of the model. Each refresh folds the latest [`Snapshot`] into per-container
//! aggregates ([`MetricsView::update`]), turns them into families ([`super::families`]; listed in
//! [`super::defs`]) and encodes them once ([`super::encode`]); scrapes share that body.
//!
//! **Per kind unless asked.** A container's API figures are folded per (kind, source) by default
//! and per (API, kind, source) with [`MetricsOptions::per_api`]: 7 kinds instead of up to 80 APIs
//! per container, which is what a fleet's Prometheus can afford (docs/metrics.md gives the
//! series counts and body sizes).
//!
//! **Counters stay monotonic per container.** The model's counters are per process (probes: since
//! attach; limiter: since the process started), and a process leaves the model some time after it
//! exits. The view keeps, per container and series, the last-known values of processes that left
//! the model and adds them to the live ones; and it never publishes a value below the one it
//! published before for the same series (a process whose counters went back, e.g. one whose
//! limiter slot was reclaimed, cannot make a container's counter go back and fake a reset).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{
    defs::{self, Def},
    families,
};
use crate::model::{ApiCounts, Container, Process, ProcessKey, Snapshot, Source};

#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsOptions {
    /// Per-process series (pid, comm labels) too.
    pub pid_labels: bool,
    /// API series per API (`api` label) and latency histograms per container and API, instead
    /// of per kind.
    pub per_api: bool,
}

/// (container, pod, namespace) label values.
pub(super) type ContainerLabels = [String; 3];

/// (api, kind, source): `api` is empty unless per API, `kind` a [`defs::KINDS`] label; names are
/// interned ([`Names`]): a key is cloned for every process and series at every refresh.
pub(super) type ApiKey = (Arc<str>, &'static str, &'static str);

/// API and kind names seen, shared by every key that names them (bounded by the API table).
#[derive(Default)]
struct Names(HashMap<String, Arc<str>>);

impl Names {
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return Arc::clone(a);
        }
        let a: Arc<str> = s.into();
        self.0.insert(s.to_owned(), Arc::clone(&a));
        a
    }
}

/// Cumulative figures of one container.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Counters {
    pub(super) apis: BTreeMap<ApiKey, ApiCounts>,
    pub(super) throttled_ns: u64,
    /// What the probes could not record (`Process::probe_losses`), by [`LOSS_REASONS`].
    pub(super) losses: [u64; 3],
}

/// The reasons of `vgpu_container_probe_losses_total`, in the order of [`Counters::losses`].
pub(super) const LOSS_REASONS: [&str; 3] =
    ["allocation_untracked", "call_unaggregated", "row_reset"];

impl Counters {
    fn add(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            match self.apis.get_mut(k) {
                Some(mine) => mine.add(t),
                None => {
                    self.apis.insert(k.clone(), t.clone());
                }
            }
        }
        self.throttled_ns += o.throttled_ns;
        for (a, b) in self.losses.iter_mut().zip(o.losses) {
            *a += b;
        }
    }

    fn max_with(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            match self.apis.get_mut(k) {
                Some(mine) => mine.max_with(t),
                None => {
                    self.apis.insert(k.clone(), t.clone());
                }
            }
        }
        self.throttled_ns = self.throttled_ns.max(o.throttled_ns);
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

/// A process's own counters (one source per API: [`Process::effective_apis`]), per API or per
/// kind.
fn process_counters(p: &Process, names: &mut Names, per_api: bool) -> Counters {
    let no_api = names.get("");
    let mut c = Counters {
        apis: p.effective_counts_by(|a| {
            let api = if per_api {
                names.get(&a.api)
            } else {
                Arc::clone(&no_api)
            };
            (api, defs::kind_label(&a.kind), source_name(a.source))
        }),
        ..Counters::default()
    };
    c.throttled_ns = p.limiter.as_ref().map_or(0, |l| l.throttled_ns);
    let l = &p.probe_losses;
    c.losses = [l.allocations_untracked, l.calls_unaggregated, l.rows_reset];
    c
}

fn container_labels(c: Option<&Container>, key: &str) -> ContainerLabels {
    let Some(c) = c else {
        return [key.to_owned(), String::new(), String::new()];
    };
    // Kubernetes names are `namespace/pod/container`: the container label is the last part.
    let name = match &c.pod_name {
        Some(_) => c.name.rsplit('/').next().unwrap_or(&c.name).to_owned(),
        None => c.name.clone(),
    };
    [
        name,
        c.pod_name.clone().unwrap_or_default(),
        c.namespace.clone().unwrap_or_default(),
    ]
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

/// The state kept between refreshes.
#[derive(Default)]
pub struct MetricsView {
    opts: MetricsOptions,
    /// Last-known counters and container of every process in the previous snapshot.
    last: HashMap<ProcessKey, (ContainerLabels, Counters)>,
    names: Names,
    /// Sum of the last-known counters of processes that left the model, per container.
    departed: BTreeMap<ContainerLabels, Counters>,
    /// What was published last, per container (the monotonic floor).
    published: BTreeMap<ContainerLabels, Counters>,
    /// Region denial counters published last, per (container, device) (monotonic floor).
    denied_published: BTreeMap<(ContainerLabels, u32), u64>,
    spans: Arc<SpanCounters>,
}

impl MetricsView {
    pub fn new(opts: MetricsOptions, spans: Arc<SpanCounters>) -> MetricsView {
        MetricsView {
            opts,
            spans,
            ..Default::default()
        }
    }

    /// Folds a snapshot in and returns what a scrape shows now.
    pub fn update(&mut self, snap: &Snapshot) -> Exposition {
        let containers: HashMap<&str, &Container> = snap
            .containers
            .iter()
            .map(|c| (c.key.as_str(), c))
            .collect();
        let labels_of = |key: &str| container_labels(containers.get(key).copied(), key);

        // Processes that left the model: their last values join their container's history.
        let present: std::collections::HashSet<ProcessKey> =
            snap.processes.iter().map(|p| p.key).collect();
        let gone: Vec<ProcessKey> = self
            .last
            .keys()
            .filter(|k| !present.contains(k))
            .copied()
            .collect();
        for k in gone {
            if let Some((labels, counters)) = self.last.remove(&k) {
                self.departed.entry(labels).or_default().add(&counters);
            }
        }

        let mut now: BTreeMap<ContainerLabels, Counters> = self.departed.clone();
        for p in &snap.processes {
            let labels = labels_of(&p.container);
            let c = process_counters(p, &mut self.names, self.opts.per_api);
            now.entry(labels.clone()).or_default().add(&c);
            self.last.insert(p.key, (labels, c));
        }
        for (labels, c) in now.iter_mut() {
            if let Some(prev) = self.published.get(labels) {
                c.max_with(prev);
            }
        }
        // Containers seen before keep their series (a counter must not vanish and come back).
        for (labels, prev) in &self.published {
            now.entry(labels.clone()).or_insert_with(|| prev.clone());
        }
        self.published = now;

        let mut out = Exposition {
            families: vec![],
            taken_at_unix_ms: Some(snap.taken_at_unix_ms),
        };
        families::container_gauges(snap, &labels_of, &mut self.denied_published, &mut out);
        families::api_families(&self.published, self.opts.per_api, &mut out);
        families::probe_losses(snap, &self.published, &labels_of, &mut out);
        families::api_estimated(snap, &labels_of, &mut out);
        families::gpu_and_agent(snap, &self.spans, &mut out);
        families::container_span_drops(&self.spans, &labels_of, &mut out);
        super::gpu_use::families(snap, &labels_of, &mut out);
        if self.opts.pid_labels {
            families::per_process(snap, &labels_of, self.opts.per_api, &mut out);
        }
        out
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
pub(super) mod tests;

#[cfg(test)]
#[path = "scrape_bench.rs"]
mod scrape_bench;
