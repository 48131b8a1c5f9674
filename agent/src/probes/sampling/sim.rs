//! A process and the agent's schedule in virtual time, for the tests: the process makes launches
//! (and a synchronisation every so many), each taking its own time plus a probe hit while that
//! kind is attached; the agent switches probes when the schedule says, with attaching and
//! detaching taking a while, and reads the exposure at every poll. Everything is known: the
//! launches made between any two readings are the truth the estimate is held to.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use agent_common::ApiKind;

use super::{Exposure, Schedule};
use crate::probe_options::Budget;

pub(super) const PID: u32 = 7;

/// A stretch of the process's life.
#[derive(Clone, Copy, Debug)]
pub(super) struct Phase {
    /// Virtual seconds it lasts.
    pub seconds: f64,
    /// Own ns per launch (`None`: not running).
    pub launch_ns: Option<f64>,
    /// A synchronisation after every that many launches (0: none), and its own ns.
    pub sync_every: u64,
    pub sync_ns: f64,
}

impl Phase {
    pub fn running(seconds: f64, launch_ns: f64, sync_every: u64) -> Phase {
        Phase {
            seconds,
            launch_ns: Some(launch_ns),
            sync_every,
            sync_ns: 5_000.0,
        }
    }

    pub fn idle(seconds: f64) -> Phase {
        Phase {
            seconds,
            launch_ns: None,
            sync_every: 0,
            sync_ns: 0.0,
        }
    }
}

/// How the agent and the machine behave.
#[derive(Clone, Copy, Debug)]
pub(super) struct Agent {
    pub budget: Budget,
    /// What a hit really costs, and what the schedule is told it costs.
    pub hit_ns: f64,
    pub priced_hit_ns: f64,
    /// How long attaching and detaching take (calls are probed meanwhile, outside any window):
    /// anything from nothing to twice this, drawn for each switch (a real agent is scheduled
    /// when it is, so windows do not meet a periodic process at the same phase every time).
    pub edge: Duration,
    pub seed: u64,
    pub poll: Duration,
    /// Synchronisations are sampled kinds too (they fit the budget whole, and become the
    /// launches' reference); `false`: launches alone.
    pub with_syncs: bool,
}

impl Agent {
    pub fn new(window_ms: u64, share: f64, hit_ns: f64) -> Agent {
        Agent {
            budget: Budget {
                share,
                window: Duration::from_millis(window_ms),
            },
            hit_ns,
            priced_hit_ns: hit_ns,
            edge: Duration::from_micros(300),
            seed: 1,
            poll: Duration::from_millis(100),
            with_syncs: true,
        }
    }
}

/// One reading: the launches made so far, and the launch exposure the schedule reported.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reading {
    pub made: u64,
    pub exposure: Exposure,
}

impl Reading {
    /// The estimate between two readings, the truth, and the estimate's standard error.
    pub fn against(&self, first: &Reading, hit_relative_se: f64) -> (f64, f64, Option<f64>) {
        let e = self.exposure.since(&first.exposure);
        (
            e.estimated_calls,
            (self.made - first.made) as f64,
            e.calls_se(hit_relative_se),
        )
    }
}

/// A launch's own time, given the virtual time (ns) and its phase's own time: a source of
/// spread.
pub(super) type Noise<'a> = &'a mut dyn FnMut(f64, f64) -> f64;

/// No spread.
pub(super) fn steady(_: f64, own: f64) -> f64 {
    own
}

/// Runs `phases` under the agent; returns the readings (one per poll, and one at the end).
pub(super) fn run(agent: Agent, phases: &[Phase], noise: Noise) -> Vec<Reading> {
    let t0 = Instant::now();
    let at = |ns: f64| t0 + Duration::from_nanos(ns as u64);
    let kinds: &[ApiKind] = if agent.with_syncs {
        &[ApiKind::Launch, ApiKind::Sync]
    } else {
        &[ApiKind::Launch]
    };
    let mut s = Schedule::new(agent.budget, kinds, t0);
    let mut attached: BTreeMap<ApiKind, bool> = kinds.iter().map(|k| (*k, true)).collect();
    // Probed calls per kind (what the kernel maps would say).
    let mut probed: BTreeMap<ApiKind, u64> = BTreeMap::new();
    // Switches in progress: (when they take effect or the window counts from, kind, on).
    let mut edges: Vec<(f64, ApiKind, bool)> = Vec::new();
    let (mut t, mut made, mut since_sync) = (0.0f64, 0u64, 0u64);
    let mut next_poll = agent.poll.as_nanos() as f64;
    let mut readings = Vec::new();
    let end: f64 = phases.iter().map(|p| p.seconds * 1e9).sum();
    let calls_of = |probed: &BTreeMap<ApiKind, u64>| {
        let probed = probed.clone();
        move |k: ApiKind| -> BTreeMap<u32, u64> {
            probed
                .get(&k)
                .map(|n| [(PID, *n)].into())
                .unwrap_or_default()
        }
    };
    let edge = agent.edge.as_nanos() as f64;
    let mut rng = Rng(agent.seed);
    let mut phase_start = 0.0;
    let mut phase = 0;
    while t < end {
        // The agent's side, at its own times.
        edges.sort_by(|a, b| a.0.total_cmp(&b.0));
        while let Some(&(when, kind, on)) = edges.first()
            && when <= t
        {
            edges.remove(0);
            if on {
                s.opened(kind, at(when), calls_of(&probed));
            } else {
                attached.insert(kind, false);
            }
        }
        if s.next_due().is_some_and(|d| d <= at(t)) {
            for (kind, on) in s.due(
                at(t),
                |_| agent.priced_hit_ns,
                calls_of(&probed),
                calls_of(&probed),
            ) {
                if on {
                    // Probed from now on; the window counts once the attach returned.
                    attached.insert(kind, true);
                }
                edges.push((t + 2.0 * edge * rng.uniform(), kind, on));
            }
        }
        if t >= next_poll {
            s.poll(at(t), calls_of(&probed));
            readings.push(Reading {
                made,
                exposure: exposure_of(&s),
            });
            next_poll += agent.poll.as_nanos() as f64;
        }
        // The process's side: one call, or idle until the next thing happens.
        while phase + 1 < phases.len() && t >= phase_start + phases[phase].seconds * 1e9 {
            phase_start += phases[phase].seconds * 1e9;
            phase += 1;
        }
        let p = phases[phase];
        let Some(own) = p.launch_ns else {
            let wake = [
                phase_start + p.seconds * 1e9,
                next_poll,
                edges.first().map_or(f64::INFINITY, |e| e.0),
                s.next_due()
                    .map_or(f64::INFINITY, |d| d.duration_since(t0).as_nanos() as f64),
            ]
            .into_iter()
            .fold(f64::INFINITY, f64::min);
            t = wake.max(t + 1.0);
            continue;
        };
        let hit = |k: ApiKind| if attached[&k] { agent.hit_ns } else { 0.0 };
        t += noise(t, own) + hit(ApiKind::Launch);
        made += 1;
        if attached[&ApiKind::Launch] {
            *probed.entry(ApiKind::Launch).or_default() += 1;
        }
        since_sync += 1;
        if p.sync_every > 0 && since_sync >= p.sync_every {
            since_sync = 0;
            if agent.with_syncs {
                t += p.sync_ns + hit(ApiKind::Sync);
                if attached[&ApiKind::Sync] {
                    *probed.entry(ApiKind::Sync).or_default() += 1;
                }
            }
        }
    }
    s.poll(at(t), calls_of(&probed));
    readings.push(Reading {
        made,
        exposure: exposure_of(&s),
    });
    readings
}

fn exposure_of(s: &Schedule) -> Exposure {
    s.status
        .exposure
        .get(&PID)
        .and_then(|k| k.get("launch"))
        .copied()
        .unwrap_or_default()
}

/// A small deterministic generator (splitmix64), for noise with a known spread.
pub(super) struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
