//! Splitting the time a process spent inside CUDA and NCCL calls into where it went.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::uncertainty::{
    ComponentSums, HIT_PRICE_SYSTEMATIC, Sum, Uncertainty, hit_price_relative_se,
};
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
    /// Where the figure came from: `probes` (every call probed), `limiter` (its in-process
    /// count and timing around the driver call, less what the probe hits in it cost), or
    /// `probes_sampled` (probed only in windows: `calls` is the schedule's estimate, `seconds`
    /// the probed calls' mean time times it).
    pub measured_by: String,
    /// Where the probes measured the time: the in-band part of their hits taken out of the probed
    /// calls' measured latencies (seconds, before any scaling), so that `seconds` plus this is
    /// what the probes measured (for `probes` rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_inband_seconds: Option<f64>,
    /// With `probes_sampled`: the calls the probes saw, of the `calls` estimated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed_calls: Option<u64>,
    /// How sure `calls` and `seconds` are, where they are estimates (absent where exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_uncertainty: Option<Uncertainty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_uncertainty: Option<Uncertainty>,
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

/// A sampled kind's calls over the window as the sampling schedule estimated them (its probed
/// calls and the calls estimated for the detached gaps), and one standard error of that.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub calls: f64,
    pub standard_error: Option<f64>,
}

/// The probe cost charged to a process over the window, ns, and one standard error of it;
/// `inband_ns`: the part of it inside the latencies the probes measured (`None`: not known, the
/// class's current figure is used).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Charged {
    pub ns: f64,
    pub se_ns: f64,
    pub inband_ns: Option<f64>,
    /// Hits in `ns` that no call was counted for (see `ProbeCost::unpaired_hits`).
    pub unpaired_hits: u64,
}

/// The calls of `now` since `before` (the same process in the window's first snapshot), as the
/// probes saw them (the sampled kinds' estimates are made here, with their uncertainty).
fn window(now: &Process, before: Option<&Process>) -> Vec<ApiUsage> {
    now.probed_apis_since(before)
        .filter(|a| a.calls > 0 || a.hook_ns > 0)
        .collect()
}

/// One process's window, attributed.
#[derive(Debug)]
pub struct Attributed {
    pub components: Components,
    /// The standard errors of the components that are estimates.
    pub uncertainty: ComponentSums,
    pub apis: Vec<ApiTime>,
    /// Calls the probes saw (each cost one hit).
    pub probed_calls: u64,
}

/// Attributes one process's window. `charged`: the probe cost the agent charged the process
/// over the window (each poll interval's calls at the cost re-measured then); without it, probed
/// calls x the per-hit cost. `estimates`: each sampled kind's calls as the sampling schedule
/// estimated them (a kind absent is probed whole, or in the fixed launch windows).
pub fn attribute(
    now: &Process,
    before: Option<&Process>,
    s: Sampling,
    charged: Option<Charged>,
    estimates: &BTreeMap<String, Estimate>,
) -> Attributed {
    let apis = window(now, before);
    let mut by_name: BTreeMap<&str, (Option<&ApiUsage>, Option<&ApiUsage>)> = BTreeMap::new();
    let mut probed_of_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &apis {
        let e = by_name.entry(a.api.as_str()).or_default();
        match a.source {
            Source::Probes => {
                e.0 = Some(a);
                *probed_of_kind.entry(a.kind.as_str()).or_default() += a.calls;
            }
            Source::Limiter => e.1 = Some(a),
        }
    }
    let probed_calls: u64 = probed_of_kind.values().sum();
    // What one probe hit cost this process over the window (its charges over its probed calls),
    // and one standard error of that: the limiter's timing of a probed call includes a hit.
    // Its hits are its probed calls and its unpaired returns; only the calls were timed.
    let hit = match charged {
        Some(c) if probed_calls > 0 => {
            let hits = (probed_calls + c.unpaired_hits) as f64;
            Charged {
                ns: c.ns / hits,
                se_ns: c.se_ns / hits,
                inband_ns: c.inband_ns.map(|i| i / probed_calls as f64),
                unpaired_hits: 0,
            }
        }
        _ => Charged {
            ns: s.per_hit_ns,
            se_ns: 0.0,
            inband_ns: None,
            unpaired_hits: 0,
        },
    };
    // What each probed call's measured latency is corrected by: the in-band part of the hits
    // it was charged over the window, else the class's current figure.
    let inband_ns = hit.inband_ns.unwrap_or(s.inband_ns);
    let mut c = Components::default();
    let mut uncertainty = ComponentSums::new();
    let mut rows = Vec::new();
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
            |p: &ApiUsage| (p.total_ns as f64 - p.calls as f64 * inband_ns).max(0.0) / 1e9;
        // The kind's probed calls stand for `scale` times as many: the schedule's estimate
        // where it sampled the kind (with its standard error, relative), the fixed launch
        // windows' share of the window otherwise (its error unknown).
        let probed_kind = probed_of_kind.get(kind.as_str()).copied().unwrap_or(0);
        let (scale, relative_se) = match estimates.get(&kind) {
            Some(e) if probed_kind > 0 && e.calls > probed_kind as f64 * 1.001 => (
                e.calls / probed_kind as f64,
                e.standard_error.map(|se| se / e.calls),
            ),
            Some(_) => (1.0, Some(0.0)),
            None if kind == "launch"
                && probed_launch_share > 0.0
                && probed_launch_share < 0.999 =>
            {
                (1.0 / probed_launch_share, None)
            }
            None => (1.0, Some(0.0)),
        };
        let sampled = scale > 1.0;
        // What a probed call's latency is corrected by, the in-band part of its hit, is unsure
        // by a share of the price on the probed function (seconds, one standard error, over
        // `hits` calls: the same for every call of the function, so linear).
        let inband_error =
            |hits: f64| Sum::correlated(Some(hits * hit.ns * HIT_PRICE_SYSTEMATIC / 1e9));
        let limiter_row = |l: &ApiUsage, probed: u64| {
            // The limiter times its call into the driver: a probed call's hit is inside it, taken
            // out at its price, which is unsure by the prices' spread and by what a hit costs
            // the probed function beyond them.
            let hits_ns = probed as f64 * hit.ns;
            let seconds = (l.total_ns as f64 - hits_ns).max(0.0) / 1e9;
            let relative = hit_price_relative_se(if hit.ns > 0.0 {
                hit.se_ns / hit.ns
            } else {
                0.0
            });
            let error = Sum::correlated(Some(hits_ns * relative / 1e9));
            (seconds, l.calls, "limiter", None, Some(error))
        };
        // (seconds, calls, source, calls' standard error, seconds' error)
        let (seconds, calls, measured_by, calls_se, seconds_error) = match (probes, limiter) {
            // The limiter counts every call exactly: its figures for launches always (the hot
            // path, which the probes only sample), for any kind the probes sampled, and for any
            // whose calls the probes did not all see (probed only until the agent found the
            // process's region slot and left its calls to the limiter).
            (Some(p), Some(l)) if sampled || kind == "launch" || l.calls > p.calls => {
                limiter_row(l, p.calls)
            }
            (Some(p), _) if sampled => {
                let calls = p.calls as f64 * scale;
                let seconds = in_probes(p) * scale;
                // The sampling's error, and the in-band correction's (each probed call's
                // latency less the in-band part of its hit, scaled up with it).
                let mut error = Sum::independent(relative_se.map(|r| r * seconds));
                error.add(&inband_error(p.calls as f64 * scale));
                (
                    seconds,
                    calls.round() as u64,
                    "probes_sampled",
                    Some(relative_se.map(|r| r * calls)),
                    Some(error),
                )
            }
            // Every call probed: only the in-band correction is an estimate.
            (Some(p), _) => (
                in_probes(p),
                p.calls,
                "probes",
                None,
                Some(inband_error(p.calls as f64)),
            ),
            (None, Some(l)) => limiter_row(l, 0),
            (None, None) => continue,
        };
        // A time with no error at all (no hit inside it, nothing sampled) is exact.
        let seconds_error = seconds_error.filter(|e| e.standard_error() != Some(0.0));
        *c.slot(&kind) += seconds;
        if let Some(error) = &seconds_error {
            uncertainty.entry(slot_name(&kind)).or_default().add(error);
        }
        let hook = limiter.map(|l| l.hook_ns as f64 / 1e9).unwrap_or(0.0);
        c.limiter_hook += hook;
        if let Some(p) = probes {
            c.probe_cost += p.calls as f64 * s.per_hit_ns / 1e9;
        }
        rows.push(ApiTime {
            api: api.to_owned(),
            kind,
            calls,
            seconds,
            hook_seconds: hook,
            measured_by: measured_by.into(),
            probe_inband_seconds: probes
                .filter(|_| measured_by != "limiter")
                .map(|p| p.calls as f64 * inband_ns / 1e9),
            probed_calls: probes
                .filter(|_| measured_by == "probes_sampled")
                .map(|p| p.calls),
            calls_uncertainty: calls_se.map(|se| Uncertainty::of(calls as f64, se)),
            seconds_uncertainty: seconds_error
                .map(|e| Uncertainty::of(seconds, e.standard_error())),
        });
    }
    match charged {
        Some(ch) => {
            c.probe_cost = ch.ns / 1e9;
            if ch.ns > 0.0 {
                // The prices' spread, and what a hit costs the probed function beyond them.
                let se_ns = ch.ns * hit_price_relative_se(ch.se_ns / ch.ns);
                uncertainty.insert("probe_cost", Sum::correlated(Some(se_ns / 1e9)));
            }
        }
        // Priced without a calibration: how far off is not known.
        None if c.probe_cost > 0.0 => {
            uncertainty.insert("probe_cost", Sum::correlated(None));
        }
        None => {}
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
        uncertainty,
        apis: rows,
        probed_calls,
    }
}

/// The component an API kind's time goes to.
fn slot_name(kind: &str) -> &'static str {
    match kind {
        "sync" => "sync_wait",
        "copy" => "copy_wait",
        "nccl" => "nccl_host",
        _ => "driver",
    }
}

#[cfg(test)]
mod tests {
    //! Attribution of one process's window from generated snapshots: every component in its place,
    //! sampled kinds scaled by the schedule's estimate with its uncertainty, launches from the
    //! limiter.

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
            probed: None,
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
                ..Default::default()
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

    fn sampling(per_hit_ns: f64, inband_ns: f64) -> Sampling {
        Sampling {
            window_seconds: 10.0,
            launch_seconds: 10.0,
            per_hit_ns,
            inband_ns,
        }
    }

    /// Launches sampled in windows (two entry points), the schedule's estimate of them 1,000,000
    /// with a standard error of 30,000: each row's count and time scaled by the estimate over the
    /// probed calls, and their uncertainty the estimate's, relative.
    #[test]
    fn sampled_kinds_are_scaled_to_the_schedules_estimate_and_carry_its_uncertainty() {
        let now = process(
            vec![
                usage(
                    "cuLaunchKernel",
                    "launch",
                    Source::Probes,
                    40_000,
                    40_000 * 5_000,
                    0,
                ),
                usage(
                    "cuLaunchKernelEx",
                    "launch",
                    Source::Probes,
                    10_000,
                    10_000 * 6_000,
                    0,
                ),
                usage(
                    "cuStreamSynchronize",
                    "sync",
                    Source::Probes,
                    3_000,
                    3_000 * 50_000,
                    0,
                ),
            ],
            0,
        );
        let estimates: BTreeMap<String, Estimate> = [(
            "launch".to_owned(),
            Estimate {
                calls: 1_000_000.0,
                standard_error: Some(30_000.0),
            },
        )]
        .into();
        let charged = Charged {
            ns: 53_000.0 * 2_000.0,
            se_ns: 53_000.0 * 300.0,
            inband_ns: Some(53_000.0 * 1_000.0),
            unpaired_hits: 0,
        };
        let a = attribute(
            &now,
            None,
            sampling(2_000.0, 1_000.0),
            Some(charged),
            &estimates,
        );
        let row = |api: &str| a.apis.iter().find(|r| r.api == api).unwrap();
        let (k, ex) = (row("cuLaunchKernel"), row("cuLaunchKernelEx"));
        assert_eq!((k.calls, ex.calls), (800_000, 200_000));
        assert_eq!(k.measured_by, "probes_sampled");
        // 20x: each probed launch's time less the in-band part of its hit.
        assert!(
            (k.seconds - 20.0 * 40_000.0 * 4_000e-9).abs() < 1e-9,
            "{k:?}"
        );
        assert!(
            (ex.seconds - 20.0 * 10_000.0 * 5_000e-9).abs() < 1e-9,
            "{ex:?}"
        );
        let (cu, su) = (k.calls_uncertainty.unwrap(), k.seconds_uncertainty.unwrap());
        assert_eq!(cu.relative, Some(0.03));
        // The time: the estimate's 3%, and the in-band correction of the 800,000 launches it
        // stands for, a quarter of the 2 us price each (0.4 s of 3.2 s), linearly.
        let systematic = |hits: f64| hits * 2_000e-9 * HIT_PRICE_SYSTEMATIC;
        assert!(
            (su.standard_error.unwrap() - (k.seconds * 0.03 + systematic(800_000.0))).abs() < 1e-12,
            "{su:?}"
        );
        assert!((su.relative.unwrap() - 0.155).abs() < 1e-12 && su.marked);
        // Synchronisations probed whole: an exact count, their time only as unsure as the in-band
        // correction of 3,000 hits (1.5 ms of 147 ms).
        let sync = row("cuStreamSynchronize");
        assert_eq!((sync.calls, sync.measured_by.as_str()), (3_000, "probes"));
        assert!(sync.calls_uncertainty.is_none());
        let ss = sync.seconds_uncertainty.unwrap();
        assert!((ss.standard_error.unwrap() - systematic(3_000.0)).abs() < 1e-12);
        assert!(!ss.marked, "{ss:?}");
        // The driver component's error: the two rows' sampling (quadrature) and their in-band
        // corrections (linearly); the probe cost's: the prices' spread and the price's error (in
        // quadrature: independent).
        let driver_se = a.uncertainty["driver"].standard_error().unwrap();
        let expected = (k.seconds * 0.03).hypot(ex.seconds * 0.03) + systematic(1_000_000.0);
        assert!(
            (driver_se - expected).abs() < 1e-12,
            "{driver_se} vs {expected}"
        );
        assert!(
            (a.uncertainty["probe_cost"].standard_error().unwrap()
                - 53_000.0 * 300e-9f64.hypot(2_000e-9 * HIT_PRICE_SYSTEMATIC))
            .abs()
                < 1e-12
        );
        assert!(
            (a.uncertainty["sync_wait"].standard_error().unwrap() - systematic(3_000.0)).abs()
                < 1e-12
        );
        assert_eq!(a.probed_calls, 53_000);
        // 7,000 more hits at a window's edge, charged but with no call counted: the probe cost
        // grows by their price, the calls' time and the price of a hit stay as they were.
        let edged = Charged {
            ns: 60_000.0 * 2_000.0,
            unpaired_hits: 7_000,
            ..charged
        };
        let b = attribute(
            &now,
            None,
            sampling(2_000.0, 1_000.0),
            Some(edged),
            &estimates,
        );
        assert!((b.components.probe_cost - 60_000.0 * 2_000e-9).abs() < 1e-12);
        assert_eq!(b.components.driver, a.components.driver);
        assert_eq!(
            b.uncertainty["driver"].standard_error(),
            a.uncertainty["driver"].standard_error()
        );
    }

    /// A limited process's synchronisations probed only until the agent left them to the
    /// limiter: the limiter's row, which counted them all, is the figure; while both saw every
    /// call, the probes' stays.
    #[test]
    fn the_limiters_row_stands_for_calls_the_probes_saw_only_some_of() {
        let rows = |probed: u64| {
            process(
                vec![
                    usage(
                        "cuCtxSynchronize",
                        "sync",
                        Source::Probes,
                        probed,
                        probed * 20_000,
                        0,
                    ),
                    usage(
                        "cuCtxSynchronize",
                        "sync",
                        Source::Limiter,
                        1_954,
                        1_954 * 18_000,
                        1_954 * 100,
                    ),
                ],
                0,
            )
        };
        let a = attribute(
            &rows(89),
            None,
            sampling(2_000.0, 1_000.0),
            None,
            &BTreeMap::new(),
        );
        let sync = &a.apis[0];
        assert_eq!((sync.calls, sync.measured_by.as_str()), (1_954, "limiter"));
        // Its 89 probed calls' hits are taken out of the limiter's timing.
        assert!((sync.seconds - (1_954.0 * 18_000.0 - 89.0 * 2_000.0) / 1e9).abs() < 1e-12);
        let b = attribute(
            &rows(1_954),
            None,
            sampling(2_000.0, 1_000.0),
            None,
            &BTreeMap::new(),
        );
        assert_eq!(b.apis[0].measured_by, "probes");
    }

    /// An estimate from a single window has no known spread: the rows say so (and are marked).
    #[test]
    fn an_estimate_of_unknown_spread_is_marked() {
        let now = process(
            vec![usage(
                "cuLaunchKernel",
                "launch",
                Source::Probes,
                1_000,
                1_000 * 5_000,
                0,
            )],
            0,
        );
        let estimates = [(
            "launch".to_owned(),
            Estimate {
                calls: 9_000.0,
                standard_error: None,
            },
        )]
        .into();
        let a = attribute(&now, None, sampling(2_000.0, 0.0), None, &estimates);
        let u = a.apis[0].calls_uncertainty.unwrap();
        assert!(u.standard_error.is_none() && u.marked, "{u:?}");
        assert_eq!(a.uncertainty["driver"].standard_error(), None);
        // Priced without a calibration: its error is not known either.
        assert_eq!(a.uncertainty["probe_cost"].standard_error(), None);
    }

    /// With the limiter in the process, its exact count and timing give the launch figures, whether
    /// the probes sampled launches or saw them all; a probed launch's hit, inside the limiter's
    /// timing of its driver call, is taken out of it at the process's charged cost per hit.
    #[test]
    fn launches_come_from_the_limiter_less_the_hits_inside_its_timing() {
        for estimated in [true, false] {
            let now = process(
                vec![
                    usage(
                        "cuLaunchKernel",
                        "launch",
                        Source::Probes,
                        20_000,
                        20_000 * 5_200,
                        0,
                    ),
                    usage(
                        "cuLaunchKernel",
                        "launch",
                        Source::Limiter,
                        1_000_000,
                        1_000_000 * 3_000 + 20_000 * 2_000,
                        0,
                    ),
                ],
                0,
            );
            let estimates: BTreeMap<String, Estimate> = if estimated {
                [(
                    "launch".to_owned(),
                    Estimate {
                        calls: 990_000.0,
                        standard_error: Some(200_000.0),
                    },
                )]
                .into()
            } else {
                BTreeMap::new()
            };
            let charged = Charged {
                ns: 20_000.0 * 2_000.0,
                se_ns: 20_000.0 * 100.0,
                inband_ns: None,
                unpaired_hits: 0,
            };
            let a = attribute(
                &now,
                None,
                sampling(1_500.0, 1_000.0),
                Some(charged),
                &estimates,
            );
            let launch = &a.apis[0];
            assert_eq!(
                (launch.calls, launch.measured_by.as_str()),
                (1_000_000, "limiter")
            );
            assert!((launch.seconds - 3.0).abs() < 1e-9, "{launch:?}");
            assert!(launch.calls_uncertainty.is_none(), "the count is exact");
            // The 20,000 hits taken out: the prices' spread, and a quarter of the price each, in
            // quadrature.
            let se = launch.seconds_uncertainty.unwrap();
            let expected = 20_000.0 * 100e-9f64.hypot(2_000e-9 * HIT_PRICE_SYSTEMATIC);
            assert!(
                (se.standard_error.unwrap() - expected).abs() < 1e-12,
                "{se:?}"
            );
            assert!(!se.marked);
            assert!((a.components.driver - 3.0).abs() < 1e-9);
            assert!((a.components.probe_cost - 0.04).abs() < 1e-12);
        }
    }
}
