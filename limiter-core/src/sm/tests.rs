//! The controller against a simulated device in virtual time: deterministic, so the steady-state
//! error is checked tightly across kernel lengths and queue depths.

use std::cell::Cell;

use super::*;

/// A device in virtual time: launches queue work after earlier work; the workload costs
/// `cpu_ns` per launch and synchronises every `sync_every` launches.
struct Sim {
    now: Cell<u64>,
    busy_until: Cell<u64>,
    /// Device-busy nanoseconds launched so far.
    busy: Cell<u64>,
    drains: Cell<u32>,
}

impl Env for &Sim {
    fn device(&self) -> Option<usize> {
        Some(0)
    }
    fn now_ns(&self) -> u64 {
        self.now.get()
    }
    fn drain(&self) {
        self.drains.set(self.drains.get() + 1);
        self.now.set(self.now.get().max(self.busy_until.get()));
    }
    fn sleep_until(&self, t: u64) {
        // A real sleep overshoots a little.
        self.now.set(self.now.get().max(t) + 60_000);
    }
}

struct Run {
    share: f64,
    throttled_ns: u64,
    wall_ns: u64,
}

/// Runs a saturating workload for `seconds` of virtual time and returns the device's busy share
/// after the first second.
fn run(pct: u8, kernel_ns: u64, sync_every: u64, seconds: u64) -> Run {
    run_on(&limited(pct), kernel_ns, sync_every, seconds)
}

/// A controller with device 0 limited to `pct`% (period 100 ms).
fn limited(pct: u8) -> Controller {
    let c = Controller::new();
    let mut limits = [None; MAX_DEVICES];
    limits[0] = Some(pct);
    c.set_limits(&limits, 100);
    c
}

fn run_on(c: &Controller, kernel_ns: u64, sync_every: u64, seconds: u64) -> Run {
    let sim = Sim {
        now: Cell::new(1),
        busy_until: Cell::new(0),
        busy: Cell::new(0),
        drains: Cell::new(0),
    };
    let warm = 1_000_000_000;
    let end = seconds * 1_000_000_000;
    let (mut busy_at_warm, mut throttled) = (None, 0);
    let mut n = 0u64;
    while sim.now.get() < end {
        if busy_at_warm.is_none() && sim.now.get() >= warm {
            // Work launched but not yet run at the warm-up point belongs to the measured part.
            let queued = sim.busy_until.get().saturating_sub(sim.now.get());
            busy_at_warm = Some((sim.busy.get() - queued, sim.now.get()));
        }
        let held = c.admit(|| &sim);
        if busy_at_warm.is_some() {
            throttled += held;
        }
        let now = sim.now.get();
        sim.busy_until
            .set(sim.busy_until.get().max(now) + kernel_ns);
        sim.busy.set(sim.busy.get() + kernel_ns);
        sim.now.set(now + 2_000);
        n += 1;
        if n.is_multiple_of(sync_every) {
            sim.now.set(sim.now.get().max(sim.busy_until.get()));
        }
    }
    let (b0, t0) = busy_at_warm.unwrap();
    // Work still queued at the end has not run within the measured time.
    let queued = sim.busy_until.get().saturating_sub(sim.now.get());
    let wall = sim.now.get() - t0;
    Run {
        share: (sim.busy.get() - queued - b0) as f64 / wall as f64 * 100.0,
        throttled_ns: throttled,
        wall_ns: wall,
    }
}

#[test]
fn steady_state_share_holds_across_kernel_lengths_and_queue_depths() {
    // Miri interprets every step of the simulation: two shares, the longer kernels, 3 s there.
    let (shares, cases, seconds): (&[u8], &[(u64, u64)], u64) = if cfg!(miri) {
        (&[25, 75], &[(2_000_000, 1), (30_000_000, 3)], 3)
    } else {
        (
            &[10, 25, 50, 75, 90],
            &[
                (20_000, 1),
                (20_000, 1_000),
                (500_000, 8),
                (2_000_000, 1),
                (30_000_000, 1),
                (30_000_000, 3),
            ],
            20,
        )
    };
    for &pct in shares {
        for &(kernel_ns, sync_every) in cases {
            let r = run(pct, kernel_ns, sync_every, seconds);
            assert!(
                (r.share - f64::from(pct)).abs() < 2.0,
                "limit {pct}%, kernel {kernel_ns} ns, sync every {sync_every}: share {:.2}%",
                r.share
            );
            // Held time is the rest of the wall time, less the workload's own waits/CPU time.
            assert!(r.throttled_ns < r.wall_ns);
        }
    }
}

#[test]
fn unlimited_builds_no_environment() {
    let c = Controller::new();
    let env = || -> &Sim { panic!("an unlimited launch must not reach the environment") };
    assert_eq!(c.admit(env), 0);
    c.set_limits(&[Some(100); MAX_DEVICES], 100);
    assert_eq!(c.admit(env), 0);
    c.set_limits(&[Some(0); MAX_DEVICES], 100);
    assert_eq!(c.admit(env), 0);
    // Limited on another device only: the environment is asked for the device, nothing else.
    let mut limits = [None; MAX_DEVICES];
    limits[3] = Some(50);
    c.set_limits(&limits, 100);
    let sim = Sim {
        now: Cell::new(1),
        busy_until: Cell::new(0),
        busy: Cell::new(0),
        drains: Cell::new(0),
    };
    assert_eq!(c.admit(|| &sim), 0);
    assert_eq!(sim.drains.get(), 0);
}

#[test]
fn a_launch_gap_longer_than_a_period_starts_a_new_window() {
    let c = Controller::new();
    let mut limits = [None; MAX_DEVICES];
    limits[0] = Some(50);
    c.set_limits(&limits, 100);
    let sim = Sim {
        now: Cell::new(1_000),
        busy_until: Cell::new(0),
        busy: Cell::new(0),
        drains: Cell::new(0),
    };
    assert_eq!(c.admit(|| &sim), 0);
    // Ten idle seconds: not charged as busy time.
    sim.now.set(10_000_000_000);
    assert_eq!(c.admit(|| &sim), 0);
    assert_eq!(sim.drains.get(), 0);
}

#[test]
fn windows_use_the_effective_share_and_a_new_target_resets_it() {
    let c = limited(40);
    assert_eq!(c.effective_permille(0), 400);
    // The feedback loop's correction is what the duty cycle holds; the target stays.
    c.set_effective_permille(0, 40, 800);
    let r = run_on(&c, 500_000, 8, if cfg!(miri) { 3 } else { 20 });
    assert!((r.share - 80.0).abs() < 2.0, "share {:.2}%", r.share);
    assert_eq!(c.percent(0), 40);
    // A correction computed for another target is dropped.
    c.set_effective_permille(0, 30, 500);
    assert_eq!(c.effective_permille(0), 800);
    // A new target starts from itself; an unchanged one keeps the correction.
    let mut limits = [None; MAX_DEVICES];
    limits[0] = Some(40);
    c.set_limits(&limits, 100);
    assert_eq!(c.effective_permille(0), 800);
    limits[0] = Some(60);
    c.set_limits(&limits, 100);
    assert_eq!(c.effective_permille(0), 600);
    // Unlimited: no correction sticks.
    limits[0] = None;
    c.set_limits(&limits, 100);
    c.set_effective_permille(0, 0, 500);
    assert_eq!(c.effective_permille(0), 0);
    assert_eq!(c.admit(|| -> &Sim { panic!("built the environment") }), 0);
}
