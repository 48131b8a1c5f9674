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

use agent_common::ProbeCookie;

use super::{ProbeError, Probes, symbols::Prologue};

/// The measured cost of one probed call of one prologue class.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClassCost {
    pub prologue: Prologue,
    /// The calibration function measured (a symbol of the agent's binary).
    pub target: String,
    /// Median cost of an unprobed call, ns.
    pub unprobed_ns: f64,
    /// Added cost of one entry + return hit when the agent started, ns.
    pub per_hit_ns: f64,
    /// The part of that cost that falls inside the latency the probes measure (their mean
    /// in-kernel latency of a function that takes a few ns): subtracted when attributing time to
    /// the driver.
    pub inband_ns: f64,
    /// The current cost of one hit (the median of the last few re-measurements), ns.
    pub last_per_hit_ns: f64,
    /// Probed calls of this class charged so far, all processes.
    pub charged_calls: u64,
}

/// The measured cost of probed calls, and what was charged to each process.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCost {
    /// The main class's calibration function (the fields up to `last_per_hit_ns` describe the
    /// main class: the one most probed calls were charged at, else the host driver's).
    pub target: String,
    pub prologue: Prologue,
    /// Probed calibration calls made, all classes.
    pub calls: u64,
    /// Median cost of an unprobed call, ns.
    pub unprobed_ns: f64,
    /// Median added cost of one entry + return probe hit, ns.
    pub per_hit_ns: f64,
    /// See [`ClassCost::inband_ns`].
    #[serde(default)]
    pub inband_ns: f64,
    /// Re-measurements since the start (one per poll).
    #[serde(default)]
    pub remeasured: u64,
    /// The current cost of one hit (the median of the last few re-measurements), ns.
    #[serde(default)]
    pub last_per_hit_ns: f64,
    /// Probe cost charged so far per process (host pid), ns: each poll interval's probed calls
    /// times the cost of their class measured around that interval. Cumulative, like the other
    /// counters.
    #[serde(default)]
    pub charged_ns: BTreeMap<u32, f64>,
    /// Every class measured.
    #[serde(default)]
    pub classes: Vec<ClassCost>,
    /// The class most of each process's probed calls fall in (its driver time is corrected by
    /// that class's in-band cost).
    #[serde(default)]
    pub process_prologue: BTreeMap<u32, Prologue>,
}

impl ProbeCost {
    pub fn class(&self, prologue: Prologue) -> Option<&ClassCost> {
        self.classes.iter().find(|c| c.prologue == prologue)
    }

    /// The class a process's calls are charged at (the main class for one not seen yet).
    pub fn class_of(&self, pid: u32) -> Option<&ClassCost> {
        self.process_prologue
            .get(&pid)
            .and_then(|p| self.class(*p))
            .or_else(|| self.class(self.prologue))
    }

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

type CalibrationFn = unsafe extern "C" fn(*mut i32) -> i32;

// One function per prologue class, each starting with an instruction of its class and going on
// into the common body (`vgpu_calibrate_body`), which returns 0. `vgpu_calibrate_other` starts like
// every entry point of NVIDIA's 5xx libcuda in Debian: a compare of a RIP-relative word with an
// immediate.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.vgpu_calibrate,\"ax\",@progbits",
    ".globl vgpu_calibrate_push",
    ".type vgpu_calibrate_push,@function",
    ".p2align 4",
    "vgpu_calibrate_push:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "jmp {body}",
    ".size vgpu_calibrate_push, .-vgpu_calibrate_push",
    ".globl vgpu_calibrate_nop5",
    ".type vgpu_calibrate_nop5,@function",
    ".p2align 4",
    "vgpu_calibrate_nop5:",
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    "jmp {body}",
    ".size vgpu_calibrate_nop5, .-vgpu_calibrate_nop5",
    ".globl vgpu_calibrate_endbr64",
    ".type vgpu_calibrate_endbr64,@function",
    ".p2align 4",
    "vgpu_calibrate_endbr64:",
    ".byte 0xf3, 0x0f, 0x1e, 0xfa",
    "jmp {body}",
    ".size vgpu_calibrate_endbr64, .-vgpu_calibrate_endbr64",
    ".globl vgpu_calibrate_other",
    ".type vgpu_calibrate_other,@function",
    ".p2align 4",
    "vgpu_calibrate_other:",
    "cmp dword ptr [rip + vgpu_calibrate_word], 0x321cba00",
    "jmp {body}",
    ".size vgpu_calibrate_other, .-vgpu_calibrate_other",
    ".popsection",
    ".pushsection .data.vgpu_calibrate,\"aw\",@progbits",
    ".p2align 2",
    "vgpu_calibrate_word:",
    ".long 0",
    ".popsection",
    body = sym vgpu_calibrate_body,
);

/// The common body of the calibration functions: a few hundred nanoseconds of loads and
/// branches over a 2 KiB table, about what a driver entry point does before its real work. A hit
/// costs more than its trap: the code that runs after it finds its predictors and cache lines
/// disturbed, and a function that returned at once would not show that (on the development VM a
/// bare `ret` put the cost about 10% under the slowdown of a probed simulated-driver call).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn vgpu_calibrate_body(_v: *mut i32) -> i32 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static TABLE: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];
    let mut acc = 0u64;
    for i in 0..64usize {
        // Relaxed: nothing else reads or writes the table; the loads only stand for work.
        let v = TABLE[(i * 37) % 256].load(Ordering::Relaxed);
        if (v ^ i as u64) & 1 == 0 {
            acc = acc.wrapping_add(v);
        } else {
            acc ^= v.rotate_left(7);
        }
    }
    black_box(acc);
    0
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    fn vgpu_calibrate_push(v: *mut i32) -> i32;
    fn vgpu_calibrate_nop5(v: *mut i32) -> i32;
    fn vgpu_calibrate_endbr64(v: *mut i32) -> i32;
    fn vgpu_calibrate_other(v: *mut i32) -> i32;
}

/// The calibration function of each class: its symbol and a pointer to call it.
#[cfg(target_arch = "x86_64")]
pub const STUBS: [(Prologue, &str, CalibrationFn); 4] = [
    (Prologue::Push, "vgpu_calibrate_push", vgpu_calibrate_push),
    (Prologue::Nop5, "vgpu_calibrate_nop5", vgpu_calibrate_nop5),
    (
        Prologue::Endbr64,
        "vgpu_calibrate_endbr64",
        vgpu_calibrate_endbr64,
    ),
    (
        Prologue::Other,
        "vgpu_calibrate_other",
        vgpu_calibrate_other,
    ),
];

/// The calibration functions' common body, called directly: never probed, it gives the
/// unprobed time of a calibration call at each re-measurement.
#[cfg(target_arch = "x86_64")]
const UNPROBED_BODY: CalibrationFn = body_call;

#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn body_call(v: *mut i32) -> i32 {
    vgpu_calibrate_body(v)
}

#[cfg(not(target_arch = "x86_64"))]
const UNPROBED_BODY: CalibrationFn = unprobed_self_call;

/// Elsewhere, one plain Rust function stands for every class.
#[cfg(not(target_arch = "x86_64"))]
pub const STUBS: [(Prologue, &str, CalibrationFn); 1] =
    [(Prologue::Other, "vgpu_agent_calibration_target", self_call)];

/// A plain Rust function of the agent's own binary (the calibration target where there are no
/// class stubs).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn vgpu_agent_calibration_target(v: *mut i32) -> i32 {
    black_box(v);
    0
}

#[cfg(not(target_arch = "x86_64"))]
unsafe extern "C" fn self_call(v: *mut i32) -> i32 {
    vgpu_agent_calibration_target(v)
}

/// The same work as [`vgpu_agent_calibration_target`], in a function that is never probed.
#[cfg(not(target_arch = "x86_64"))]
unsafe extern "C" fn unprobed_self_call(v: *mut i32) -> i32 {
    black_box(v);
    0
}

/// Median ns per call over `batches` batches of `batch` calls.
fn time_calls(func: CalibrationFn, batch: u32, batches: u32) -> f64 {
    let mut per_call = Vec::with_capacity(batches as usize);
    let mut v = 0i32;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..batch {
            // SAFETY: every calibration function takes one out-pointer to an int (which it
            // ignores), which `v` is, and only returns 0.
            black_box(unsafe { func(&mut v) });
        }
        per_call.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
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
    /// The last re-measurements, ns per hit (the newest last).
    recent: Vec<f64>,
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

/// Keeps the calibration probes attached and re-measures their cost.
pub struct Calibrator {
    classes: Vec<Class>,
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
        let in_band_total = |probes: &Probes| -> Result<(u64, u64), ProbeError> {
            Ok(probes
                .read_stats()?
                .iter()
                .filter(|(k, _)| k.tgid == me && k.api == ProbeCookie::CALIBRATION_API)
                .fold((0, 0), |(c, t), (_, s)| (c + s.calls, t + s.total_ns)))
        };
        let (mut classes, mut costs, mut calls) = (Vec::new(), Vec::new(), 0u64);
        for (prologue, name, func, _, unprobed) in found {
            let before = in_band_total(probes)?;
            // A single-stepped probe can cost ~15 us in a VM: size batches to finish in ~100 ms.
            let probe_once = time_calls(func, 20, 1);
            let batch = batch_for(Duration::from_millis(10), probe_once);
            let probed = time_calls(func, batch, 9);
            let after = in_band_total(probes)?;
            let (n, total) = (after.0 - before.0, after.1.saturating_sub(before.1));
            let inband_ns = if n > 0 {
                (total as f64 / n as f64 - unprobed).max(0.0)
            } else {
                0.0
            };
            calls += u64::from(batch) * 9 + 20;
            let per_hit_ns = (probed - unprobed).max(0.0);
            classes.push(Class {
                func,
                burst: batch_for(Duration::from_micros(700), probed),
                recent: vec![(probed - unprobed).max(0.0)],
            });
            costs.push(ClassCost {
                prologue,
                target: format!("self:{name}"),
                unprobed_ns: unprobed,
                per_hit_ns,
                inband_ns,
                last_per_hit_ns: per_hit_ns,
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
            classes: costs,
            process_prologue: BTreeMap::new(),
        };
        cost.set_main(default_main);
        Ok(Calibrator {
            classes,
            cost,
            default_main,
            calls_seen: BTreeMap::new(),
        })
    }

    /// Re-measures the cost of a hit of every class with probed calls (three short batches each, the
    /// median: about 2 ms a class) and charges the calls each process made since the last poll
    /// at the median of the last [`RECENT`] measurements. `calls` is every process's probed calls
    /// so far, by the class of the functions called.
    pub fn remeasure(&mut self, calls: &BTreeMap<(u32, Prologue), u64>) {
        let mut per_hit = BTreeMap::new();
        for (class, cost) in self.classes.iter_mut().zip(&mut self.cost.classes) {
            // Only classes with probed calls: each burst takes CPU time from the workloads.
            if !calls.keys().any(|(_, p)| *p == cost.prologue) {
                continue;
            }
            let probed = time_calls(class.func, class.burst, 3);
            // The unprobed time again, around the same moment: the body's own time moves with
            // the machine (on the VM by 1.7x between modes), and a baseline from the start would
            // put that move into the cost of a hit.
            let unprobed = time_calls(UNPROBED_BODY, class.burst, 3);
            cost.unprobed_ns = unprobed;
            let now = (probed - unprobed).max(0.0);
            if class.recent.len() == RECENT {
                class.recent.remove(0);
            }
            class.recent.push(now);
            let current = median(&class.recent);
            per_hit.insert(cost.prologue, current);
            cost.last_per_hit_ns = current;
            self.cost.calls += u64::from(class.burst) * 3;
        }
        self.cost.remeasured += 1;
        let charged = charge(
            &mut self.cost.charged_ns,
            &mut self.calls_seen,
            calls,
            |p| per_hit.get(&p).copied().unwrap_or(0.0),
        );
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
            self.cost.process_prologue.remove(p);
        }
    }
}

/// Charges each process's calls since the last poll at the cost of their class; returns the
/// calls charged per class.
fn charge(
    charged: &mut BTreeMap<u32, f64>,
    seen: &mut BTreeMap<(u32, Prologue), u64>,
    calls: &BTreeMap<(u32, Prologue), u64>,
    per_hit: impl Fn(Prologue) -> f64,
) -> BTreeMap<Prologue, u64> {
    let mut by_class = BTreeMap::new();
    for (&key, &n) in calls {
        // Fewer calls than last time: the rows were removed and the pid reused.
        let before = seen.get(&key).copied().filter(|&b| b <= n).unwrap_or(0);
        *charged.entry(key.0).or_insert(0.0) += (n - before) as f64 * per_hit(key.1);
        *by_class.entry(key.1).or_insert(0) += n - before;
        seen.insert(key, n);
    }
    by_class
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_interval_is_charged_at_its_own_cost_and_class() {
        let (mut charged, mut seen) = (BTreeMap::new(), BTreeMap::new());
        let cost = |k: f64| move |p: Prologue| if p == Prologue::Push { k } else { 10.0 * k };
        let (push, other) = (Prologue::Push, Prologue::Other);
        let by = charge(
            &mut charged,
            &mut seen,
            &[((7, push), 100)].into(),
            cost(1_000.0),
        );
        assert_eq!(by, [(push, 100)].into());
        let by = charge(
            &mut charged,
            &mut seen,
            &[((7, push), 300), ((7, other), 5), ((8, push), 50)].into(),
            cost(2_000.0),
        );
        assert_eq!(by, [(push, 250), (other, 5)].into());
        assert_eq!(
            charged[&7],
            100.0 * 1_000.0 + 200.0 * 2_000.0 + 5.0 * 20_000.0
        );
        assert_eq!(charged[&8], 50.0 * 2_000.0);
        // A reused pid whose rows were removed starts again.
        charge(
            &mut charged,
            &mut seen,
            &[((8, push), 10)].into(),
            cost(3_000.0),
        );
        assert_eq!(charged[&8], 50.0 * 2_000.0 + 10.0 * 3_000.0);
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
        let main = ProbeCost {
            target: String::new(),
            prologue: Prologue::Other,
            calls: 0,
            unprobed_ns: 0.0,
            per_hit_ns: 0.0,
            inband_ns: 0.0,
            remeasured: 0,
            last_per_hit_ns: 0.0,
            charged_ns: BTreeMap::new(),
            classes: [(Prologue::Push, 1_000.0), (Prologue::Other, 3_000.0)]
                .map(|(prologue, ns)| ClassCost {
                    prologue,
                    target: String::new(),
                    unprobed_ns: 1.0,
                    per_hit_ns: ns,
                    inband_ns: ns / 2.0,
                    last_per_hit_ns: ns,
                    charged_calls: 0,
                })
                .into(),
            process_prologue: [(7, Prologue::Push)].into(),
        };
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
