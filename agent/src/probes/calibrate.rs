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
        })
    }

    /// Re-measures the cost of a hit of every class with probed calls (three short batches each, the
    /// median: about 2 ms a class) and charges the calls each process made since the last poll
    /// at the median of the last [`RECENT`] measurements. `calls` is every process's probed calls
    /// so far, by the class of the functions called.
    pub fn remeasure(&mut self, calls: &BTreeMap<(u32, Prologue), u64>, probes: &Probes) {
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
        self.settle(calls, &measured);
    }

    /// Takes in one re-measurement per class (`measured`: a burst's probed and unprobed
    /// timings) and charges each process's calls since the last poll at the resulting price.
    fn settle(
        &mut self,
        calls: &BTreeMap<(u32, Prologue), u64>,
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
        for (prologue, n) in charged {
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
mod tests;
