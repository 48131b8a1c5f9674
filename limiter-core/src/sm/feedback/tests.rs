use super::*;

/// A plant in virtual time: the process gets `gain` times its effective share (contention below
/// 1, a window's CPU gaps counted as idle above 1), capped at 100; NVML averages each sample
/// period (1/6 s) and publishes the sample `lag_ms` later, with a deterministic +-2 point noise.
/// Returns the true share (percent) at each tick after `settle_s`, and the time (s) after which
/// it stayed within 3 points of the target.
fn plant(target: u8, gain: f64, lag_ms: u64, run_s: u64) -> (Vec<f64>, f64) {
    let mut lp = Loop::new(target);
    let sample_ms = 167;
    let mut pending: VecDeque<(u32, u64, u32)> = VecDeque::new();
    let (mut acc, mut n, mut next_sample, mut next_tick) = (0.0, 0u32, sample_ms, 500);
    let mut seed = 12345u64;
    let mut shares = Vec::new();
    let mut settled_at = 0.0;
    for t in 1..=run_s * 1000 {
        let share = (gain * lp.effective()).min(100.0);
        acc += share;
        n += 1;
        if t >= next_sample {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = ((seed >> 33) % 5) as f64 - 2.0;
            pending.push_back((
                1,
                t * 1000,
                (acc / f64::from(n) + noise).max(0.0).round() as u32,
            ));
            (acc, n) = (0.0, 0);
            next_sample += sample_ms;
        }
        if t >= next_tick {
            next_tick += 500;
            let fresh: Vec<_> = pending
                .iter()
                .filter(|s| s.1 / 1000 + lag_ms <= t)
                .copied()
                .collect();
            pending.retain(|s| s.1 / 1000 + lag_ms > t);
            // Binding unless the process is already at 100% effective.
            lp.tick(t, &fresh, lp.effective() < 100.0);
            let share = (gain * lp.effective()).min(100.0);
            if (share - f64::from(target)).abs() >= 3.0 {
                settled_at = t as f64 / 1000.0;
            }
            shares.push(share);
        }
    }
    (shares, settled_at)
}

#[test]
fn converges_within_10_s_without_oscillating_for_any_contention_and_lag() {
    // Miri interprets every millisecond of the plant: one contention and the longest lag there.
    let (plants, lags): (&[(u8, f64)], &[u64]) = if cfg!(miri) {
        (&[(60, 0.62)], &[1000])
    } else {
        (
            &[
                (60, 0.62),
                (60, 0.75),
                (40, 0.5),
                (50, 1.0),
                (40, 1.3),
                (30, 1.6),
            ],
            &[200, 600, 1000],
        )
    };
    for &(target, gain) in plants {
        for &lag_ms in lags {
            let (shares, settled) = plant(target, gain, lag_ms, 40);
            eprintln!("target {target}, gain {gain}, lag {lag_ms} ms: settled after {settled} s");
            assert!(
                settled <= 10.0,
                "target {target}, gain {gain}, lag {lag_ms} ms: settled at {settled} s: {shares:?}"
            );
            // Steady state: within 3 points for the last 30 s (no limit cycle).
            let late = &shares[20..];
            let worst = late
                .iter()
                .map(|s| (s - f64::from(target)).abs())
                .fold(0.0, f64::max);
            assert!(
                worst < 3.0,
                "target {target}, gain {gain}, lag {lag_ms}: {shares:?}"
            );
        }
    }
}

#[test]
fn effective_share_stays_within_half_the_target_and_100() {
    // Measured far above: lowered, but not below target / 2.
    let mut lp = Loop::new(40);
    for t in 1..100 {
        lp.tick(t * 500, &[(1, t * 500_000, 100)], true);
    }
    assert_eq!(lp.effective(), 20.0);
    // Measured far below: raised, but not above 100.
    let mut lp = Loop::new(40);
    for t in 1..100 {
        lp.tick(t * 500, &[(1, t * 500_000, 0)], true);
    }
    assert_eq!(lp.effective(), 100.0);
}

#[test]
fn holds_in_the_dead_band_without_samples_and_while_the_limit_does_not_bind() {
    let mut lp = Loop::new(50);
    lp.tick(500, &[(1, 500_000, 51)], true);
    assert_eq!(lp.effective(), 50.0, "dead band");
    lp.tick(1000, &[], true);
    assert_eq!(lp.effective(), 50.0, "no sample");
    // A process that launches little is below its share on its own: not raised...
    let mut lp = Loop::new(50);
    for t in 1..10 {
        lp.tick(t * 500, &[(1, t * 500_000, 10)], false);
    }
    assert_eq!(lp.effective(), 50.0, "raised while not binding");
    // ...but one above its share is lowered even so (once the averaged samples say so).
    for t in 10..20 {
        lp.tick(t * 500, &[(1, t * 500_000, 70)], false);
    }
    assert!(lp.effective() < 50.0);
}

#[test]
fn one_step_is_bounded() {
    let mut lp = Loop::new(50);
    lp.tick(500, &[(1, 500_000, 5)], true);
    assert!(lp.effective() <= 50.0 + MAX_STEP, "{}", lp.effective());
    assert!(lp.effective() > 50.0);
}

#[test]
fn the_container_share_is_the_sum_of_its_processes() {
    // Two processes at 25% and 15% are 40% together: on target.
    let mut lp = Loop::new(40);
    let mut t = 0;
    for k in 1..10u64 {
        t = k * 500;
        let fresh = [(1, k * 500_000, 25), (2, k * 500_000 + 7, 15)];
        lp.tick(t, &fresh, true);
    }
    let near = |m: Option<f64>, want: f64| m.is_some_and(|m| (m - want).abs() < 0.01);
    assert!(near(lp.measured(), 40.0), "{:?}", lp.measured());
    assert_eq!(lp.effective(), 40.0);
    // A sample NVML returns again is not counted twice; a process that left ages out.
    lp.tick(
        t + 500,
        &[(1, 9 * 500_000, 25), (2, 9 * 500_000 + 7, 15)],
        true,
    );
    assert!(near(lp.measured(), 40.0), "{:?}", lp.measured());
    for k in 10..20u64 {
        lp.tick(k * 500, &[(1, k * 500_000, 25)], true);
    }
    assert!(near(lp.measured(), 25.0), "{:?}", lp.measured());
    assert!(
        lp.effective() > 40.0,
        "raised: the container is below its share"
    );
}

#[test]
fn a_correction_that_changes_hands_resumes_where_it_was() {
    let lp = Loop::resume(40, 66.0);
    assert_eq!((lp.target(), lp.effective()), (40.0, 66.0));
    assert_eq!(Loop::resume(40, 5.0).effective(), 20.0, "within its bounds");
}

/// One NVML query: when it was made (us) and the samples it returned, `(pid, timestamp us,
/// smUtil)`.
type Query = (u64, Vec<(u32, u64, u32)>);

/// The queries an H100 with driver 580 answered while a saturating process (pid 611) and one at
/// a 30% SM limit (pid 632) shared it, one every 250 ms: `(query time us, [(pid, timestamp us,
/// smUtil)])`. The driver returned only each process's newest sample; `nvidia-smi pmon` read
/// 67.8% and 30.5% meanwhile (docs/gpu-validation.md).
fn recorded_h100_queries() -> Vec<Query> {
    let number = |s: &str| -> u64 { s.trim().parse().unwrap() };
    include_str!("testdata/h100-580-newest-sample-both.jsonl")
        .lines()
        .map(|line| {
            let t = line
                .split("\"t_us\": ")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            let list = line.split("\"samples\": [").nth(1).unwrap();
            let samples = list
                .split('[')
                .filter_map(|e| e.split(']').next())
                .filter(|e| !e.trim().is_empty())
                .map(|e| {
                    let f: Vec<u64> = e.split(',').map(number).collect();
                    (f[0] as u32, f[1], f[2] as u32)
                })
                .collect();
            (number(t), samples)
        })
        .collect()
}

#[test]
fn recorded_h100_samples_measure_what_pmon_read() {
    let queries = recorded_h100_queries();
    assert!(queries.len() > 60, "{} queries", queries.len());
    // Every recorded query (250 ms apart), and one in two (the loop's 500 ms ticks).
    for step in [1, 2] {
        for (pid, pmon) in [(611u32, 67.8), (632, 30.5)] {
            let mut lp = Loop::new(50);
            let mut measured = Vec::new();
            for (k, (t_us, samples)) in queries.iter().step_by(step).enumerate() {
                let ours: Vec<_> = samples.iter().filter(|s| s.0 == pid).copied().collect();
                lp.tick(t_us / 1000, &ours, false);
                // Once the averaged span is full.
                if k * step >= 14 {
                    measured.push(lp.measured().unwrap());
                }
            }
            let mean = measured.iter().sum::<f64>() / measured.len() as f64;
            eprintln!("1 query in {step}, pid {pid}: {mean:.1}% against pmon's {pmon}%");
            assert!(
                (mean - pmon).abs() < 3.0,
                "1 query in {step}, pid {pid}: measured {mean:.1}% on average against pmon's \
                 {pmon}%: {measured:?}"
            );
        }
    }
}

#[test]
fn a_duty_cycled_process_is_measured_at_its_duty_whichever_samples_the_driver_returns() {
    // Busy at 100% in 3 of every 10 periods of 100 ms, idle otherwise (no sample then).
    let busy = |period: u64| period % 10 < 3;
    // Every sample: one per busy period, delivered at each 500 ms tick.
    let mut lp = Loop::new(50);
    for tick in 1..=40u64 {
        let fresh: Vec<_> = (tick * 5 - 5..tick * 5)
            .filter(|&p| busy(p))
            .map(|p| (1, (p + 1) * 100_000, 100))
            .collect();
        lp.tick(tick * 500, &fresh, false);
    }
    let m = lp.measured().unwrap();
    assert!((m - 30.0).abs() < 3.0, "every sample: {m}");
    // Newest sample only: each query sees the newest busy period's sample, which stands for
    // the time since the one before (here 1 s apart, busy 30% of it on average).
    let mut lp = Loop::new(50);
    for tick in 1..=40u64 {
        // The newest busy period ending at or before this tick, every other tick a new one.
        let newest = (tick / 2) * 1_000_000;
        lp.tick(tick * 500, &[(1, newest, 30)], false);
    }
    let m = lp.measured().unwrap();
    assert!((m - 30.0).abs() < 3.0, "newest sample only: {m}");
}

#[test]
fn samples_read_between_ticks_count_at_the_next_tick() {
    // A newest-sample-only driver read every 100 ms: each read brings at most one new sample of
    // the process, which stands for the time since its previous one.
    let mut lp = Loop::new(50);
    let mut t_us = 0;
    for tick in 1..=20u64 {
        for read in 0..5 {
            // A sample every 200 ms, at 30% for 3 s, then at 60%.
            if read % 2 == 0 {
                t_us += 200_000;
                lp.observe(&[(7, t_us, if tick <= 10 { 30 } else { 60 })]);
            }
        }
        lp.tick(tick * 500, &[], false);
        if tick == 10 {
            let m = lp.measured().unwrap();
            assert!((m - 30.0).abs() < 0.5, "{m}");
        }
    }
    let m = lp.measured().unwrap();
    assert!((m - 60.0).abs() < 0.5, "the newest 3 s: {m}");
    // A tick with nothing observed since the last one leaves everything as it was.
    let before = (lp.measured(), lp.effective());
    lp.tick(10_500, &[], true);
    assert_eq!((lp.measured(), lp.effective()), before);
}

#[test]
fn a_query_with_two_samples_of_one_process_means_the_driver_keeps_every_sample() {
    // Busy in 3 periods of 100 ms out of every 10; the driver publishes one new sample per query
    // and keeps every sample, so a query looking back `LOOKBACK_US` returns those already held
    // beside the new one. Each then stands for one period (30% busy), not for the time since the
    // previous sample (which would read 100%).
    let busy: Vec<u64> = (0..40u64)
        .flat_map(|s| [s * 10, s * 10 + 1, s * 10 + 2])
        .map(|p| (p + 1) * 100_000)
        .collect();
    let mut lp = Loop::new(50);
    let mut published = 0;
    for tick in 1..=60u64 {
        let now_us = tick * 500_000;
        if published < busy.len() && busy[published] <= now_us {
            published += 1;
        }
        let newest = busy[..published].last().copied().unwrap_or(0);
        let returned: Vec<(u32, u64, u32)> = busy[..published]
            .iter()
            .filter(|&&t| t + LOOKBACK_US > newest)
            .map(|&t| (1, t, 100))
            .collect();
        lp.tick(tick * 500, &returned, false);
    }
    let m = lp.measured().unwrap();
    assert!((m - 30.0).abs() < 5.0, "busy 30% of the time read as {m}%");
}
