//! The families of `/metrics`, from the folded counters ([`super::metrics::MetricsView`]) and the
//! snapshot's gauges: one [`FamilyData`] per entry of [`super::defs`] that the options turn on,
//! label values in the order of [`defs::labels_in`].

use std::{collections::BTreeMap, sync::Arc};

use agent_common::hist::HIST_BUCKETS;

use super::{
    defs::{self, Def},
    exposition::{
        ContainerLabels, Counters, Exposition, FamilyData, Labels, SpanCounters, Value, source_name,
    },
};
use crate::model::{Snapshot, api_sums::ApiCounts};

pub(super) fn container_gauges(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    denied_published: &mut BTreeMap<(ContainerLabels, u32), u64>,
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
        // 0 for every pair of views compared for some process, so that "no drift" is a value.
        for between in p.memory.compared() {
            drift.entry((l.clone(), between.to_owned())).or_default();
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
        out.families.push(FamilyData::of(def, samples));
    };
    fam(
        &defs::CONTAINER_MEMORY_USED,
        used.iter()
            .map(|((l, dev, view), b)| (lv(l, &[dev, view]), Value::Int(*b)))
            .collect(),
    );
    let (mut limit, mut reserved, mut sm, mut denied) = (vec![], vec![], vec![], vec![]);
    let (mut qos_allocated, mut qos_guarantee, mut qos_short) = (vec![], vec![], vec![]);
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
                if let Some(q) = &d.qos {
                    qos_allocated.push((
                        lv(&l, &[&d.index.to_string(), &q.tier]),
                        Value::Float(q.allocated),
                    ));
                    if q.guarantee > 0.0 {
                        qos_guarantee.push((labels.clone(), Value::Float(q.guarantee)));
                        qos_short.push((labels.clone(), Value::Int(u64::from(q.short))));
                    }
                }
                reserved.push((labels.clone(), Value::Int(d.reserved)));
                let floor = denied_published.entry((l.clone(), d.index)).or_default();
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
    // One tier per container and device: no sums (a container's regions agree, or the last
    // one read is shown).
    for v in [&mut qos_allocated, &mut qos_guarantee, &mut qos_short] {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
    }
    fam(&defs::CONTAINER_QOS_ALLOCATED, qos_allocated);
    fam(&defs::CONTAINER_QOS_GUARANTEE, qos_guarantee);
    fam(&defs::CONTAINER_QOS_SHORT, qos_short);
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
    let (mut frozen, mut frozen_bytes) = (vec![], vec![]);
    for c in snap.containers.iter().filter(|c| !c.regions.is_empty()) {
        let l = lv(&labels_of(&c.key), &[]);
        frozen.push((l.clone(), Value::Int(u64::from(c.frozen.is_some()))));
        if let Some(f) = &c.frozen {
            frozen_bytes.push((l, Value::Int(f.host_bytes)));
        }
    }
    dedup_sum(&mut frozen);
    dedup_sum(&mut frozen_bytes);
    fam(&defs::CONTAINER_FROZEN, frozen);
    fam(&defs::CONTAINER_FROZEN_HOST_MEMORY, frozen_bytes);
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

/// The API families: per (container, kind, source), or per (container, API, kind, source) with
/// `per_api` (then with a latency histogram each); and the node's latency histogram per kind.
pub(super) fn api_families(
    published: &BTreeMap<ContainerLabels, Counters>,
    per_api: bool,
    out: &mut Exposition,
) {
    let mut calls = vec![];
    let mut errors = vec![];
    let mut bytes = vec![];
    let mut time = vec![];
    let mut latency = vec![];
    let mut hook = vec![];
    let mut denied = vec![];
    let mut sync = vec![];
    let mut throttled = vec![];
    let mut probe = vec![];
    let mut node: BTreeMap<&'static str, ApiCounts> = BTreeMap::new();
    for (l, c) in published {
        let mut sync_ns = 0u64;
        for ((api, kind, source), t) in &c.apis {
            let api_label = per_api.then(|| api.to_string());
            let labels: Labels = l
                .iter()
                .cloned()
                .chain(api_label)
                .chain([kind.to_string(), source.to_string()])
                .collect();
            calls.push((labels.clone(), Value::Int(t.calls)));
            errors.push((labels.clone(), Value::Int(t.errors)));
            if t.bytes > 0 {
                bytes.push((labels.clone(), Value::Int(t.bytes)));
            }
            time.push((labels.clone(), Value::Float(ns_to_s(t.total_ns))));
            if *source == "limiter" {
                hook.push((labels.clone(), Value::Float(ns_to_s(t.hook_ns))));
                // The limiter denies allocations only.
                if *kind == "alloc" {
                    denied.push((labels.clone(), Value::Int(t.denied)));
                }
            }
            if *kind == "sync" {
                sync_ns += t.total_ns;
            }
            node.entry(kind).or_default().add(t);
            if per_api {
                latency.push((labels, histogram(t)));
            }
        }
        let l: Labels = l.to_vec().into();
        sync.push((Arc::clone(&l), Value::Float(ns_to_s(sync_ns))));
        probe.push((Arc::clone(&l), Value::Float(ns_to_s(c.probe_ns))));
        throttled.push((l, Value::Float(ns_to_s(c.throttled_ns))));
    }
    let node_latency = node
        .iter()
        .map(|(kind, t)| (Labels::from(vec![kind.to_string()]), histogram(t)))
        .collect();
    for (def, s) in [
        (&defs::API_CALLS, calls),
        (&defs::API_ERRORS, errors),
        (&defs::API_BYTES, bytes),
        (&defs::API_TIME, time),
        (&defs::API_LATENCY, latency),
        (&defs::NODE_LATENCY, node_latency),
        (&defs::API_HOOK, hook),
        (&defs::API_DENIED, denied),
        (&defs::SYNC, sync),
        (&defs::THROTTLED, throttled),
        (&defs::PROBE_TIME, probe),
    ] {
        if def.only == defs::Only::PerApi && !per_api {
            continue;
        }
        out.families.push(FamilyData::new(def, per_api, s));
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
/// counts under the first bound `le = 2^k` with `k >= i + 1`), the rest under +Inf.
fn histogram(t: &ApiCounts) -> Value {
    let bounds = defs::LATENCY_BUCKET_EXPONENTS;
    let mut buckets = Vec::with_capacity(bounds.len() + 1);
    let mut i = 0;
    for k in bounds {
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

pub(super) fn gpu_and_agent(snap: &Snapshot, spans: &SpanCounters, out: &mut Exposition) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut fam = |def: &'static Def, samples: Vec<(Vec<String>, Value)>| {
        out.families.push(FamilyData::of(def, samples));
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
    if let Some(f) = &a.idle_freeze {
        fam(
            &defs::FREEZE_HOST_BUDGET,
            one(Value::Int(f.host_budget_bytes)),
        );
        fam(
            &defs::FREEZE_HOST_RESERVED,
            one(Value::Int(f.host_reserved_bytes)),
        );
        if let Some(after) = f.after_seconds {
            fam(&defs::FREEZE_AFTER, one(Value::Float(after)));
        }
        if let Some(idle) = f.on_demand_seconds {
            fam(&defs::FREEZE_ON_DEMAND, one(Value::Float(idle)));
        }
    }
    if let Some(p) = &a.freeze_pool {
        fam(
            &defs::FREEZE_POOL_BYTES,
            [
                ("target", p.size_bytes),
                ("ready", p.ready_bytes),
                ("lent", p.lent_bytes),
                ("kept", p.kept_bytes),
            ]
            .into_iter()
            .map(|(state, bytes)| (vec![state.to_owned()], Value::Int(bytes)))
            .collect(),
        );
        fam(&defs::FREEZE_POOL_OPEN_LOANS, one(Value::Int(p.loans)));
        fam(&defs::FREEZE_POOL_LOANS, one(Value::Int(p.loans_total)));
        fam(
            &defs::FREEZE_POOL_REFUSALS,
            p.refusals
                .iter()
                .map(|(k, v)| (vec![k.clone()], Value::Int(*v)))
                .collect(),
        );
    }
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
        &defs::AGENT_WARNINGS_SUPPRESSED,
        a.warnings_suppressed
            .iter()
            .map(|(k, v)| (vec![k.clone()], Value::Int(*v)))
            .collect(),
    );
    fam(
        &defs::AGENT_LIBRARIES_SKIPPED,
        a.libraries_skipped
            .iter()
            .flat_map(|(tenant, reasons)| {
                reasons
                    .iter()
                    .map(|(r, n)| (vec![tenant.clone(), r.clone()], Value::Int(*n)))
            })
            .collect(),
    );
    fam(
        &defs::AGENT_MAPS_DEFERRED,
        a.maps_scan
            .deferred_by_tenant
            .iter()
            .map(|(k, v)| (vec![k.clone()], Value::Int(*v as u64)))
            .collect(),
    );
    let mut blocked: BTreeMap<&str, u64> = BTreeMap::new();
    for b in &a.maps_scan.blocked {
        *blocked.entry(b.tenant.as_str()).or_default() += 1;
    }
    fam(
        &defs::AGENT_MAPS_BLOCKED,
        blocked
            .into_iter()
            .map(|(k, v)| (vec![k.to_owned()], Value::Int(v)))
            .collect(),
    );
    fam(&defs::AGENT_SLOTS_REFUSED, one(Value::Int(a.slots_refused)));
    fam(
        &defs::AGENT_REGION_FILES_SKIPPED,
        one(Value::Int(
            a.region_listing_cuts.iter().map(|c| c.files_skipped).sum(),
        )),
    );
    fam(
        &defs::AGENT_SNAPSHOT_TIME,
        one(Value::Float(snap.taken_at_unix_ms as f64 / 1e3)),
    );
    fam(
        &defs::AGENT_SNAPSHOT_STALE,
        one(Value::Int(u64::from(a.stale))),
    );
    fam(
        &defs::AGENT_COLLECT_TIME,
        one(Value::Float(a.collect_seconds)),
    );
    let by_call = |value: fn(&crate::model::NvmlCallCost) -> Value| {
        a.nvml_calls
            .iter()
            .map(|(call, cost)| (vec![call.clone()], value(cost)))
            .collect()
    };
    fam(&defs::AGENT_NVML_CALLS, by_call(|c| Value::Int(c.calls)));
    fam(
        &defs::AGENT_NVML_CALL_TIME,
        by_call(|c| Value::Float(c.seconds)),
    );
    fam(
        &defs::AGENT_NVML_CALL_MAX,
        by_call(|c| Value::Float(c.max_seconds)),
    );
    fam(
        &defs::AGENT_REGIONS_UNREAD,
        ["time", "retries", "blocked"]
            .iter()
            .map(|&reason| {
                let n = a.regions_unread.iter().filter(|u| u.reason == reason);
                (vec![reason.to_owned()], Value::Int(n.count() as u64))
            })
            .collect(),
    );
    fam(
        &defs::AGENT_HTTP_DROPPED,
        a.http_dropped
            .iter()
            .map(|(k, v)| (vec![k.clone()], Value::Int(*v)))
            .collect(),
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
                vec!["container_rate".into()],
                Value::Int(spans.container_rate.load(Relaxed)),
            ),
            (
                vec!["export_failed".into()],
                Value::Int(spans.export_failed.load(Relaxed)),
            ),
        ],
    );
}

/// What the probes could not record, per container (cumulative, folded like the API counters),
/// and which containers' probe figures are incomplete now (an alive process lost something).
pub(super) fn probe_losses(
    snap: &Snapshot,
    published: &BTreeMap<ContainerLabels, Counters>,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    out: &mut Exposition,
) {
    let mut losses = vec![];
    for (l, c) in published {
        for (reason, n) in super::exposition::LOSS_REASONS.iter().zip(c.losses) {
            if n > 0 {
                let labels: Vec<String> = l.iter().cloned().chain([reason.to_string()]).collect();
                losses.push((labels, Value::Int(n)));
            }
        }
    }
    out.families
        .push(FamilyData::of(&defs::CONTAINER_PROBE_LOSSES, losses));
    let mut incomplete: BTreeMap<ContainerLabels, u64> = BTreeMap::new();
    for p in snap.processes.iter().filter(|p| p.alive) {
        let e = incomplete.entry(labels_of(&p.container)).or_default();
        *e = (*e).max(u64::from(!p.probe_losses.is_empty()));
    }
    out.families.push(FamilyData::of(
        &defs::CONTAINER_PROBES_INCOMPLETE,
        incomplete
            .into_iter()
            .map(|(l, n)| (l.to_vec(), Value::Int(n)))
            .collect(),
    ));
}

/// Which kinds of calls of each container are estimates from sampled probes now (of its alive
/// processes' rows: 1 if any is estimated).
pub(super) fn api_estimated(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    out: &mut Exposition,
) {
    let mut kinds: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for p in snap.processes.iter().filter(|p| p.alive) {
        let sampled = agent_common::ApiKind::BUDGETED.map(|k| k.name());
        for a in p
            .effective_apis()
            .into_iter()
            .filter(|a| sampled.contains(&a.kind.as_str()))
        {
            let labels: Vec<String> = labels_of(&p.container)
                .into_iter()
                .chain([a.kind.clone()])
                .collect();
            let e = kinds.entry(labels).or_default();
            *e = (*e).max(u64::from(a.is_estimated()));
        }
    }
    out.families.push(FamilyData::of(
        &defs::CONTAINER_API_ESTIMATED,
        kinds.into_iter().map(|(l, n)| (l, Value::Int(n))).collect(),
    ));
}

/// Spans dropped per container, span kind and reason (the pipeline's own counters: cumulative).
pub(super) fn container_span_drops(
    spans: &SpanCounters,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    out: &mut Exposition,
) {
    let mut samples: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for ((container, kind, reason), n) in spans.container_drops() {
        let labels: Vec<String> = labels_of(&container)
            .into_iter()
            .chain([kind.to_owned(), reason.to_owned()])
            .collect();
        *samples.entry(labels).or_default() += n;
    }
    out.families.push(FamilyData::of(
        &defs::CONTAINER_SPANS_DROPPED,
        samples
            .into_iter()
            .map(|(l, n)| (l, Value::Int(n)))
            .collect(),
    ));
}

pub(super) fn per_process(
    snap: &Snapshot,
    labels_of: &dyn Fn(&str) -> ContainerLabels,
    per_api: bool,
    out: &mut Exposition,
) {
    let (mut calls, mut errors, mut mem) = (vec![], vec![], vec![]);
    for p in snap.processes.iter().filter(|p| p.alive) {
        let base: Vec<String> = labels_of(&p.container)
            .into_iter()
            .chain([p.key.pid.to_string(), p.comm.clone()])
            .collect();
        // (api or none, kind, source) -> (calls, errors)
        let mut apis: BTreeMap<(Option<&str>, &str, &str), (u64, u64)> = BTreeMap::new();
        for a in p.effective_apis() {
            let key = (
                per_api.then_some(a.api.as_str()),
                defs::kind_label(&a.kind),
                source_name(a.source),
            );
            let e = apis.entry(key).or_default();
            e.0 += a.calls;
            e.1 += a.errors;
        }
        for ((api, kind, source), (n, errs)) in apis {
            let mut l = base.clone();
            l.extend(api.map(str::to_owned));
            l.extend([kind.to_owned(), source.to_owned()]);
            let l: Labels = l.into();
            calls.push((l.clone(), Value::Int(n)));
            errors.push((l, Value::Int(errs)));
        }
        for (view, v) in [
            ("limiter", p.memory.limiter),
            ("probes", p.memory.probes),
            ("nvml", p.memory.nvml),
        ] {
            if let Some(b) = v {
                let mut l = base.clone();
                l.push(view.into());
                mem.push((l.into(), Value::Int(b)));
            }
        }
    }
    for (def, samples) in [
        (&defs::PROCESS_API_CALLS, calls),
        (&defs::PROCESS_API_ERRORS, errors),
        (&defs::PROCESS_MEMORY_USED, mem),
    ] {
        out.families.push(FamilyData::new(def, per_api, samples));
    }
}
