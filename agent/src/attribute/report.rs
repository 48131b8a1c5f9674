//! The attribution report: per container and process, wall time and the time inside CUDA/NCCL
//! calls split into components, per-API times, allocation size classes, and (with a baseline)
//! what changed. JSON schema: docs/attribute.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    components::{self, ApiTime, Charged, Components, Estimate, Sampling},
    filter::Filter,
    uncertainty::{self, ComponentSums, Uncertainty},
};
use crate::model::{Process, Snapshot};

pub const SCHEMA: &str = "vgpu-agent.attribute/v1";

/// Allocation size classes, by the lower bound's log2 (bytes).
pub const SIZE_CLASSES: [(&str, u8); 4] = [
    ("< 1 MiB", 0),
    ("1-16 MiB", 20),
    ("16-256 MiB", 24),
    (">= 256 MiB", 28),
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SizeClass {
    pub class: String,
    pub direct_count: u64,
    pub direct_bytes: u64,
    pub pool_count: u64,
    pub pool_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessAttribution {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub container: String,
    /// Seconds of the window the process was alive for.
    pub wall_seconds: f64,
    /// Seconds inside CUDA/NCCL calls (the sum of the components).
    pub in_api_seconds: f64,
    pub components: Components,
    /// How sure the components that are estimates are (`in_api`: their sum), by name; exact
    /// components are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub uncertainty: BTreeMap<String, Uncertainty>,
    pub apis: Vec<ApiTime>,
    pub allocation_classes: Vec<SizeClass>,
    /// Probe hits charged in `components.probe_cost` that no call was counted for, at a
    /// sampling window's edge, where a kind's entry and return probes switch one after the
    /// other (`ApiStats::unpaired`). Its probed calls plus these are its hits.
    #[serde(default)]
    pub unpaired_probe_hits: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerAttribution {
    pub key: String,
    pub name: String,
    pub pids: Vec<u32>,
    pub wall_seconds: f64,
    pub in_api_seconds: f64,
    pub components: Components,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub uncertainty: BTreeMap<String, Uncertainty>,
    pub allocation_classes: Vec<SizeClass>,
}

/// What the probes sampled and what that cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingInfo {
    /// Launch probes: `off`, `on` or `sampled`.
    pub launch_probes: String,
    /// Seconds the launch probes were attached during the window.
    pub launch_probe_seconds: f64,
    /// Measured cost of one probed call (entry + return), ns.
    pub probe_cost_per_call_ns: f64,
    /// How sure that is (the spread of the re-measurements it was priced from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost_per_call_uncertainty: Option<Uncertainty>,
    /// The part of it inside measured latencies, ns (removed from driver time).
    pub probe_inband_ns: f64,
    /// Probe cost over all processes as a share of their wall time.
    pub probe_cost_share: f64,
    /// What a hit costs now per prologue class of the probed functions (`push`, `nop5`,
    /// `endbr64`, `branch`, `other`), ns: the classes that had probed calls, and the main one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probe_cost_per_class_ns: BTreeMap<String, f64>,
    /// With a probe budget: the budget (a share of wall time) and what each sampled kind's
    /// schedule did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sampled_kinds: Vec<SampledKind>,
}

/// One kind probed in windows under the budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampledKind {
    pub kind: String,
    /// Seconds attached during the window, and that over the window's length.
    pub attached_seconds: f64,
    pub duty: f64,
    /// Calls per second of the busiest process when last measured.
    pub rate_per_second: f64,
    /// The hits of a window's whole cycle over those planned for the window alone (its edges):
    /// the gaps were this much longer (the model's `sampling.kinds[].overrun`).
    #[serde(default)]
    pub overrun: f64,
    /// Of the calls estimated for the detached gaps over the window, the share estimated from a
    /// kind attached all along (synchronisations, copies, allocations: their calls in the gap
    /// times the ratio seen in the windows), the rest by the process's own pace in the windows.
    #[serde(default)]
    pub gaps_by_reference: f64,
}

/// One component's change against the baseline, per second of wall time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub component: String,
    /// Seconds per wall second, baseline and now.
    pub baseline: f64,
    pub now: f64,
    pub delta: f64,
    /// Share of the total increase this component explains (0 for components that fell).
    pub share_of_slowdown: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineComparison {
    pub baseline_file: String,
    /// Time inside the API per wall second, baseline and now.
    pub in_api_baseline: f64,
    pub in_api_now: f64,
    /// Components ranked by how much of the increase they explain.
    pub changes: Vec<Change>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttributionReport {
    pub schema: String,
    pub hostname: String,
    pub started_at_unix_ms: u64,
    pub duration_seconds: f64,
    pub source: String,
    pub sampling: SamplingInfo,
    pub totals: Components,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub totals_uncertainty: BTreeMap<String, Uncertainty>,
    pub containers: Vec<ContainerAttribution>,
    pub processes: Vec<ProcessAttribution>,
    pub baseline: Option<BaselineComparison>,
    pub notes: Vec<String>,
    /// Which tenant used the GPU during the window (NVML; empty without it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_use: Vec<super::gpu_use::TenantUse>,
}

fn classes(now: &Process, before: Option<&Process>) -> Vec<SizeClass> {
    let mut out: Vec<SizeClass> = SIZE_CLASSES
        .iter()
        .map(|(n, _)| SizeClass {
            class: (*n).into(),
            ..Default::default()
        })
        .collect();
    for a in &now.alloc_sizes {
        let earlier = before.and_then(|b| {
            b.alloc_sizes
                .iter()
                .find(|e| e.api == a.api && e.log2 == a.log2)
        });
        let count = a
            .count
            .saturating_sub(earlier.map(|e| e.count).unwrap_or(0));
        let bytes = a
            .bytes
            .saturating_sub(earlier.map(|e| e.bytes).unwrap_or(0));
        let i = SIZE_CLASSES
            .iter()
            .rposition(|(_, lo)| a.log2 >= *lo)
            .unwrap_or(0);
        let c = &mut out[i];
        if a.pool {
            c.pool_count += count;
            c.pool_bytes += bytes;
        } else {
            c.direct_count += count;
            c.direct_bytes += bytes;
        }
    }
    out
}

fn add_classes(into: &mut [SizeClass], from: &[SizeClass]) {
    for (a, b) in into.iter_mut().zip(from) {
        a.direct_count += b.direct_count;
        a.direct_bytes += b.direct_bytes;
        a.pool_count += b.pool_count;
        a.pool_bytes += b.pool_bytes;
    }
}

/// Each sampled kind's calls in a process over the window as the sampling schedule estimated
/// them, with one standard error (empty without a budget). `hit_relative_se`: the relative
/// standard error of the price of a hit in this process (the pace estimate depends on it).
fn estimates_over(
    first: &Snapshot,
    last: &Snapshot,
    pid: u32,
    hit_relative_se: f64,
) -> BTreeMap<String, Estimate> {
    let of = |s: &Snapshot| {
        s.agent
            .sampling
            .as_ref()
            .and_then(|x| x.exposure.get(&pid).cloned())
            .unwrap_or_default()
    };
    let (before, now) = (of(first), of(last));
    now.into_iter()
        .filter_map(|(kind, e)| {
            let e = e.since(&before.get(&kind).copied().unwrap_or_default());
            (e.probed_calls > 0 && e.estimated_calls > 0.0).then(|| {
                (
                    kind,
                    Estimate {
                        calls: e.estimated_calls,
                        standard_error: e.calls_se(hit_relative_se),
                    },
                )
            })
        })
        .collect()
}

/// Builds the report of the window `first..last`.
pub fn build(
    first: &Snapshot,
    last: &Snapshot,
    source: &str,
    window_seconds: f64,
    filter: &Filter,
    process_age_seconds: impl Fn(&Process) -> Option<f64>,
) -> AttributionReport {
    let cost = last.agent.probe_cost.as_ref();
    let sampling = Sampling {
        window_seconds,
        launch_seconds: match last.agent.launch_probes {
            crate::model::probing::LaunchProbes::Off => 0.0,
            crate::model::probing::LaunchProbes::On => window_seconds,
            crate::model::probing::LaunchProbes::Budget
            | crate::model::probing::LaunchProbes::Sampled { .. } => {
                (last.agent.launch_probe_seconds - first.agent.launch_probe_seconds).max(0.0)
            }
        },
        per_hit_ns: cost.map(|c| c.per_hit_ns).unwrap_or(0.0),
        inband_ns: cost.map(|c| c.inband_ns).unwrap_or(0.0),
    };
    let container_name = |key: &str| {
        last.containers
            .iter()
            .find(|c| c.key == key)
            .map(|c| c.name.clone())
            .unwrap_or_else(|| key.to_owned())
    };
    let mut processes = Vec::new();
    let mut probed_total = 0u64;
    let mut sums: BTreeMap<u32, ComponentSums> = BTreeMap::new();
    for p in &last.processes {
        if !filter.keeps(p, &container_name(&p.container)) {
            continue;
        }
        let before = first.process(p.key);
        let charged = |snap: &Snapshot| {
            snap.agent.probe_cost.as_ref().and_then(|c| {
                let pid = p.key.pid;
                let ns = c.charged_ns.get(&pid).copied()?;
                let se = c.charged_se_ns.get(&pid).copied().unwrap_or(0.0);
                let unpaired = c.unpaired_hits.get(&pid).copied().unwrap_or(0);
                Some((ns, se, c.charged_inband_ns.get(&pid).copied(), unpaired))
            })
        };
        let charged = charged(last).map(|(ns, se, inband, unpaired)| {
            let (ns0, se0, inband0, unpaired0) = charged(first).unwrap_or((0.0, 0.0, None, 0));
            Charged {
                ns: (ns - ns0).max(0.0),
                se_ns: (se - se0).max(0.0),
                inband_ns: inband.map(|i| (i - inband0.unwrap_or(0.0)).max(0.0)),
                unpaired_hits: unpaired.saturating_sub(unpaired0),
            }
        });
        let unpaired_probe_hits = charged.map_or(0, |c| c.unpaired_hits);
        // The relative uncertainty of the prices this process's hits were charged at, and of
        // what they cost its own functions.
        let hit_relative_se = uncertainty::hit_price_relative_se(
            charged
                .filter(|c| c.ns > 0.0)
                .map_or(0.0, |c| c.se_ns / c.ns),
        );
        let estimates = estimates_over(first, last, p.key.pid, hit_relative_se);
        // The process's own probe class (its library's functions decide what a hit costs).
        let mut own = sampling;
        if let Some(class) = cost.and_then(|c| c.class_of(p.key.pid)) {
            own.per_hit_ns = class.per_hit_ns;
            own.inband_ns = class.inband_ns;
        }
        let components::Attributed {
            components,
            uncertainty,
            apis,
            probed_calls,
        } = components::attribute(p, before, own, charged, &estimates);
        probed_total += probed_calls;
        sums.insert(p.key.pid, uncertainty.clone());
        if apis.is_empty() && components.throttled == 0.0 {
            continue;
        }
        let wall_seconds = process_age_seconds(p)
            .map(|age| age.min(window_seconds))
            .unwrap_or(window_seconds);
        processes.push(ProcessAttribution {
            pid: p.key.pid,
            comm: p.comm.clone(),
            cmdline: p.cmdline.clone(),
            container: p.container.clone(),
            wall_seconds,
            in_api_seconds: components.total(),
            uncertainty: uncertainty::describe(
                &uncertainty,
                |n| components.get(n),
                components.total(),
            ),
            components,
            apis,
            allocation_classes: classes(p, before),
            unpaired_probe_hits,
        });
    }
    let mut containers: BTreeMap<String, ContainerAttribution> = BTreeMap::new();
    let mut container_sums: BTreeMap<String, ComponentSums> = BTreeMap::new();
    let mut totals = Components::default();
    let mut totals_sums = ComponentSums::new();
    let mut wall_total = 0.0;
    for p in &processes {
        if let Some(s) = sums.get(&p.pid) {
            uncertainty::add_all(container_sums.entry(p.container.clone()).or_default(), s);
            uncertainty::add_all(&mut totals_sums, s);
        }
        let c = containers
            .entry(p.container.clone())
            .or_insert_with(|| ContainerAttribution {
                key: p.container.clone(),
                name: container_name(&p.container),
                pids: vec![],
                wall_seconds: 0.0,
                in_api_seconds: 0.0,
                components: Components::default(),
                uncertainty: BTreeMap::new(),
                allocation_classes: SIZE_CLASSES
                    .iter()
                    .map(|(n, _)| SizeClass {
                        class: (*n).into(),
                        ..Default::default()
                    })
                    .collect(),
            });
        c.pids.push(p.pid);
        c.wall_seconds += p.wall_seconds;
        c.in_api_seconds += p.in_api_seconds;
        c.components.add(&p.components);
        add_classes(&mut c.allocation_classes, &p.allocation_classes);
        totals.add(&p.components);
        wall_total += p.wall_seconds;
    }
    for c in containers.values_mut() {
        if let Some(s) = container_sums.get(&c.key) {
            c.uncertainty = uncertainty::describe(s, |n| c.components.get(n), c.in_api_seconds);
        }
    }
    let totals_uncertainty = uncertainty::describe(&totals_sums, |n| totals.get(n), totals.total());
    let mut notes = Vec::new();
    if let Some(why) = &last.agent.probes_unavailable {
        notes.push(format!("no probe figures: {why}"));
    }
    let sampled = sampled_kinds(first, last, window_seconds);
    if !sampled.is_empty() {
        notes.push(format!(
            "probed in windows to keep their cost under {:.2}% of each process's time: {}; each window's calls and times stand for its whole cycle (window + off time) and are scaled up by it (the limiter's figures are used where it runs)",
            last.agent.sampling.as_ref().map(|s| s.budget_share * 100.0).unwrap_or(0.0),
            sampled
                .iter()
                .map(|k| format!("{} {:.1}% of the window", k.kind, k.duty * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    } else if sampling.launch_seconds < window_seconds && sampling.launch_seconds > 0.0 {
        notes.push(format!(
            "launch probes were attached {:.1}s of {:.1}s: probed launch times are scaled up by {:.1}x (the limiter's figures are used where it runs)",
            sampling.launch_seconds,
            window_seconds,
            window_seconds / sampling.launch_seconds
        ));
    }
    if processes
        .iter()
        .any(|p| p.uncertainty.values().any(|u| u.marked))
    {
        notes.push(format!(
            "figures marked ! are estimates whose standard error is over {:.0}% of them (or could not be estimated, from fewer than two sampled windows): read them as a range, not a figure (docs/attribute.md, \"How sure\")",
            uncertainty::MARK_ABOVE * 100.0
        ));
    }
    let probe_cost_per_call_uncertainty = totals_uncertainty
        .get("probe_cost")
        .filter(|_| probed_total > 0)
        .map(|u| {
            Uncertainty::of(
                totals.probe_cost * 1e9 / probed_total as f64,
                u.standard_error.map(|se| se * 1e9 / probed_total as f64),
            )
        });
    AttributionReport {
        schema: SCHEMA.into(),
        hostname: last.hostname.clone(),
        started_at_unix_ms: first.taken_at_unix_ms,
        duration_seconds: window_seconds,
        source: source.into(),
        sampling: SamplingInfo {
            launch_probes: match last.agent.launch_probes {
                crate::model::probing::LaunchProbes::Off => "off".into(),
                crate::model::probing::LaunchProbes::On => "on".into(),
                crate::model::probing::LaunchProbes::Budget => "budget".into(),
                crate::model::probing::LaunchProbes::Sampled { .. } => "sampled".into(),
            },
            launch_probe_seconds: sampling.launch_seconds,
            // What a probed call cost over the window (the cost is re-measured at every poll).
            probe_cost_per_call_ns: if probed_total > 0 {
                totals.probe_cost * 1e9 / probed_total as f64
            } else {
                sampling.per_hit_ns
            },
            probe_cost_per_call_uncertainty,
            probe_inband_ns: sampling.inband_ns,
            probe_cost_per_class_ns: cost
                .map(|c| {
                    c.classes
                        .iter()
                        .filter(|k| k.charged_calls > 0 || k.prologue == c.prologue)
                        .filter_map(|k| {
                            let name = serde_json::to_value(k.prologue).ok()?;
                            Some((name.as_str()?.to_owned(), k.last_per_hit_ns))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            probe_cost_share: if wall_total > 0.0 {
                totals.probe_cost / wall_total
            } else {
                0.0
            },
            budget_share: last.agent.sampling.as_ref().map(|s| s.budget_share),
            sampled_kinds: sampled_kinds(first, last, window_seconds),
        },
        totals,
        totals_uncertainty,
        containers: containers.into_values().collect(),
        processes,
        baseline: None,
        notes,
        gpu_use: super::gpu_use::build(first, last, filter),
    }
}

/// The kinds the budget sampled in the window (those attached less than all of it).
fn sampled_kinds(first: &Snapshot, last: &Snapshot, window_seconds: f64) -> Vec<SampledKind> {
    let Some(now) = &last.agent.sampling else {
        return vec![];
    };
    now.kinds
        .iter()
        .filter_map(|k| {
            let before = first
                .agent
                .sampling
                .as_ref()
                .and_then(|s| s.kinds.iter().find(|b| b.kind == k.kind))
                .map(|b| b.attached_seconds)
                .unwrap_or(0.0);
            let attached = (k.attached_seconds - before).max(0.0);
            let duty = if window_seconds > 0.0 {
                (attached / window_seconds).min(1.0)
            } else {
                1.0
            };
            let gaps = |snap: &Snapshot| {
                snap.agent
                    .sampling
                    .iter()
                    .flat_map(|s| s.exposure.values())
                    .filter_map(|kinds| kinds.get(&k.kind))
                    .fold((0.0, 0.0), |(r, p), e| {
                        (r + e.gap_calls_by_reference, p + e.gap_calls_by_pace)
                    })
            };
            let ((r1, p1), (r0, p0)) = (gaps(last), gaps(first));
            let (by_reference, by_pace) = ((r1 - r0).max(0.0), (p1 - p0).max(0.0));
            (duty < 0.999).then(|| SampledKind {
                kind: k.kind.clone(),
                attached_seconds: attached,
                duty,
                rate_per_second: k.rate_per_second,
                overrun: k.overrun,
                gaps_by_reference: if by_reference + by_pace > 0.0 {
                    by_reference / (by_reference + by_pace)
                } else {
                    0.0
                },
            })
        })
        .collect()
}

/// Compares with a baseline recording: components per second of wall time, ranked by how much of
/// the increase in time inside the API each explains.
pub fn compare(
    now: &AttributionReport,
    baseline: &AttributionReport,
    file: &str,
) -> BaselineComparison {
    let rate = |r: &AttributionReport, name: &str| {
        let wall: f64 = r.processes.iter().map(|p| p.wall_seconds).sum();
        if wall > 0.0 {
            r.totals.get(name) / wall
        } else {
            0.0
        }
    };
    let mut changes: Vec<Change> = components::NAMES
        .iter()
        .map(|n| {
            let (b, a) = (rate(baseline, n), rate(now, n));
            Change {
                component: (*n).into(),
                baseline: b,
                now: a,
                delta: a - b,
                share_of_slowdown: 0.0,
            }
        })
        .collect();
    let increase: f64 = changes.iter().map(|c| c.delta.max(0.0)).sum();
    for c in &mut changes {
        c.share_of_slowdown = if increase > 0.0 {
            c.delta.max(0.0) / increase
        } else {
            0.0
        };
    }
    changes.sort_by(|a, b| b.delta.total_cmp(&a.delta));
    BaselineComparison {
        baseline_file: file.into(),
        in_api_baseline: components::NAMES.iter().map(|n| rate(baseline, n)).sum(),
        in_api_now: components::NAMES.iter().map(|n| rate(now, n)).sum(),
        changes,
    }
}

#[cfg(test)]
mod tests {
    //! The report built from two generated snapshots: a sampled estimate and a probe cost carry
    //! their uncertainty into the JSON, the table and the HTML, marked where over 10%.

    use serde_json::json;

    use super::*;
    use crate::model::{
        ApiUsage, Source,
        probing::{Exposure, KindSampling, LaunchProbes, ProbeCost, SamplingStatus},
    };

    /// A snapshot of one process (pid 1) that made `probed` probed launches of `launch_ns` each
    /// (as the probes measured them), whose launches the schedule estimated as `exposure`, and that
    /// was charged `charged` ns of probe cost with that standard error.
    fn snapshot(
        probed: u64,
        launch_ns: u64,
        exposure: serde_json::Value,
        charged: (f64, f64),
    ) -> Snapshot {
        let mut s = crate::tui::fixture::empty();
        s.agent.launch_probes = LaunchProbes::Sampled {
            window: std::time::Duration::from_millis(50),
            period: std::time::Duration::from_secs(1),
        };
        let exposure: Exposure = serde_json::from_value(exposure).unwrap();
        s.agent.sampling = Some(SamplingStatus {
            budget_share: 0.01,
            window_seconds: 0.05,
            kinds: vec![KindSampling {
                kind: "launch".into(),
                duty: 0.05,
                overrun: 1.0,
                rate_per_second: 200_000.0,
                attached_seconds: probed as f64 / 200_000.0,
            }],
            exposure: [(1, [("launch".to_owned(), exposure)].into())].into(),
        });
        let cost: ProbeCost = serde_json::from_value(json!({
            "target": "self:vgpu_calibrate_push", "prologue": "push", "calls": 1000,
            "unprobed_ns": 300.0, "per_hit_ns": 2000.0, "inband_ns": 1000.0,
            "last_per_hit_ns": 2000.0,
            "charged_ns": {"1": charged.0}, "charged_se_ns": {"1": charged.1},
        }))
        .unwrap();
        s.agent.probe_cost = Some(cost);
        let mut p = crate::model::Process::with_apis(vec![ApiUsage {
            api: "cuLaunchKernel".into(),
            kind: "launch".into(),
            source: Source::Probes,
            calls: probed,
            errors: 0,
            bytes: 0,
            total_ns: probed * launch_ns,
            hook_ns: 0,
            denied: 0,
            hist: vec![],
            latency: None,
            probed: None,
        }]);
        p.key.start_ticks = 0;
        s.processes = vec![p];
        s
    }

    /// `launch_ns`: each launch as the probes measured it (the price of a hit is 2 us, 1 us of it
    /// in-band). 50,000 launches probed in windows, 950,000 estimated for the gaps by pace from 11
    /// windows whose successive differences give a variance of `sq_diff / 20` (calls/s)^2, over gaps
    /// whose squared weights sum to 1 s^2.
    fn report(sq_diff: f64, launch_ns: u64) -> AttributionReport {
        report_by_pace(
            json!({"pairs": 10, "sq_diff": sq_diff, "weight_sq": 1.0, "own_seconds": 0.25}),
            launch_ns,
        )
    }

    /// The report of 50,000 launches probed in windows and 950,000 estimated for the gaps by pace,
    /// the pace windows' spread `pace`, each launch `launch_ns` as the probes measured it, charged at
    /// 2 us a hit with a 5% spread.
    fn report_by_pace(pace: serde_json::Value, launch_ns: u64) -> AttributionReport {
        let first = snapshot(
            0,
            launch_ns,
            json!({"probed_calls": 0, "estimated_calls": 0.0}),
            (0.0, 0.0),
        );
        let last = snapshot(
            50_000,
            launch_ns,
            json!({
                "probed_calls": 50_000, "estimated_calls": 1_000_000.0,
                "gap_calls_by_pace": 950_000.0, "pace": pace,
            }),
            (50_000.0 * 2_000.0, 50_000.0 * 100.0),
        );
        build(
            &first,
            &last,
            "in_process",
            10.0,
            &Filter::default(),
            |_| None,
        )
    }

    #[test]
    fn an_unsure_estimate_is_marked_in_the_json_the_table_and_the_html() {
        // Standard error 150,000 calls: 15% of the estimate; launches of 5 us.
        let r = report(20.0 * 150_000f64.powi(2), 5_000);
        let p = &r.processes[0];
        let launch = &p.apis[0];
        assert_eq!(
            (launch.calls, launch.measured_by.as_str()),
            (1_000_000, "probes_sampled")
        );
        let u = launch.calls_uncertainty.unwrap();
        assert!(
            (u.relative.unwrap() - 0.15).abs() < 1e-9 && u.marked,
            "{u:?}"
        );
        assert!(p.uncertainty["driver"].marked);
        assert!(r.totals_uncertainty["driver"].marked);
        assert!(r.containers[0].uncertainty["driver"].marked);
        // The probe cost: charged at prices 5% unsure, and a hit on the probed function unsure by
        // a quarter of its price beyond that (in quadrature: 25.5%).
        let cost = p.uncertainty["probe_cost"];
        let relative = 0.05f64.hypot(0.25);
        assert!((cost.relative.unwrap() - relative).abs() < 1e-9 && cost.marked);
        let per_call = r.sampling.probe_cost_per_call_uncertainty.unwrap();
        assert!((per_call.standard_error.unwrap() - 2_000.0 * relative).abs() < 1e-6);
        assert!(
            r.notes.iter().any(|n| n.contains("marked !")),
            "{:?}",
            r.notes
        );
        let json = serde_json::to_value(&r).unwrap();
        let row = &json["processes"][0]["apis"][0];
        assert_eq!(row["calls_uncertainty"]["marked"], true);
        // The time: the count's 15%, and the in-band correction (a quarter of a 2 us hit in each
        // 4 us launch: 12.5%).
        assert!((row["seconds_uncertainty"]["relative"].as_f64().unwrap() - 0.275).abs() < 1e-9);
        assert_eq!(
            json["processes"][0]["uncertainty"]["driver"]["marked"],
            true
        );
        let text = super::super::table(&r);
        assert!(text.contains("±15%!"), "{text}");
        assert!(text.contains("1000000 ±15%!"), "{text}");
        let html = super::super::html::render(&r);
        assert!(html.contains("<span class=unsure title") && html.contains("±15%!"));
        assert!(html.contains("How sure these figures are"));
    }

    #[test]
    fn a_sure_estimate_shows_its_uncertainty_unmarked() {
        // 2%, launches of 50 us: the in-band correction is 1% of each.
        let r = report(20.0 * 20_000f64.powi(2), 50_000);
        let p = &r.processes[0];
        let u = p.apis[0].calls_uncertainty.unwrap();
        assert!((u.relative.unwrap() - 0.02).abs() < 1e-9 && !u.marked);
        let s = p.apis[0].seconds_uncertainty.unwrap();
        assert!((s.relative.unwrap() - (0.02 + 500.0 / 49_000.0)).abs() < 1e-9 && !s.marked);
        assert!(!p.uncertainty["driver"].marked && !r.totals_uncertainty["driver"].marked);
        let text = super::super::table(&r);
        assert!(text.contains("±2%") && !text.contains("±2%!"), "{text}");
        // The probe cost alone is marked: what a hit costs the probed function is a quarter of
        // its price unsure, whatever the sampling.
        assert!(p.uncertainty["probe_cost"].marked);
        let marked: Vec<&String> = p
            .uncertainty
            .iter()
            .filter(|(_, u)| u.marked)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(marked, ["probe_cost"]);
        // In the HTML: the cost per probed call in the header and the probe cost's row.
        let html = super::super::html::render(&r);
        assert_eq!(
            html.matches("<span class=unsure title").count(),
            2,
            "{html}"
        );
        assert!(html.contains("each probed call cost 2000 ns <span class=unsure"));
    }

    #[test]
    fn a_recording_without_uncertainty_still_reads_as_a_baseline() {
        let r = report(0.0, 5_000);
        let mut json = serde_json::to_value(&r).unwrap();
        // As written before estimates carried their uncertainty.
        json.as_object_mut().unwrap().remove("totals_uncertainty");
        for p in json["processes"].as_array_mut().unwrap() {
            p.as_object_mut().unwrap().remove("uncertainty");
            for a in p["apis"].as_array_mut().unwrap() {
                a.as_object_mut().unwrap().remove("calls_uncertainty");
                a.as_object_mut().unwrap().remove("seconds_uncertainty");
            }
        }
        let back: AttributionReport = serde_json::from_value(json).unwrap();
        assert!(back.processes[0].uncertainty.is_empty());
        assert_eq!(back.totals, r.totals);
    }

    /// A pace estimate rests on the price of a hit: the windows' own time is what is left of them
    /// once the hits are taken out. Its count carries the price's error (the prices' 5% spread and
    /// a quarter of the price on the probed function, in quadrature) times probe time over own time.
    #[test]
    fn a_pace_estimate_carries_the_price_of_a_hit() {
        let r = report_by_pace(
            json!({"pairs": 10, "sq_diff": 0.0, "weight_sq": 1.0,
               "probe_seconds": 0.05, "own_seconds": 0.25}),
            5_000,
        );
        let u = r.processes[0].apis[0].calls_uncertainty.unwrap();
        let expected = 950_000.0 * 0.05 / 0.25 * 0.05f64.hypot(0.25);
        assert!(
            (u.standard_error.unwrap() - expected).abs() < 1e-6,
            "{u:?} vs {expected}"
        );
        // 4.8% of the estimate, where without the price it would be exact (no spread).
        assert!(
            (u.relative.unwrap() - 0.0484).abs() < 1e-4 && !u.marked,
            "{u:?}"
        );
    }
}
