//! Splitting the time a process spent inside CUDA and NCCL calls into where it went.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{ApiUsage, Process, Source};

/// Where time inside the API went, in seconds over the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Components {
    /// Inside libcuda, outside synchronisation and copies (measured by the probes, or by the
    /// limiter around its driver call), less the probes' own in-band overhead.
    pub driver: f64,
    /// The limiter's own work inside its hooks (its self-time, from the region).
    pub limiter_hook: f64,
    /// Time the limiter held launches back to keep an SM share.
    pub throttled: f64,
    /// Blocked in synchronisation calls (stream, context, event).
    pub sync_wait: f64,
    /// Inside copy calls.
    pub copy_wait: f64,
    /// Inside NCCL calls on the host (enqueueing collectives; they complete asynchronously).
    pub nccl_host: f64,
    /// What the probes themselves added: measured per-hit cost x probed calls.
    pub probe_cost: f64,
}

pub const NAMES: [&str; 7] = [
    "driver",
    "limiter_hook",
    "throttled",
    "sync_wait",
    "copy_wait",
    "nccl_host",
    "probe_cost",
];

impl Components {
    pub fn get(&self, name: &str) -> f64 {
        match name {
            "driver" => self.driver,
            "limiter_hook" => self.limiter_hook,
            "throttled" => self.throttled,
            "sync_wait" => self.sync_wait,
            "copy_wait" => self.copy_wait,
            "nccl_host" => self.nccl_host,
            "probe_cost" => self.probe_cost,
            _ => 0.0,
        }
    }

    fn slot(&mut self, kind: &str) -> &mut f64 {
        match kind {
            "sync" => &mut self.sync_wait,
            "copy" => &mut self.copy_wait,
            "nccl" => &mut self.nccl_host,
            _ => &mut self.driver,
        }
    }

    pub fn total(&self) -> f64 {
        NAMES.iter().map(|n| self.get(n)).sum()
    }

    pub fn add(&mut self, o: &Components) {
        self.driver += o.driver;
        self.limiter_hook += o.limiter_hook;
        self.throttled += o.throttled;
        self.sync_wait += o.sync_wait;
        self.copy_wait += o.copy_wait;
        self.nccl_host += o.nccl_host;
        self.probe_cost += o.probe_cost;
    }
}

/// Per-API time over the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiTime {
    pub api: String,
    pub kind: String,
    pub calls: u64,
    /// Seconds inside the call as attributed (driver, sync, copy or NCCL time).
    pub seconds: f64,
    /// Limiter self-time in this API's hook, seconds.
    pub hook_seconds: f64,
    /// Where the figure came from: `probes`, `limiter`, or `probes_sampled` (launch probes
    /// attached only part of the window: scaled up by the window/sampled ratio).
    pub measured_by: String,
}

/// How the probes measured during the window.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub window_seconds: f64,
    /// Seconds the launch probes were attached (== window when always on, 0 when off).
    pub launch_seconds: f64,
    pub per_hit_ns: f64,
    pub inband_ns: f64,
}

/// The calls of `now` since `before` (the same process in the window's first snapshot).
fn window(now: &Process, before: Option<&Process>) -> Vec<ApiUsage> {
    now.apis
        .iter()
        .map(|a| {
            a.since(before.and_then(|b| {
                b.apis
                    .iter()
                    .find(|e| e.api == a.api && e.source == a.source)
            }))
        })
        .filter(|a| a.calls > 0 || a.hook_ns > 0)
        .collect()
}

/// One process's window, attributed.
#[derive(Debug)]
pub struct Attributed {
    pub components: Components,
    pub apis: Vec<ApiTime>,
    /// Calls the probes saw (each cost one hit).
    pub probed_calls: u64,
}

/// Attributes one process's window. `charged_ns`: the probe cost the agent charged the process
/// over the window (each poll interval's calls at the cost re-measured then); without it, probed
/// calls x the per-hit cost.
pub fn attribute(
    now: &Process,
    before: Option<&Process>,
    s: Sampling,
    charged_ns: Option<f64>,
    exposure: &BTreeMap<String, f64>,
) -> Attributed {
    let apis = window(now, before);
    let mut by_name: BTreeMap<&str, (Option<&ApiUsage>, Option<&ApiUsage>)> = BTreeMap::new();
    for a in &apis {
        let e = by_name.entry(a.api.as_str()).or_default();
        match a.source {
            Source::Probes => e.0 = Some(a),
            Source::Limiter => e.1 = Some(a),
        }
    }
    let mut c = Components::default();
    let mut rows = Vec::new();
    let mut probed_calls = 0;
    let probed_launch_share = if s.window_seconds > 0.0 {
        s.launch_seconds / s.window_seconds
    } else {
        0.0
    };
    for (api, (probes, limiter)) in by_name {
        let kind = probes
            .or(limiter)
            .map(|a| a.kind.clone())
            .unwrap_or_default();
        let in_probes =
            |p: &ApiUsage| (p.total_ns as f64 - p.calls as f64 * s.inband_ns).max(0.0) / 1e9;
        // The share of the process's time this kind was probed: from the sampling schedule's
        // exposure, else (fixed launch windows) the window's.
        let share = exposure.get(&kind).copied().unwrap_or(if kind == "launch" {
            probed_launch_share
        } else {
            1.0
        });
        let (seconds, calls, measured_by) = match (probes, limiter) {
            // Probed only in windows: the limiter saw every call if it is there.
            (Some(_), Some(l)) if share < 0.999 => (l.total_ns as f64 / 1e9, l.calls, "limiter"),
            (Some(p), _) if share < 0.999 && share > 0.0 => (
                in_probes(p) / share,
                (p.calls as f64 / share).round() as u64,
                "probes_sampled",
            ),
            (Some(p), _) => (in_probes(p), p.calls, "probes"),
            (None, Some(l)) => (l.total_ns as f64 / 1e9, l.calls, "limiter"),
            (None, None) => continue,
        };
        *c.slot(&kind) += seconds;
        let hook = limiter.map(|l| l.hook_ns as f64 / 1e9).unwrap_or(0.0);
        c.limiter_hook += hook;
        if let Some(p) = probes {
            c.probe_cost += p.calls as f64 * s.per_hit_ns / 1e9;
            probed_calls += p.calls;
        }
        rows.push(ApiTime {
            api: api.to_owned(),
            kind,
            calls,
            seconds,
            hook_seconds: hook,
            measured_by: measured_by.into(),
        });
    }
    if let Some(ns) = charged_ns {
        c.probe_cost = ns / 1e9;
    }
    let throttled = |p: Option<&Process>| {
        p.and_then(|p| p.limiter.as_ref())
            .map(|l| l.throttled_ns)
            .unwrap_or(0)
    };
    c.throttled = throttled(Some(now)).saturating_sub(throttled(before)) as f64 / 1e9;
    rows.sort_by(|a, b| (b.seconds + b.hook_seconds).total_cmp(&(a.seconds + a.hook_seconds)));
    Attributed {
        components: c,
        apis: rows,
        probed_calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LimiterProcess;

    fn usage(
        api: &str,
        kind: &str,
        source: Source,
        calls: u64,
        total_ns: u64,
        hook_ns: u64,
    ) -> ApiUsage {
        ApiUsage {
            api: api.into(),
            kind: kind.into(),
            source,
            calls,
            errors: 0,
            bytes: 0,
            total_ns,
            hook_ns,
            denied: 0,
            hist: vec![],
            latency: None,
        }
    }

    fn process(apis: Vec<ApiUsage>, throttled_ns: u64) -> Process {
        Process {
            limiter: Some(LimiterProcess {
                region: "r".into(),
                slot: 0,
                held: vec![],
                context_bytes: vec![],
                throttled_ns,
                dropped_records: 0,
                shard_problems: vec![],
            }),
            ..Process::with_apis(apis)
        }
    }

    #[test]
    fn every_component_lands_in_its_place() {
        let now = process(
            vec![
                usage(
                    "cuMemAlloc_v2",
                    "alloc",
                    Source::Probes,
                    100,
                    100 * 1_002_000,
                    0,
                ),
                usage(
                    "cuMemAlloc_v2",
                    "alloc",
                    Source::Limiter,
                    100,
                    100 * 1_000_000,
                    100 * 5_000,
                ),
                usage(
                    "cuStreamSynchronize",
                    "sync",
                    Source::Probes,
                    10,
                    10 * 20_002_000,
                    0,
                ),
                usage(
                    "cuMemcpyHtoD_v2",
                    "copy",
                    Source::Probes,
                    50,
                    50 * 302_000,
                    0,
                ),
                usage("ncclAllReduce", "nccl", Source::Probes, 20, 20 * 12_000, 0),
                usage(
                    "cuLaunchKernel",
                    "launch",
                    Source::Limiter,
                    1000,
                    1000 * 3_000,
                    1000 * 40,
                ),
            ],
            250_000_000,
        );
        let s = Sampling {
            window_seconds: 10.0,
            launch_seconds: 0.0,
            per_hit_ns: 1_500.0,
            inband_ns: 2_000.0,
        };
        let Attributed {
            components: c,
            apis: rows,
            ..
        } = attribute(&now, None, s, None, &BTreeMap::new());
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // Probed alloc (in-band overhead removed) + limiter-timed launches.
        assert!(close(c.driver, 0.100 + 0.003), "{c:?}");
        assert!(close(c.sync_wait, 0.200), "{c:?}");
        assert!(close(c.copy_wait, 0.015), "{c:?}");
        assert!(close(c.nccl_host, 20.0 * 10_000.0 / 1e9), "{c:?}");
        assert!(close(c.limiter_hook, 0.0005 + 0.00004), "{c:?}");
        assert!(close(c.throttled, 0.25), "{c:?}");
        assert!(close(c.probe_cost, 180.0 * 1_500.0 / 1e9), "{c:?}");
        let launch = rows.iter().find(|r| r.api == "cuLaunchKernel").unwrap();
        assert_eq!(
            (launch.calls, launch.measured_by.as_str()),
            (1000, "limiter")
        );
        assert_eq!(rows[0].api, "cuStreamSynchronize", "largest first");
    }

    #[test]
    fn sampled_launch_probes_are_scaled_to_the_window() {
        let now = process(
            vec![usage(
                "cuLaunchKernel",
                "launch",
                Source::Probes,
                100,
                100 * 5_000,
                0,
            )],
            0,
        );
        let s = Sampling {
            window_seconds: 10.0,
            launch_seconds: 1.0,
            per_hit_ns: 1_000.0,
            inband_ns: 1_000.0,
        };
        let Attributed {
            components: c,
            apis: rows,
            ..
        } = attribute(&now, None, s, None, &BTreeMap::new());
        assert!(
            (c.driver - 10.0 * 100.0 * 4_000.0 / 1e9).abs() < 1e-9,
            "{c:?}"
        );
        assert_eq!(
            (rows[0].calls, rows[0].measured_by.as_str()),
            (1000, "probes_sampled")
        );
        assert!(
            (c.probe_cost - 100.0 * 1_000.0 / 1e9).abs() < 1e-12,
            "only the probed calls cost"
        );
    }

    #[test]
    fn throttling_is_the_region_delta_over_the_window() {
        let launches = |calls: u64| {
            vec![usage(
                "cuLaunchKernel",
                "launch",
                Source::Limiter,
                calls,
                calls * 3_000,
                0,
            )]
        };
        let before = process(launches(1_000), 400_000_000);
        let now = process(launches(3_000), 1_650_000_000);
        let s = Sampling {
            window_seconds: 10.0,
            launch_seconds: 0.0,
            per_hit_ns: 1_000.0,
            inband_ns: 0.0,
        };
        let a = attribute(&now, Some(&before), s, None, &BTreeMap::new());
        assert!((a.components.throttled - 1.25).abs() < 1e-9, "{a:?}");
        assert!((a.components.driver - 2_000.0 * 3_000.0 / 1e9).abs() < 1e-12);
        assert!((a.components.total() - 1.25 - 0.006).abs() < 1e-9);
        // A counter that went back (a reused slot) is no throttling, not a negative one.
        let reset = process(launches(3_000), 100);
        let a = attribute(&reset, Some(&before), s, None, &BTreeMap::new());
        assert_eq!(a.components.throttled, 0.0);
    }
}
