//! `/metrics`: a view of the model. Each refresh folds the latest [`Snapshot`] into per-container
//! aggregates ([`MetricsView::update`]); each scrape encodes the latest aggregates with
//! prometheus-client (OpenMetrics text). The families are listed in [`super::defs`].
//!
//! **Counters stay monotonic per container.** The model's counters are per process (probes: since
//! attach; limiter: since the process started), and a process leaves the model some time after it
//! exits. The view keeps, per container and series, the last-known values of processes that left
//! the model and adds them to the live ones; and it never publishes a value below the one it
//! published before for the same series (a process whose counters went back, e.g. one whose
//! limiter slot was reclaimed, cannot make a container's counter go back and fake a reset).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use agent_common::hist::HIST_BUCKETS;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit as PcUnit},
};

use super::defs::{self, Def, Type, Unit};
use crate::model::{ApiUsage, Container, Process, ProcessKey, Snapshot, Source};

#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsOptions {
    /// Per-process series (pid, comm labels) too.
    pub pid_labels: bool,
}

/// (container, pod, namespace) label values.
type ContainerLabels = [String; 3];

/// (api, kind, source).
type ApiKey = (String, String, &'static str);

#[derive(Clone, Debug, PartialEq)]
struct Totals {
    calls: u64,
    errors: u64,
    bytes: u64,
    total_ns: u64,
    hook_ns: u64,
    denied: u64,
    hist: [u64; HIST_BUCKETS],
}

impl Default for Totals {
    fn default() -> Totals {
        Totals {
            calls: 0,
            errors: 0,
            bytes: 0,
            total_ns: 0,
            hook_ns: 0,
            denied: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

impl Totals {
    fn add(&mut self, a: &ApiUsage) {
        self.calls += a.calls;
        self.errors += a.errors;
        self.bytes += a.bytes;
        self.total_ns += a.total_ns;
        self.hook_ns += a.hook_ns;
        self.denied += a.denied;
        for (d, s) in self.hist.iter_mut().zip(&a.hist) {
            *d += s;
        }
    }

    fn add_totals(&mut self, o: &Totals) {
        self.calls += o.calls;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.total_ns += o.total_ns;
        self.hook_ns += o.hook_ns;
        self.denied += o.denied;
        for (d, s) in self.hist.iter_mut().zip(&o.hist) {
            *d += s;
        }
    }

    /// Element-wise maximum (the monotonic floor).
    fn max_with(&mut self, o: &Totals) {
        self.calls = self.calls.max(o.calls);
        self.errors = self.errors.max(o.errors);
        self.bytes = self.bytes.max(o.bytes);
        self.total_ns = self.total_ns.max(o.total_ns);
        self.hook_ns = self.hook_ns.max(o.hook_ns);
        self.denied = self.denied.max(o.denied);
        for (d, s) in self.hist.iter_mut().zip(&o.hist) {
            *d = (*d).max(*s);
        }
    }
}

/// Cumulative figures of one container.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counters {
    apis: BTreeMap<ApiKey, Totals>,
    throttled_ns: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            self.apis.entry(k.clone()).or_default().add_totals(t);
        }
        self.throttled_ns += o.throttled_ns;
    }

    fn max_with(&mut self, o: &Counters) {
        for (k, t) in &o.apis {
            self.apis.entry(k.clone()).or_default().max_with(t);
        }
        self.throttled_ns = self.throttled_ns.max(o.throttled_ns);
    }
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::Probes => "probes",
        Source::Limiter => "limiter",
    }
}

/// A process's own counters (one source per API: [`Process::effective_apis`]).
fn process_counters(p: &Process) -> Counters {
    let mut c = Counters::default();
    for a in p.effective_apis() {
        c.apis
            .entry((a.api.clone(), a.kind.clone(), source_name(a.source)))
            .or_default()
            .add(a);
    }
    c.throttled_ns = p.limiter.as_ref().map_or(0, |l| l.throttled_ns);
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

/// One sample: label values in the order of [`defs::label_names`], and a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    /// Sum (seconds), count, and per-bucket counts with their upper bounds (last: +Inf).
    Histogram(f64, u64, Vec<(f64, u64)>),
}

#[derive(Clone, Debug)]
pub struct FamilyData {
    pub def: &'static Def,
    pub samples: Vec<(Vec<String>, Value)>,
}

/// What one scrape encodes.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    pub families: Vec<FamilyData>,
}

impl Exposition {
    /// The samples of a family.
    #[cfg(test)]
    pub fn family(&self, def: &Def) -> &[(Vec<String>, Value)] {
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
    pub export_failed: std::sync::atomic::AtomicU64,
}

/// The state kept between refreshes.
#[derive(Default)]
pub struct MetricsView {
    opts: MetricsOptions,
    /// Last-known counters and container of every process in the previous snapshot.
    last: HashMap<ProcessKey, (ContainerLabels, Counters)>,
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
            let c = process_counters(p);
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

        let mut out = Exposition::default();
        self.container_gauges(snap, &labels_of, &mut out);
        self.api_families(&mut out);
        gpu_and_agent(snap, &self.spans, &mut out);
        if self.opts.pid_labels {
            per_process(snap, &labels_of, &mut out);
        }
        out
    }

    fn container_gauges(
        &mut self,
        snap: &Snapshot,
        labels_of: &dyn Fn(&str) -> ContainerLabels,
        out: &mut Exposition,
    ) {
        let mut used: BTreeMap<(ContainerLabels, String, &str), u64> = BTreeMap::new();
        let mut allocations: BTreeMap<ContainerLabels, u64> = BTreeMap::new();
        let mut procs: BTreeMap<ContainerLabels, u64> = BTreeMap::new();
        let mut drift: BTreeMap<(ContainerLabels, String), u64> = BTreeMap::new();
        let mut comms: BTreeMap<ContainerLabels, u64> = BTreeMap::new();
        for p in snap.processes.iter().filter(|p| p.alive) {
            let l = labels_of(&p.container);
            *procs.entry(l.clone()).or_default() += 1;
            if let Some(lim) = &p.limiter {
                for (dev, held) in lim.held.iter().enumerate() {
                    *used
                        .entry((l.clone(), dev.to_string(), "limiter"))
                        .or_default() += held;
                }
            }
            for n in &p.nvml {
                if let Some(b) = n.used_memory {
                    *used
                        .entry((l.clone(), n.device.to_string(), "nvml"))
                        .or_default() += b;
                }
            }
            if let Some(b) = p.memory.probes {
                *used
                    .entry((l.clone(), String::new(), "probes"))
                    .or_default() += b;
            }
            if let Some(n) = p.memory.probes_allocations {
                *allocations.entry(l.clone()).or_default() += n;
            }
            if let Some(d) = &p.memory.drift {
                let e = drift.entry((l.clone(), d.between.clone())).or_default();
                *e = (*e).max(d.bytes);
            }
            let live = p.communicators.iter().filter(|c| !c.destroyed).count() as u64;
            *comms.entry(l).or_default() += live;
        }
        let lv = |l: &ContainerLabels, extra: &[&str]| -> Vec<String> {
            l.iter()
                .cloned()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect()
        };
        let mut fam = |def: &'static Def, samples: Vec<(Vec<String>, Value)>| {
            out.families.push(FamilyData { def, samples });
        };
        fam(
            &defs::CONTAINER_MEMORY_USED,
            used.iter()
                .map(|((l, dev, view), b)| (lv(l, &[dev, view]), Value::Int(*b)))
                .collect(),
        );
        let (mut limit, mut reserved, mut sm, mut denied) = (vec![], vec![], vec![], vec![]);
        for c in &snap.containers {
            let l = labels_of(&c.key);
            for r in &c.regions {
                for d in &r.devices {
                    let labels = lv(&l, &[&d.index.to_string()]);
                    if d.memory_limit > 0 {
                        limit.push((labels.clone(), Value::Int(d.memory_limit)));
                    }
                    if d.sm_limit_pct > 0 && d.sm_limit_pct < 100 {
                        sm.push((
                            labels.clone(),
                            Value::Float(f64::from(d.sm_limit_pct) / 100.0),
                        ));
                    }
                    reserved.push((labels.clone(), Value::Int(d.reserved)));
                    let floor = self
                        .denied_published
                        .entry((l.clone(), d.index))
                        .or_default();
                    *floor = (*floor).max(d.denied);
                    denied.push((labels, Value::Int(*floor)));
                }
            }
        }
        for v in [&mut limit, &mut reserved, &mut sm, &mut denied] {
            dedup_sum(v);
        }
        fam(&defs::CONTAINER_MEMORY_LIMIT, limit);
        fam(&defs::CONTAINER_MEMORY_RESERVED, reserved);
        fam(&defs::CONTAINER_SM_LIMIT, sm);
        fam(&defs::CONTAINER_DENIED, denied);
        fam(
            &defs::CONTAINER_ALLOCATIONS,
            allocations
                .iter()
                .map(|(l, n)| (lv(l, &[]), Value::Int(*n)))
                .collect(),
        );
        fam(
            &defs::CONTAINER_PROCESSES,
            procs
                .iter()
                .map(|(l, n)| (lv(l, &[]), Value::Int(*n)))
                .collect(),
        );
        fam(
            &defs::CONTAINER_DRIFT,
            drift
                .iter()
                .map(|((l, b), n)| (lv(l, &[b]), Value::Int(*n)))
                .collect(),
        );
        fam(
            &defs::NCCL_COMMUNICATORS,
            comms
                .iter()
                .map(|(l, n)| (lv(l, &[]), Value::Int(*n)))
                .collect(),
        );
    }

    fn api_families(&self, out: &mut Exposition) {
        let mut calls = vec![];
        let mut errors = vec![];
        let mut bytes = vec![];
        let mut latency = vec![];
        let mut hook = vec![];
        let mut denied = vec![];
        let mut sync = vec![];
        let mut throttled = vec![];
        for (l, c) in &self.published {
            let mut sync_ns = 0u64;
            for ((api, kind, source), t) in &c.apis {
                let labels: Vec<String> = l
                    .iter()
                    .cloned()
                    .chain([api.clone(), kind.clone(), source.to_string()])
                    .collect();
                calls.push((labels.clone(), Value::Int(t.calls)));
                errors.push((labels.clone(), Value::Int(t.errors)));
                if t.bytes > 0 {
                    bytes.push((labels.clone(), Value::Int(t.bytes)));
                }
                if *source == "limiter" {
                    hook.push((labels.clone(), Value::Float(ns_to_s(t.hook_ns))));
                    denied.push((labels.clone(), Value::Int(t.denied)));
                }
                if kind == "sync" {
                    sync_ns += t.total_ns;
                }
                latency.push((labels, histogram(t)));
            }
            sync.push((l.to_vec(), Value::Float(ns_to_s(sync_ns))));
            throttled.push((l.to_vec(), Value::Float(ns_to_s(c.throttled_ns))));
        }
        for (def, s) in [
            (&defs::API_CALLS, calls),
            (&defs::API_ERRORS, errors),
            (&defs::API_BYTES, bytes),
            (&defs::API_LATENCY, latency),
            (&defs::API_HOOK, hook),
            (&defs::API_DENIED, denied),
            (&defs::SYNC, sync),
            (&defs::THROTTLED, throttled),
        ] {
            out.families.push(FamilyData { def, samples: s });
        }
    }
}

/// Several regions of one container name the same device: their figures add up.
fn dedup_sum(v: &mut Vec<(Vec<String>, Value)>) {
    let mut m: BTreeMap<Vec<String>, Value> = BTreeMap::new();
    for (k, val) in v.drain(..) {
        match (m.get_mut(&k), &val) {
            (Some(Value::Int(a)), Value::Int(b)) => *a += b,
            (Some(Value::Float(a)), Value::Float(b)) => *a = a.max(*b),
            _ => {
                m.insert(k, val);
            }
        }
    }
    v.extend(m);
}

fn ns_to_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The log2 histogram as Prometheus buckets: `le = 2^k ns` for the exponents of
/// [`defs::LATENCY_BUCKET_EXPONENTS`] (source bucket `i` holds `[2^i, 2^(i+1))` ns, so it
/// counts under `le = 2^(i+1)`), the rest under +Inf.
fn histogram(t: &Totals) -> Value {
    let range = defs::LATENCY_BUCKET_EXPONENTS;
    let mut buckets = Vec::with_capacity(range.clone().count() + 1);
    let mut i = 0;
    for k in range {
        let mut n = 0;
        while i < k && i < HIST_BUCKETS {
            n += t.hist[i];
            i += 1;
        }
        buckets.push(((1u64 << k) as f64 / 1e9, n));
    }
    let rest: u64 = t.hist[i.min(HIST_BUCKETS)..].iter().sum();
    buckets.push((f64::INFINITY, rest));
    let count = t.hist.iter().sum();
    Value::Histogram(ns_to_s(t.total_ns), count, buckets)
}

fn gpu_and_agent(snap: &Snapshot, spans: &SpanCounters, out: &mut Exposition) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut fam = |def: &'static Def, samples: Vec<(Vec<String>, Value)>| {
        out.families.push(FamilyData { def, samples });
    };
    let per_gpu = |f: &dyn Fn(&crate::model::GpuDevice) -> Option<Value>| {
        snap.gpus
            .iter()
            .filter_map(|g| Some((vec![g.index.to_string()], f(g)?)))
            .collect::<Vec<_>>()
    };
    fam(
        &defs::GPU_MEMORY_USED,
        per_gpu(&|g| g.memory_used.map(Value::Int)),
    );
    fam(
        &defs::GPU_MEMORY_TOTAL,
        per_gpu(&|g| g.memory_total.map(Value::Int)),
    );
    fam(
        &defs::GPU_UTILIZATION,
        per_gpu(&|g| {
            g.utilization_pct
                .map(|u| Value::Float(f64::from(u) / 100.0))
        }),
    );
    fam(
        &defs::GPU_INFO,
        snap.gpus
            .iter()
            .map(|g| {
                let labels = vec![
                    g.index.to_string(),
                    g.uuid.clone().unwrap_or_default(),
                    g.name.clone().unwrap_or_default(),
                ];
                (labels, Value::Int(1))
            })
            .collect(),
    );
    let a = &snap.agent;
    let one = |v: Value| vec![(vec![], v)];
    fam(
        &defs::AGENT_UP,
        one(Value::Int(u64::from(a.probes_unavailable.is_none()))),
    );
    let attached: usize = a.libraries.iter().map(|l| l.symbols_attached).sum();
    fam(&defs::AGENT_PROBES, one(Value::Int(attached as u64)));
    fam(
        &defs::AGENT_LIBRARIES,
        one(Value::Int(a.libraries.len() as u64)),
    );
    fam(
        &defs::AGENT_PROBE_COST,
        a.probe_cost
            .as_ref()
            .map(|c| one(Value::Float(c.per_hit_ns / 1e9)))
            .unwrap_or_default(),
    );
    fam(
        &defs::AGENT_LAUNCH_PROBE,
        one(Value::Float(a.launch_probe_seconds)),
    );
    fam(
        &defs::AGENT_EVENTS_LOST,
        a.events_lost
            .iter()
            .map(|(k, v)| (vec![k.clone()], Value::Int(*v)))
            .collect(),
    );
    fam(&defs::AGENT_REGIONS, one(Value::Int(a.regions_read as u64)));
    fam(
        &defs::AGENT_REGION_ERRORS,
        one(Value::Int(a.region_errors as u64)),
    );
    fam(
        &defs::AGENT_MAP_ENTRIES,
        a.map_entries
            .iter()
            .map(|(k, v)| (vec![k.clone()], Value::Int(*v as u64)))
            .collect(),
    );
    fam(
        &defs::AGENT_WARNINGS,
        one(Value::Int(a.warnings.len() as u64)),
    );
    fam(
        &defs::AGENT_SNAPSHOT_TIME,
        one(Value::Float(snap.taken_at_unix_ms as f64 / 1e3)),
    );
    fam(
        &defs::AGENT_SPANS,
        one(Value::Int(spans.exported.load(Relaxed))),
    );
    fam(
        &defs::AGENT_SPANS_DROPPED,
        vec![
            (
                vec!["queue_full".into()],
                Value::Int(spans.queue_full.load(Relaxed)),
            ),
            (
                vec!["ring_full".into()],
                Value::Int(a.events_lost.get("ring_full").copied().unwrap_or(0)),
            ),
            (
                vec!["export_failed".into()],
                Value::Int(spans.export_failed.load(Relaxed)),
            ),
        ],
    );
}

fn per_process(snap: &Snapshot, labels_of: &dyn Fn(&str) -> ContainerLabels, out: &mut Exposition) {
    let (mut calls, mut errors, mut mem) = (vec![], vec![], vec![]);
    for p in snap.processes.iter().filter(|p| p.alive) {
        let base: Vec<String> = labels_of(&p.container)
            .into_iter()
            .chain([p.key.pid.to_string(), p.comm.clone()])
            .collect();
        for a in p.effective_apis() {
            let mut l = base.clone();
            l.extend([a.api.clone(), a.kind.clone(), source_name(a.source).into()]);
            calls.push((l.clone(), Value::Int(a.calls)));
            errors.push((l, Value::Int(a.errors)));
        }
        for (view, v) in [
            ("limiter", p.memory.limiter),
            ("probes", p.memory.probes),
            ("nvml", p.memory.nvml),
        ] {
            if let Some(b) = v {
                let mut l = base.clone();
                l.push(view.into());
                mem.push((l, Value::Int(b)));
            }
        }
    }
    for (def, samples) in [
        (&defs::PROCESS_API_CALLS, calls),
        (&defs::PROCESS_API_ERRORS, errors),
        (&defs::PROCESS_MEMORY_USED, mem),
    ] {
        out.families.push(FamilyData { def, samples });
    }
}

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

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
