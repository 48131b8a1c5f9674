//! Measures what one probe hit (entry + return) costs on this host, so that the agent can report
//! its own overhead instead of quoting someone else's figure.
//!
//! What a hit costs depends on the probed function's first instruction ([`Prologue`]): the
//! kernel emulates a `push` (and, on recent kernels, turns a 5-byte nop into a call), but must
//! single-step most other instructions out of line, which in a virtual machine can cost several
//! times as much. The real driver's entry points start with a RIP-relative compare (single-
//! stepped), a Rust-built simulated driver's with `push %rbp` (emulated). So the agent carries
//! one calibration function per class ([`STUBS`], in its own binary: nothing foreign is loaded
//! into the agent), measures each, and charges every probed call at the cost of its own
//! function's class.
//!
//! The cost of a hit is not a constant either: on a shared or virtual machine it moves by 2x with
//! what the other CPUs are doing (docs/attribute.md, "Accuracy"). The probes therefore stay
//! attached to the calibration functions (scoped to the agent, they cost nothing while it does
//! not call them), and a short burst of calls re-measures the classes in use at every poll
//! ([`Calibrator::remeasure`]): the calls probed between two polls are charged at the cost
//! measured around them.

use std::{
    collections::BTreeMap,
    hint::black_box,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use agent_common::{ProbeCookie, maps::StatsKey};

use super::{ProbeError, Probes};
use crate::model::probing::{ClassCost, ProbeCost, Prologue};

mod stubs;

use stubs::{CalibrationFn, STUBS, UNPROBED_BODY};

impl ProbeCost {
    /// Copies the main class into the summary fields.
    fn set_main(&mut self, main: Prologue) {
        if let Some(c) = self.class(main).cloned() {
            self.target = c.target;
            self.prologue = c.prologue;
            self.unprobed_ns = c.unprobed_ns;
            self.per_hit_ns = c.per_hit_ns;
            self.inband_ns = c.inband_ns;
            self.last_per_hit_ns = c.last_per_hit_ns;
        }
    }
}

/// A timing: the median ns per call over some batches, and one standard error of it (the
/// spread of the batches).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Timed {
    ns: f64,
    se_ns: f64,
}

impl Timed {
    /// `v`'s median, and the standard error of its mean as that of the median.
    fn of(v: &[f64]) -> Timed {
        Timed {
            ns: median(v),
            se_ns: standard_error(v),
        }
    }

    /// The difference of two independent timings.
    fn minus(self, o: Timed) -> Timed {
        Timed {
            ns: (self.ns - o.ns).max(0.0),
            se_ns: self.se_ns.hypot(o.se_ns),
        }
    }
}

/// The standard error of the mean of `v` (0 for fewer than two values).
fn standard_error(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (var / n).sqrt()
}

/// Median ns per call over `batches` batches of `batch` calls, and its spread.
fn time_calls(func: CalibrationFn, batch: u32, batches: u32) -> Timed {
    time_batches(func, batch, batches, || None).0
}

/// As [`time_calls`], and the median over the batches of the latency per call the probes
/// measured (`row`: the calibration row's calls and total latency so far, read between
/// batches; `None` when it cannot be read). Medians of batches, both: a batch that was
/// preempted moves neither, where a mean over all the calls would carry every preemption (at
/// the start on a loaded VM the mean put the in-band part at 7-9 us, over twice a whole hit).
fn time_batches(
    func: CalibrationFn,
    batch: u32,
    batches: u32,
    mut row: impl FnMut() -> Option<(u64, u64)>,
) -> (Timed, Option<f64>) {
    let mut per_call = Vec::with_capacity(batches as usize);
    let mut latency = Vec::with_capacity(batches as usize);
    let mut v = 0i32;
    for _ in 0..batches {
        let before = row();
        let t = Instant::now();
        for _ in 0..batch {
            // SAFETY: every calibration function takes one out-pointer to an int (which it
            // ignores), which `v` is, and only returns 0.
            black_box(unsafe { func(&mut v) });
        }
        per_call.push(t.elapsed().as_nanos() as f64 / batch as f64);
        if let (Some((c0, t0)), Some((c1, t1))) = (before, row())
            && c1 > c0
        {
            latency.push(t1.saturating_sub(t0) as f64 / (c1 - c0) as f64);
        }
    }
    let latency = (!latency.is_empty()).then(|| median(&latency));
    (Timed::of(&per_call), latency)
}

/// What one re-measurement of a class found: its probed and unprobed timings, and the latency
/// per call the probes measured (ns) where it could be read.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Measured {
    probed: Timed,
    unprobed: Timed,
    latency: Option<f64>,
}

impl Measured {
    /// The in-band part of a hit.
    fn inband(&self) -> Option<f64> {
        self.latency.map(|l| (l - self.unprobed.ns).max(0.0))
    }
}

/// Calls per burst batch: about `target` of probed calls at `probed_ns` each.
fn batch_for(target: Duration, probed_ns: f64) -> u32 {
    ((target.as_nanos() as f64 / probed_ns.max(1.0)) as u32).clamp(20, 5_000)
}

/// One class being measured.
struct Class {
    func: CalibrationFn,
    /// Calls per re-measurement batch (sized to take about 0.7 ms probed).
    burst: u32,
    /// The last re-measurements of a hit (the newest last), and of its in-band part.
    recent: Vec<Timed>,
    recent_inband: Vec<f64>,
}

/// Re-measurements a charge is taken over: their median, so that one burst that was preempted or
/// shared a core with a busy sibling does not set the price of a whole interval.
const RECENT: usize = 5;

/// The median of `v` (the upper middle of an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The price of a hit from its last re-measurements: their median, and one standard error of
/// it from their spread (from the one measurement's own batches while there is only one).
fn price(recent: &[Timed]) -> Timed {
    let values: Vec<f64> = recent.iter().map(|t| t.ns).collect();
    match recent {
        [] => Timed {
            ns: 0.0,
            se_ns: 0.0,
        },
        [one] => *one,
        _ => Timed::of(&values),
    }
}

/// Keeps the calibration probes attached and re-measures their cost.
pub struct Calibrator {
    classes: Vec<Class>,
    /// The agent's own calibration row in the probes' aggregation map.
    row: Option<StatsKey>,
    pub cost: ProbeCost,
    /// The class to report before any call is charged (the host driver's).
    default_main: Prologue,
    /// Probed calls per process and class at the last poll.
    calls_seen: BTreeMap<(u32, Prologue), u64>,
    /// The unpaired returns of each process and class at the last poll.
    unpaired_seen: BTreeMap<(u32, Prologue), u64>,
}

/// The agent's own binary (where the calibration functions are).
fn own_binary() -> Result<(PathBuf, Vec<u8>), ProbeError> {
    let path = std::fs::read_link("/proc/self/exe").map_err(|source| ProbeError::ReadLibrary {
        path: Path::new("/proc/self/exe").to_owned(),
        source,
    })?;
    let data = std::fs::read(&path).map_err(|source| ProbeError::ReadLibrary {
        path: path.clone(),
        source,
    })?;
    Ok((path, data))
}

impl Calibrator {
    /// Measures every class. `host_driver`: the class of the host libcuda's entry points (the
    /// class reported before any call is charged).
    pub fn start(
        probes: &mut Probes,
        host_driver: Option<Prologue>,
    ) -> Result<Calibrator, ProbeError> {
        let (path, data) = own_binary()?;
        let file = object::File::parse(&*data).map_err(|e| ProbeError::NotElf {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let mut found = Vec::new();
        for (prologue, name, func) in STUBS {
            let (offset, seen) =
                super::symbols::find_function(&file, &*data, name).ok_or_else(|| {
                    ProbeError::NotElf {
                        path: path.clone(),
                        reason: format!("calibration function {name} not found (stripped binary?)"),
                    }
                })?;
            if cfg!(target_arch = "x86_64") && seen != prologue {
                log::warn!("calibration function {name} starts with a {seen:?} prologue");
            }
            found.push((prologue, name, func, offset, time_calls(func, 2_000, 9)));
        }
        // The links stay attached for the agent's life (scoped to it, they cost nothing else).
        let offsets: Vec<u64> = found.iter().map(|f| f.3).collect();
        probes.attach_calibration(&path, &offsets)?;
        let me = std::process::id();
        let (mut classes, mut costs, mut calls) = (Vec::new(), Vec::new(), 0u64);
        let mut row = None;
        for (prologue, name, func, _, unprobed) in found {
            // A single-stepped probe can cost ~15 us in a VM: size batches to finish in ~100 ms.
            let probe_once = time_calls(func, 20, 1).ns;
            // The calibration row exists once a probed call was made: its key (the agent's
            // cgroup) is looked up once.
            if row.is_none() {
                row = probes
                    .read_stats()?
                    .into_iter()
                    .find(|(k, _)| k.tgid == me && k.api == ProbeCookie::CALIBRATION_API)
                    .map(|(k, _)| k);
            }
            let batch = batch_for(Duration::from_millis(10), probe_once);
            let (probed, latency) = time_batches(func, batch, 9, || read_row(probes, row));
            let inband_ns = Measured {
                probed,
                unprobed,
                latency,
            }
            .inband()
            .unwrap_or(0.0);
            calls += u64::from(batch) * 9 + 20;
            let hit = probed.minus(unprobed);
            classes.push(Class {
                func,
                burst: batch_for(Duration::from_micros(700), probed.ns),
                recent: vec![hit],
                recent_inband: vec![inband_ns],
            });
            costs.push(ClassCost {
                prologue,
                target: format!("self:{name}"),
                unprobed_ns: unprobed.ns,
                per_hit_ns: hit.ns,
                inband_ns,
                last_per_hit_ns: hit.ns,
                last_se_ns: hit.se_ns,
                charged_calls: 0,
            });
        }
        probes.remove_stats_rows(me, ProbeCookie::CALIBRATION_API)?;
        let default_main = host_driver
            .filter(|p| costs.iter().any(|c| c.prologue == *p))
            .unwrap_or(costs[costs.len() - 1].prologue);
        let mut cost = ProbeCost {
            target: String::new(),
            prologue: default_main,
            calls,
            unprobed_ns: 0.0,
            per_hit_ns: 0.0,
            inband_ns: 0.0,
            remeasured: 0,
            last_per_hit_ns: 0.0,
            charged_ns: BTreeMap::new(),
            charged_se_ns: BTreeMap::new(),
            charged_inband_ns: BTreeMap::new(),
            unpaired_hits: BTreeMap::new(),
            classes: costs,
            process_prologue: BTreeMap::new(),
        };
        cost.set_main(default_main);
        Ok(Calibrator {
            classes,
            row,
            cost,
            default_main,
            calls_seen: BTreeMap::new(),
            unpaired_seen: BTreeMap::new(),
        })
    }

    /// Re-measures the cost of a hit of every class with probed calls (three short batches each, the
    /// median: about 2 ms a class) and charges the calls each process made since the last poll
    /// at the median of the last [`RECENT`] measurements. `calls` is every process's probed calls
    /// so far, by the class of the functions called; `unpaired` its returns without an entry so
    /// far (hits at a window's edge that no call was counted for: charged, with no in-band part).
    pub fn remeasure(
        &mut self,
        calls: &BTreeMap<(u32, Prologue), u64>,
        unpaired: &BTreeMap<(u32, Prologue), u64>,
        probes: &Probes,
    ) {
        let mut measured = BTreeMap::new();
        for (class, cost) in self.classes.iter().zip(&self.cost.classes) {
            // Only classes with probed calls: each burst takes CPU time from the workloads.
            if !calls.keys().any(|(_, p)| *p == cost.prologue) {
                continue;
            }
            let (probed, latency) =
                time_batches(class.func, class.burst, 3, || read_row(probes, self.row));
            // The unprobed time again, around the same moment: the body's own time moves with
            // the machine (on the VM by 1.7x between modes), and a baseline from the start would
            // put that move into the cost of a hit.
            let unprobed = time_calls(UNPROBED_BODY, class.burst, 3);
            measured.insert(
                cost.prologue,
                Measured {
                    probed,
                    unprobed,
                    latency,
                },
            );
        }
        self.settle(calls, unpaired, &measured);
    }

    /// Takes in one re-measurement per class (`measured`: a burst's probed and unprobed
    /// timings) and charges each process's calls since the last poll at the resulting price.
    fn settle(
        &mut self,
        calls: &BTreeMap<(u32, Prologue), u64>,
        unpaired: &BTreeMap<(u32, Prologue), u64>,
        measured: &BTreeMap<Prologue, Measured>,
    ) {
        for (class, cost) in self.classes.iter_mut().zip(&mut self.cost.classes) {
            let Some(m) = measured.get(&cost.prologue) else {
                continue;
            };
            cost.unprobed_ns = m.unprobed.ns;
            if class.recent.len() == RECENT {
                class.recent.remove(0);
            }
            class.recent.push(m.probed.minus(m.unprobed));
            // At debug level, each re-measurement with its CLOCK_MONOTONIC time: what
            // scripts/gpu/probe_hit_trace.py lines up with the attributed process's own timings.
            log::debug!(
                "hit price {:?} at {} ns on CPU {}: {:.0} ns (unprobed body {:.0} ns)",
                cost.prologue,
                crate::sys::clock::monotonic_ns(),
                crate::sys::process::current_cpu().map_or(-1, i64::from),
                m.probed.minus(m.unprobed).ns,
                m.unprobed.ns
            );
            if let Some(inband) = m.inband() {
                if class.recent_inband.len() == RECENT {
                    class.recent_inband.remove(0);
                }
                class.recent_inband.push(inband);
            }
            let current = price(&class.recent);
            if !class.recent_inband.is_empty() {
                cost.inband_ns = median(&class.recent_inband);
            }
            cost.last_per_hit_ns = current.ns;
            cost.last_se_ns = current.se_ns;
            self.cost.calls += u64::from(class.burst) * 3;
        }
        self.cost.remeasured += 1;
        // Each class at its current price (a class without calls keeps its last one).
        let prices: BTreeMap<Prologue, (Timed, f64)> = self
            .cost
            .classes
            .iter()
            .map(|c| {
                let price = Timed {
                    ns: c.last_per_hit_ns,
                    se_ns: c.last_se_ns,
                };
                (c.prologue, (price, c.inband_ns))
            })
            .collect();
        let charged = charge(&mut self.cost, &mut self.calls_seen, calls, |p| {
            prices.get(&p).copied().unwrap_or((
                Timed {
                    ns: 0.0,
                    se_ns: 0.0,
                },
                0.0,
            ))
        });
        // Unpaired returns: a hit each at the price of the moment, none of it in a measured
        // latency (no call was timed).
        let unpaired_charged = charge(&mut self.cost, &mut self.unpaired_seen, unpaired, |p| {
            let price = prices.get(&p).map_or(
                Timed {
                    ns: 0.0,
                    se_ns: 0.0,
                },
                |(price, _)| *price,
            );
            (price, 0.0)
        });
        let mut per_process: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(pid, _), &n) in &self.unpaired_seen {
            *per_process.entry(pid).or_default() += n;
        }
        self.cost.unpaired_hits = per_process;
        for (prologue, n) in charged.into_iter().chain(unpaired_charged) {
            if let Some(c) = self
                .cost
                .classes
                .iter_mut()
                .find(|c| c.prologue == prologue)
            {
                c.charged_calls += n;
            }
        }
        // Each process's class: where most of its calls are.
        let mut most: BTreeMap<u32, (Prologue, u64)> = BTreeMap::new();
        for (&(pid, prologue), &n) in calls {
            let e = most.entry(pid).or_insert((prologue, n));
            if n > e.1 {
                *e = (prologue, n);
            }
        }
        for (pid, (prologue, _)) in most {
            self.cost.process_prologue.insert(pid, prologue);
        }
        let main = self
            .cost
            .classes
            .iter()
            .filter(|c| c.charged_calls > 0)
            .max_by_key(|c| c.charged_calls)
            .map(|c| c.prologue)
            .unwrap_or(self.default_main);
        self.cost.set_main(main);
    }

    /// Forgets exited processes.
    pub fn forget(&mut self, pids: &[u32]) {
        for p in pids {
            self.calls_seen.retain(|(pid, _), _| pid != p);
            self.unpaired_seen.retain(|(pid, _), _| pid != p);
            self.cost.unpaired_hits.remove(p);
            self.cost.charged_ns.remove(p);
            self.cost.charged_se_ns.remove(p);
            self.cost.charged_inband_ns.remove(p);
            self.cost.process_prologue.remove(p);
        }
    }
}

/// The calibration row's calls and total latency (ns) so far.
fn read_row(probes: &Probes, row: Option<StatsKey>) -> Option<(u64, u64)> {
    let s = probes.stats_row(&row?).ok()??;
    Some((s.calls, s.total_ns))
}

/// Charges each process's calls since the last poll at the cost of their class (and their
/// share of its standard error); returns the calls charged per class.
fn charge(
    cost: &mut ProbeCost,
    seen: &mut BTreeMap<(u32, Prologue), u64>,
    calls: &BTreeMap<(u32, Prologue), u64>,
    per_hit: impl Fn(Prologue) -> (Timed, f64),
) -> BTreeMap<Prologue, u64> {
    let mut by_class = BTreeMap::new();
    for (&key, &n) in calls {
        // Fewer calls than last time: the rows were removed and the pid reused.
        let before = seen.get(&key).copied().filter(|&b| b <= n).unwrap_or(0);
        let (price, inband) = per_hit(key.1);
        let new = (n - before) as f64;
        *cost.charged_ns.entry(key.0).or_insert(0.0) += new * price.ns;
        *cost.charged_se_ns.entry(key.0).or_insert(0.0) += new * price.se_ns;
        *cost.charged_inband_ns.entry(key.0).or_insert(0.0) += new * inband;
        *by_class.entry(key.1).or_insert(0) += n - before;
        seen.insert(key, n);
    }
    by_class
}

#[cfg(test)]
mod tests {
    //! The calibration's bookkeeping, fed with generated measurements (no clock): what each interval
    //! is charged, at which class, and how sure the price is.

    use super::*;

    fn cost_with(classes: &[(Prologue, f64)]) -> ProbeCost {
        ProbeCost {
            target: String::new(),
            prologue: classes[0].0,
            calls: 0,
            unprobed_ns: 0.0,
            per_hit_ns: 0.0,
            inband_ns: 0.0,
            remeasured: 0,
            last_per_hit_ns: 0.0,
            charged_ns: BTreeMap::new(),
            charged_se_ns: BTreeMap::new(),
            charged_inband_ns: BTreeMap::new(),
            unpaired_hits: BTreeMap::new(),
            classes: classes
                .iter()
                .map(|&(prologue, ns)| ClassCost {
                    prologue,
                    target: String::new(),
                    unprobed_ns: 1.0,
                    per_hit_ns: ns,
                    inband_ns: ns / 2.0,
                    last_per_hit_ns: ns,
                    last_se_ns: 0.0,
                    charged_calls: 0,
                })
                .collect(),
            process_prologue: BTreeMap::new(),
        }
    }

    /// A calibrator whose classes were first measured at `start` (ns per hit, with that standard
    /// error), without probes: re-measurements are given to [`Calibrator::settle`].
    fn calibrator(start: &[(Prologue, Timed)]) -> Calibrator {
        let priced: Vec<(Prologue, f64)> = start.iter().map(|(p, t)| (*p, t.ns)).collect();
        Calibrator {
            classes: start
                .iter()
                .map(|(_, t)| Class {
                    func: UNPROBED_BODY,
                    burst: 100,
                    recent: vec![*t],
                    recent_inband: vec![t.ns / 2.0],
                })
                .collect(),
            row: None,
            cost: cost_with(&priced),
            default_main: start[0].0,
            calls_seen: BTreeMap::new(),
            unpaired_seen: BTreeMap::new(),
        }
    }

    /// A re-measurement that found a hit to cost `ns` exactly (probed `ns + 500`, unprobed 500),
    /// half of it in band (the probes measured the calibration function at `500 + ns / 2`).
    fn hit(ns: f64) -> Measured {
        Measured {
            probed: Timed {
                ns: ns + 500.0,
                se_ns: 0.0,
            },
            unprobed: Timed {
                ns: 500.0,
                se_ns: 0.0,
            },
            latency: Some(500.0 + ns / 2.0),
        }
    }

    fn exact(ns: f64) -> Timed {
        Timed { ns, se_ns: 0.0 }
    }

    #[test]
    fn each_interval_is_charged_at_its_own_cost_and_class() {
        let (mut cost, mut seen) = (cost_with(&[(Prologue::Push, 1.0)]), BTreeMap::new());
        let price = |k: f64| {
            move |p: Prologue| {
                let ns = if p == Prologue::Push { k } else { 10.0 * k };
                (exact(ns), ns / 4.0)
            }
        };
        let (push, other) = (Prologue::Push, Prologue::Other);
        let by = charge(
            &mut cost,
            &mut seen,
            &[((7, push), 100)].into(),
            price(1_000.0),
        );
        assert_eq!(by, [(push, 100)].into());
        let by = charge(
            &mut cost,
            &mut seen,
            &[((7, push), 300), ((7, other), 5), ((8, push), 50)].into(),
            price(2_000.0),
        );
        assert_eq!(by, [(push, 250), (other, 5)].into());
        assert_eq!(
            cost.charged_ns[&7],
            100.0 * 1_000.0 + 200.0 * 2_000.0 + 5.0 * 20_000.0
        );
        assert_eq!(cost.charged_ns[&8], 50.0 * 2_000.0);
        // A reused pid whose rows were removed starts again.
        charge(
            &mut cost,
            &mut seen,
            &[((8, push), 10)].into(),
            price(3_000.0),
        );
        assert_eq!(cost.charged_ns[&8], 50.0 * 2_000.0 + 10.0 * 3_000.0);
        assert_eq!(cost.charged_se_ns[&8], 0.0, "exact prices, exact charges");
        assert_eq!(cost.charged_inband_ns[&8], 50.0 * 500.0 + 10.0 * 750.0);
    }

    #[test]
    fn a_steady_hit_is_priced_exactly_and_with_no_uncertainty() {
        let mut c = calibrator(&[(Prologue::Push, exact(2_000.0))]);
        let push = Prologue::Push;
        for polls in 1..=8u64 {
            c.settle(
                &[((7, push), polls * 1_000)].into(),
                &BTreeMap::new(),
                &[(push, hit(2_000.0))].into(),
            );
        }
        let class = c.cost.class(push).unwrap();
        assert_eq!((class.last_per_hit_ns, class.last_se_ns), (2_000.0, 0.0));
        assert_eq!(class.charged_calls, 8_000);
        assert_eq!(c.cost.charged_ns[&7], 8_000.0 * 2_000.0);
        assert_eq!(c.cost.charged_se_ns[&7], 0.0);
        assert_eq!(c.cost.charged_inband_ns[&7], 8_000.0 * 1_000.0);
        assert_eq!(c.cost.remeasured, 8);
        assert_eq!(c.cost.process_prologue[&7], push);
    }

    #[test]
    fn the_price_is_the_median_of_the_last_five_and_its_uncertainty_their_spread() {
        let push = Prologue::Push;
        // Measured at start with a spread of its own batches: until a second measurement, that is
        // the price's uncertainty.
        let mut c = calibrator(&[(
            push,
            Timed {
                ns: 1_000.0,
                se_ns: 30.0,
            },
        )]);
        assert_eq!(price(&c.classes[0].recent).se_ns, 30.0);
        // Re-measured 1,200, 800, 1,100, 900 (with the start's 1,000: five values), calls charged
        // at each poll. The fifth price: median 1,000; spread: deviations 0, 200, -200, 100, -100
        // from the mean 1,000, sample variance 100,000 / 4, standard error sqrt(25,000 / 5).
        let mut charged = 0.0;
        let mut charged_se = 0.0;
        for (i, ns) in [1_200.0, 800.0, 1_100.0, 900.0].into_iter().enumerate() {
            c.settle(
                &[((7, push), (i as u64 + 1) * 100)].into(),
                &BTreeMap::new(),
                &[(push, hit(ns))].into(),
            );
            let p = price(&c.classes[0].recent);
            charged += 100.0 * p.ns;
            charged_se += 100.0 * p.se_ns;
        }
        let class = c.cost.class(push).unwrap();
        assert_eq!(class.last_per_hit_ns, 1_000.0);
        assert!(
            (class.last_se_ns - 5_000.0f64.sqrt()).abs() < 1e-9,
            "{class:?}"
        );
        assert!((c.cost.charged_ns[&7] - charged).abs() < 1e-6);
        assert!((c.cost.charged_se_ns[&7] - charged_se).abs() < 1e-6);
        // The second price: median of {1,000, 1,200} (the upper middle), spread of two values.
        let two = price(&[exact(1_000.0), exact(1_200.0)]);
        assert_eq!(two.ns, 1_200.0);
        assert!((two.se_ns - 100.0).abs() < 1e-9, "{two:?}");
    }

    #[test]
    fn a_preempted_burst_does_not_set_the_price_but_widens_its_uncertainty() {
        let push = Prologue::Push;
        let mut c = calibrator(&[(push, exact(2_000.0))]);
        for (i, ns) in [2_000.0, 2_000.0, 9_000.0, 2_000.0].into_iter().enumerate() {
            c.settle(
                &[((7, push), (i as u64 + 1) * 10)].into(),
                &BTreeMap::new(),
                &[(push, hit(ns))].into(),
            );
        }
        let class = c.cost.class(push).unwrap();
        assert_eq!(class.last_per_hit_ns, 2_000.0, "the median");
        // Five values 2,000 x4 and 9,000: mean 3,400, sample sd 3,130.5: se 1,400.
        assert!((class.last_se_ns - 1_400.0).abs() < 1.0, "{class:?}");
        assert!(
            class.last_se_ns / class.last_per_hit_ns > 0.10,
            "marked uncertain"
        );
    }

    /// The in-band part of a hit is re-measured too, from the latency the probes measured of each
    /// batch (medians of batches, like the price): one preempted burst does not move it.
    #[test]
    fn the_in_band_part_is_the_median_of_its_re_measurements() {
        let push = Prologue::Push;
        let mut c = calibrator(&[(push, exact(2_000.0))]);
        for (i, latency) in [1_500.0, 1_500.0, 9_000.0, 1_500.0].into_iter().enumerate() {
            let mut m = hit(2_000.0);
            m.latency = Some(latency);
            c.settle(
                &[((7, push), (i as u64 + 1) * 10)].into(),
                &BTreeMap::new(),
                &[(push, m)].into(),
            );
        }
        // Five values: 1,000 from the start, then 1,000, 1,000, 8,500, 1,000 (latency less the
        // unprobed 500).
        assert_eq!(c.cost.class(push).unwrap().inband_ns, 1_000.0);
        assert_eq!(
            c.cost.charged_inband_ns[&7],
            30.0 * 1_000.0 + 10.0 * 1_000.0
        );
        // Without a latency reading, the last in-band figure stands.
        let mut m = hit(2_000.0);
        m.latency = None;
        c.settle(
            &[((7, push), 50)].into(),
            &BTreeMap::new(),
            &[(push, m)].into(),
        );
        assert_eq!(c.cost.class(push).unwrap().inband_ns, 1_000.0);
    }

    #[test]
    fn classes_without_calls_are_not_re_measured_or_charged() {
        let (push, other) = (Prologue::Push, Prologue::Other);
        let mut c = calibrator(&[(push, exact(1_500.0)), (other, exact(8_000.0))]);
        c.settle(
            &[((7, other), 40)].into(),
            &BTreeMap::new(),
            &[(other, hit(7_000.0))].into(),
        );
        assert_eq!(c.cost.class(push).unwrap().last_per_hit_ns, 1_500.0);
        // The median of {8,000, 7,000} (the upper middle).
        assert_eq!(c.cost.class(other).unwrap().last_per_hit_ns, 8_000.0);
        assert_eq!(c.cost.charged_ns[&7], 40.0 * 8_000.0);
        assert_eq!(
            c.cost.prologue, other,
            "the class most calls were charged at"
        );
        assert_eq!(c.cost.class_of(9).unwrap().prologue, other);
        c.forget(&[7]);
        assert!(c.cost.charged_ns.is_empty() && c.cost.charged_se_ns.is_empty());
    }

    #[test]
    fn unpaired_returns_are_charged_a_hit_each_with_no_in_band_part() {
        let push = Prologue::Push;
        let mut c = calibrator(&[(push, exact(2_000.0))]);
        // 100 counted calls and 30 returns without their entry (a window's edge).
        c.settle(
            &[((7, push), 100)].into(),
            &[((7, push), 30)].into(),
            &[(push, hit(2_000.0))].into(),
        );
        assert_eq!(c.cost.charged_ns[&7], 130.0 * 2_000.0);
        assert_eq!(c.cost.charged_inband_ns[&7], 100.0 * 1_000.0);
        assert_eq!(c.cost.unpaired_hits[&7], 30);
        // Cumulative rows: only what is new is charged.
        c.settle(
            &[((7, push), 100)].into(),
            &[((7, push), 45)].into(),
            &[(push, hit(2_000.0))].into(),
        );
        assert_eq!(c.cost.charged_ns[&7], 145.0 * 2_000.0);
        assert_eq!(c.cost.unpaired_hits[&7], 45);
        c.forget(&[7]);
        assert!(c.cost.unpaired_hits.is_empty());
    }

    #[test]
    fn timings_carry_the_spread_of_their_batches() {
        let t = Timed::of(&[10.0, 12.0, 14.0]);
        assert_eq!(t.ns, 12.0);
        // Sample sd 2, over sqrt(3).
        assert!((t.se_ns - 2.0 / 3.0f64.sqrt()).abs() < 1e-12);
        let d = Timed {
            ns: 10.0,
            se_ns: 3.0,
        }
        .minus(Timed {
            ns: 4.0,
            se_ns: 4.0,
        });
        assert_eq!((d.ns, d.se_ns), (6.0, 5.0));
        assert_eq!(Timed::of(&[5.0]).se_ns, 0.0);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn each_class_has_a_function_that_starts_like_it_in_this_binary() {
        let (path, data) = own_binary().unwrap();
        let file = object::File::parse(&*data).unwrap();
        for (prologue, name, func) in STUBS {
            let (_, seen) = super::super::symbols::find_function(&file, &*data, name)
                .unwrap_or_else(|| panic!("{name} in {}", path.display()));
            assert_eq!(seen, prologue, "{name}");
            let mut v = 0;
            // SAFETY: see `time_calls`.
            assert_eq!(unsafe { func(&mut v) }, 0);
        }
        let mut main = cost_with(&[(Prologue::Other, 3_000.0), (Prologue::Push, 1_000.0)]);
        main.process_prologue.insert(7, Prologue::Push);
        assert_eq!(main.class_of(7).unwrap().per_hit_ns, 1_000.0);
        assert_eq!(
            main.class_of(8).unwrap().per_hit_ns,
            3_000.0,
            "the main class"
        );
    }

    #[test]
    fn batches_take_about_the_time_asked() {
        assert_eq!(batch_for(Duration::from_micros(700), 3_500.0), 200);
        assert_eq!(batch_for(Duration::from_millis(10), 0.0), 5_000);
        assert_eq!(batch_for(Duration::from_micros(10), 15_000.0), 20);
    }
}
