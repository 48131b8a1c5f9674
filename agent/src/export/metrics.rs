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

pub use super::exposition::{Exposition, FamilyData, SpanCounters, Value};
use super::{
    defs,
    exposition::{ContainerLabels, Counters, source_name},
    families,
};
use crate::model::{Container, Process, ProcessKey, Snapshot};

#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsOptions {
    /// Per-process series (pid, comm labels) too.
    pub pid_labels: bool,
    /// API series per API (`api` label) and latency histograms per container and API, instead
    /// of per kind.
    pub per_api: bool,
}

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
    // Seconds as a float in the model; whole nanoseconds keep the counter's sums exact.
    c.probe_ns = p.probe_seconds.map_or(0, |s| (s * 1e9) as u64);
    let l = &p.probe_losses;
    c.losses = [l.allocations_untracked, l.calls_unaggregated, l.rows_reset];
    c
}

pub(super) fn container_labels(c: Option<&Container>, key: &str) -> ContainerLabels {
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
#[path = "scrape_bench.rs"]
mod scrape_bench;

#[cfg(test)]
pub(super) mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use agent_common::hist::HIST_BUCKETS;

    use super::*;
    use crate::export::{
        defs::{self, Def, Type, Unit},
        encode::{Body, Format},
    };
    use crate::model::{
        AgentStatus, ApiUsage, Container, LimiterProcess, MemoryViews, Process, ProcessKey,
        RegionDevice, RegionInfo, Snapshot, Source,
    };

    pub(crate) fn api(
        name: &str,
        kind: &str,
        source: Source,
        calls: u64,
        ns_each: u64,
    ) -> ApiUsage {
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
            probed: None,
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
            probe_losses: Default::default(),
            probe_seconds: None,
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
            probe_losses: Default::default(),
            frozen: None,
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
    /// model): the APIs are taken from every kind of the API table in turn (alloc, free, sync, copy,
    /// launch, lifecycle, info, NCCL, alloc, ...), so a container uses every kind label; the limiter
    /// counts the kinds it intercepts (alloc, free, launch, info), the probes the others, as in a
    /// container under the limiter. Pod names are as long as a Deployment's.
    pub(crate) fn synthetic(containers: usize, apis: usize) -> Snapshot {
        use agent_common::api::{APIS, ApiKind};
        let mut by_kind: Vec<Vec<&agent_common::api::ApiSpec>> = vec![];
        for s in APIS {
            match by_kind.iter_mut().find(|v| v[0].kind == s.kind) {
                Some(v) => v.push(s),
                None => by_kind.push(vec![s]),
            }
        }
        let picked: Vec<&agent_common::api::ApiSpec> = (0..apis)
            .map(|i| {
                let kind = &by_kind[i % by_kind.len()];
                kind[(i / by_kind.len()) % kind.len()]
            })
            .collect();
        let mut cs = vec![];
        let mut ps = vec![];
        for c in 0..containers {
            let apis = picked
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let source = match spec.kind {
                        ApiKind::Alloc | ApiKind::Free | ApiKind::Launch | ApiKind::Info => {
                            Source::Limiter
                        }
                        _ => Source::Probes,
                    };
                    api(
                        spec.name,
                        spec.kind.name(),
                        source,
                        1000 + i as u64,
                        5000 << (i % 12),
                    )
                })
                .collect();
            let p = process(1000 + c as u32, &format!("c{c:03}"), apis);
            cs.push(container(
                &format!("c{c:03}"),
                Some(&format!("train-{c:03}-7d9f8c6b5-x2k4p")),
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

    fn per_api_view() -> MetricsView {
        MetricsView::new(
            MetricsOptions {
                per_api: true,
                ..Default::default()
            },
            Arc::new(SpanCounters::default()),
        )
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
        let mut v = per_api_view();
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

    /// What the probes cost each container's processes is summed per container in seconds, and
    /// stays when a process leaves (a counter).
    #[test]
    fn the_probes_cost_per_container_is_a_counter_of_seconds() {
        let float = |e: &Exposition| match sample(e, &defs::PROBE_TIME, &["trainer-0"]) {
            Some(Value::Float(s)) => *s,
            other => panic!("{other:?}"),
        };
        let mut a = process(10, "ctr-a", vec![]);
        let mut b = process(11, "ctr-a", vec![]);
        a.probe_seconds = Some(0.25);
        b.probe_seconds = Some(0.5);
        let c = container("ctr-a", Some("trainer-0"), &[&a, &b]);
        let mut v = view();
        let e = v.update(&snapshot(vec![c.clone()], vec![a.clone(), b.clone()]));
        assert!((float(&e) - 0.75).abs() < 1e-9, "{}", float(&e));
        // b leaves; a's cost grows: b's stays counted.
        a.probe_seconds = Some(1.0);
        let e = v.update(&snapshot(vec![c.clone()], vec![a.clone()]));
        assert!((float(&e) - 1.5).abs() < 1e-9, "{}", float(&e));
        // A process never hit adds nothing.
        b.probe_seconds = None;
        let e = v.update(&snapshot(vec![c], vec![a, b]));
        assert!((float(&e) - 1.5).abs() < 1e-9, "{}", float(&e));
    }

    /// What tenants made the agent skip is exported per tenant where the tenant is known: libraries
    /// skipped by reason, warnings suppressed, maps deferred and blocked; and the refused region
    /// slots and the region files not listed, in all.
    #[test]
    fn what_tenants_made_the_agent_skip_is_exported() {
        let mut snap = snapshot(vec![], vec![]);
        let a = &mut snap.agent;
        a.libraries_skipped
            .entry("t1".into())
            .or_default()
            .insert("tenant_cap".into(), 4);
        a.warnings_suppressed.insert("t1".into(), 12);
        a.maps_scan.deferred_by_tenant.insert("t1".into(), 9);
        for pid in [5, 6] {
            a.maps_scan.blocked.push(crate::model::MapsBlocked {
                pid,
                tenant: "t1".into(),
                seconds: 3.0,
            });
        }
        a.slots_refused = 2;
        a.region_listing_cuts.push(crate::model::RegionListingCut {
            path: "/regions/pod_a".into(),
            files_skipped: 3840,
            dirs_skipped: 0,
            entries_unread: false,
        });
        let e = view().update(&snap);
        assert_eq!(
            int(&e, &defs::AGENT_LIBRARIES_SKIPPED, &["t1", "tenant_cap"]),
            4
        );
        assert_eq!(int(&e, &defs::AGENT_WARNINGS_SUPPRESSED, &["t1"]), 12);
        assert_eq!(int(&e, &defs::AGENT_MAPS_DEFERRED, &["t1"]), 9);
        assert_eq!(int(&e, &defs::AGENT_MAPS_BLOCKED, &["t1"]), 2);
        assert_eq!(int(&e, &defs::AGENT_SLOTS_REFUSED, &[]), 2);
        assert_eq!(int(&e, &defs::AGENT_REGION_FILES_SKIPPED, &[]), 3840);
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
        let e = per_api_view().update(&snapshot(vec![c], vec![p]));
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
        let Some(Value::Histogram(_, _, small)) =
            sample(&e, &defs::API_LATENCY, &["cuMemcpyHtoD_v2"])
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
            ..Default::default()
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
                    context_charge: None,
                    qos: Some(crate::model::RegionQos {
                        tier: "guaranteed".into(),
                        guarantee: 0.3,
                        allocated: 0.45,
                        held: true,
                        short: false,
                    }),
                },
                RegionDevice {
                    index: 1,
                    memory_limit: 0,
                    sm_limit_pct: 0,
                    reserved: 0,
                    denied: 0,
                    context_charge: None,
                    qos: None,
                },
            ],
            problems: vec![],
            read_retries: 0,
            writable_by_others: None,
            freeze_after_seconds: None,
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
        assert_eq!(int(&e, &defs::API_DENIED, &["alloc", "limiter"]), 0);
        assert_eq!(
            sample(&e, &defs::CONTAINER_SM_LIMIT, &["p", "0"]),
            Some(&Value::Float(0.5))
        );
        assert_eq!(
            sample(&e, &defs::THROTTLED, &["p"]),
            Some(&Value::Float(1.5))
        );
        assert_eq!(
            sample(
                &e,
                &defs::CONTAINER_QOS_ALLOCATED,
                &["p", "0", "guaranteed"]
            ),
            Some(&Value::Float(0.45))
        );
        assert_eq!(
            sample(&e, &defs::CONTAINER_QOS_GUARANTEE, &["p", "0"]),
            Some(&Value::Float(0.3))
        );
        assert_eq!(int(&e, &defs::CONTAINER_QOS_SHORT, &["p", "0"]), 0);
        assert_eq!(
            e.family(&defs::CONTAINER_QOS_ALLOCATED).len(),
            1,
            "no tier on device 1: no series"
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
            MetricsOptions {
                pid_labels: true,
                ..Default::default()
            },
            Arc::new(SpanCounters::default()),
        );
        let e = v.update(&s);
        assert_eq!(
            int(&e, &defs::PROCESS_API_CALLS, &["42", "train42", "free"]),
            3
        );
        assert!(
            e.family(&defs::PROCESS_API_CALLS)
                .iter()
                .all(|(l, _)| !l.iter().any(|v| v == "cuMemFree_v2")),
            "per kind unless --metrics-per-api"
        );
    }

    /// Every container with a region on device 0 (limit, SM share, reservation, a denial) held by
    /// its process, as the limiter and NVML see it, and one GPU.
    pub(crate) fn with_a_region_and_a_gpu(mut s: Snapshot) -> Snapshot {
        for c in &mut s.containers {
            c.regions.push(RegionInfo {
                path: format!("/r/{}", c.key),
                format: "vgpu".into(),
                devices: vec![RegionDevice {
                    index: 0,
                    memory_limit: 16 << 30,
                    sm_limit_pct: 30,
                    reserved: 9 << 30,
                    denied: 1,
                    context_charge: None,
                    qos: None,
                }],
                problems: vec![],
                read_retries: 0,
                writable_by_others: None,
                freeze_after_seconds: None,
            });
        }
        for p in &mut s.processes {
            p.limiter = Some(LimiterProcess {
                region: format!("/r/{}", p.container),
                slot: 0,
                held: vec![9 << 30],
                context_bytes: vec![512 << 20],
                throttled_ns: 2_000_000_000,
                dropped_records: 0,
                shard_problems: vec![],
                ..Default::default()
            });
            p.memory.limiter = Some(9 << 30);
            p.memory.limiter_allocations = Some((9 << 30) - (512 << 20));
            p.memory.nvml = Some(9 << 30);
            p.nvml = vec![crate::model::NvmlProcess {
                device: 0,
                used_memory: Some(9 << 30),
                sm_util_pct: Some(30.0),
                mem_util_pct: None,
                use_window: None,
                use_unavailable: None,
                busy: Default::default(),
            }];
        }
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
        s
    }

    #[test]
    fn the_exposition_is_openmetrics_per_kind_unless_per_api() {
        let mut s = with_a_region_and_a_gpu(synthetic(3, 5));
        s.agent.events_lost = BTreeMap::from([("stack_full".to_owned(), 2)]);
        s.agent.nvml_calls = BTreeMap::from([(
            "process_utilization".to_owned(),
            crate::model::NvmlCallCost {
                calls: 40,
                seconds: 0.25,
                max_seconds: 0.0125,
            },
        )]);
        s.agent.idle_freeze = Some(crate::model::IdleFreezeStatus {
            after_seconds: Some(600.0),
            host_budget_bytes: 64 << 30,
            host_reserved_bytes: 12 << 30,
            on_demand_seconds: Some(30.0),
        });
        s.agent.freeze_pool = Some(crate::model::FreezePoolStatus {
            size_bytes: 64 << 30,
            ready_bytes: 48 << 30,
            lent_bytes: 16 << 30,
            kept_bytes: 0,
            loans: 1,
            loans_total: 12,
            refusals: BTreeMap::from([("empty".to_owned(), 2)]),
            problem: None,
        });
        let pod = "pod=\"train-000-7d9f8c6b5-x2k4p\",namespace=\"ml\"";
        let names = defs::metric_names();
        for per_api in [false, true] {
            let mut v = if per_api { per_api_view() } else { view() };
            let text = Body::encode(&v.update(&s)).text(Format::OpenMetrics);
            assert!(text.ends_with("# EOF\n"), "{text}");
            assert!(
                text.contains("vgpu_agent_events_lost_total{cause=\"stack_full\"} 2"),
                "{text}"
            );
            for line in [
                "vgpu_freeze_host_budget_bytes{} 68719476736\n",
                "vgpu_freeze_host_reserved_bytes{} 12884901888\n",
                "vgpu_freeze_after_seconds{} 600.0\n",
                "vgpu_freeze_on_demand_seconds{} 30.0\n",
                "vgpu_freeze_pool_bytes{state=\"target\"} 68719476736\n",
                "vgpu_freeze_pool_bytes{state=\"ready\"} 51539607552\n",
                "vgpu_freeze_pool_bytes{state=\"lent\"} 17179869184\n",
                "vgpu_freeze_pool_bytes{state=\"kept\"} 0\n",
                "vgpu_freeze_pool_open_loans{} 1\n",
                "vgpu_freeze_pool_loans_total{} 12\n",
                "vgpu_freeze_pool_refusals_total{reason=\"empty\"} 2\n",
                "vgpu_agent_nvml_calls_total{call=\"process_utilization\"} 40\n",
                "vgpu_agent_nvml_call_duration_seconds_total{call=\"process_utilization\"} 0.25\n",
                "vgpu_agent_nvml_call_max_duration_seconds{call=\"process_utilization\"} 0.0125\n",
            ] {
                assert!(text.contains(line), "{line} in {text}");
            }
            let api = if per_api {
                "api=\"cuMemAlloc_v2\","
            } else {
                ""
            };
            let calls = format!(
                "vgpu_api_calls_total{{container=\"c000\",{pod},{api}kind=\"alloc\",source=\"limiter\"}} 1000\n"
            );
            assert!(text.contains(&calls), "{calls} in {text}");
            assert_eq!(text.contains("api=\""), per_api, "{text}");
            // The histogram per container and API only with the flag; the node's per kind always.
            assert_eq!(
                text.contains("# TYPE vgpu_api_latency_seconds histogram"),
                per_api
            );
            assert!(
                text.contains("vgpu_node_api_latency_seconds_count{kind=\"alloc\"} 3000\n"),
                "{text}"
            );
            assert!(text.contains("vgpu_container_sm_limit_ratio{"), "{text}");
            // No drift is a value for the pairs compared (the probes did not see the start).
            assert!(text.contains("between=\"limiter/nvml\"} 0\n"), "{text}");
            assert!(!text.contains("between=\"probes/limiter\""), "{text}");
            assert!(
                text.contains("vgpu_gpu_utilization_ratio{device=\"0\"} 0.4"),
                "{text}"
            );
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    names.iter().any(|n| n == name),
                    "{name} is not in defs::ALL"
                );
            }
            // Every family of the mode is there (the snapshot has something for each).
            for d in defs::ALL.iter().filter(|d| match d.only {
                defs::Only::Always => d.base != defs::AGENT_SNAPSHOT_AGE.base,
                defs::Only::PerApi => per_api,
                defs::Only::PidLabels => false,
            }) {
                assert!(
                    text.contains(&format!("# TYPE {} ", d.family())),
                    "{} missing (per_api {per_api})",
                    d.base
                );
            }
        }
    }

    #[test]
    fn kinds_fold_lifecycle_and_info_into_other() {
        let p = process(
            10,
            "c",
            vec![
                api("cuInit", "lifecycle", Source::Probes, 1, 900),
                api("cuCtxCreate_v2", "lifecycle", Source::Probes, 2, 900),
                api("cuMemGetInfo_v2", "info", Source::Probes, 4, 900),
                api("ncclAllReduce", "nccl", Source::Probes, 8, 900),
            ],
        );
        let c = container("c", None, &[&p]);
        let e = view().update(&snapshot(vec![c], vec![p]));
        assert_eq!(int(&e, &defs::API_CALLS, &["other", "probes"]), 7);
        assert_eq!(int(&e, &defs::API_CALLS, &["nccl", "probes"]), 8);
        assert_eq!(e.family(&defs::API_CALLS).len(), 2);
        match sample(&e, &defs::API_TIME, &["other"]) {
            Some(Value::Float(s)) => assert!((s - 7.0 * 900e-9).abs() < 1e-15, "{s}"),
            other => panic!("{other:?}"),
        }
        for (kind, want) in [("lifecycle", "other"), ("info", "other"), ("nccl", "nccl")] {
            assert_eq!(defs::kind_label(kind), want);
        }
        assert!(defs::KINDS.iter().all(|k| defs::kind_label(k) == *k));
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
                defs::label_names(d)
                    .iter()
                    .map(|l| if *l == defs::API_LABEL {
                        format!("{l} (with `--metrics-per-api`)")
                    } else {
                        l.to_string()
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                match d.only.flag() {
                    Some(flag) => format!("{} (only with `{flag}`)", d.help),
                    None => d.help.to_owned(),
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
}
