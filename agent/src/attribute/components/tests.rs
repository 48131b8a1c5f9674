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
        (a.uncertainty["sync_wait"].standard_error().unwrap() - systematic(3_000.0)).abs() < 1e-12
    );
    assert_eq!(a.probed_calls, 53_000);
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
