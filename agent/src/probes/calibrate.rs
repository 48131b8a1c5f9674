//! Measures what one probe hit (entry + return) costs on this host, so that the agent can report
//! its own overhead instead of quoting someone else's figure.
//!
//! The target is `cuDriverGetVersion` in the host's libcuda when there is one (a call that touches
//! no device and works without a GPU; its prologue is the kind every probed driver entry point
//! has), else a function of the agent's own binary. The probes are scoped to the calling thread,
//! so nothing else on the host pays for the measurement. This is the only place where the agent
//! itself calls into libcuda.
//!
//! The cost of a probe hit is not a constant: on a shared or virtual machine it moves by 2x with
//! what the other CPUs are doing (docs/attribute.md, "Accuracy"). The probes therefore stay
//! attached to the target (they cost nothing while the agent does not call it), and a short burst
//! of calls re-measures the cost at every poll ([`Calibrator::remeasure`]): the calls probed
//! between two polls are charged at the cost measured around them.

use std::{
    collections::BTreeMap,
    ffi::CString,
    hint::black_box,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use agent_common::ProbeCookie;

use super::{ProbeError, Probes, symbols::Prologue};
use crate::discovery::LibraryFile;

/// The measured cost of one probed call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCost {
    /// What was probed: `libcuda:cuDriverGetVersion` or `self`.
    pub target: String,
    pub prologue: Prologue,
    /// Probed calls made.
    pub calls: u64,
    /// Median cost of an unprobed call, ns.
    pub unprobed_ns: f64,
    /// Median added cost of one entry + return probe hit, ns.
    pub per_hit_ns: f64,
    /// The part of that cost that falls inside the latency the probes measure (their mean
    /// in-kernel latency of a function that takes a few ns): subtracted when attributing time to
    /// the driver.
    #[serde(default)]
    pub inband_ns: f64,
    /// Re-measurements since the start (one per poll).
    #[serde(default)]
    pub remeasured: u64,
    /// The last re-measured cost of one hit, ns.
    #[serde(default)]
    pub last_per_hit_ns: f64,
    /// Probe cost charged so far per process (host pid), ns: each poll interval's probed calls
    /// times the cost measured around that interval. Cumulative, like the other counters.
    #[serde(default)]
    pub charged_ns: BTreeMap<u32, f64>,
}

type DriverGetVersion = unsafe extern "C" fn(*mut i32) -> i32;

/// A function of the agent's own binary to probe when there is no libcuda.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn vgpu_agent_calibration_target(v: *mut i32) -> i32 {
    black_box(v);
    0
}

struct Target {
    path: PathBuf,
    file_offset: u64,
    prologue: Prologue,
    func: DriverGetVersion,
    name: String,
}

fn libcuda_target(lib: &LibraryFile) -> Option<Target> {
    let data = std::fs::read(&lib.attach_path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let (file_offset, prologue) =
        super::symbols::find_function(&file, &data, "cuDriverGetVersion")?;
    let cpath = CString::new(lib.attach_path.as_os_str().as_bytes()).ok()?;
    // SAFETY: dlopen of the driver library runs its initialisers, which neither touch a device
    // nor start threads before cuInit; the handle is deliberately kept for the process's life
    // (the function pointer below must stay valid).
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated name on a valid handle.
    let sym = unsafe { libc::dlsym(handle, c"cuDriverGetVersion".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: cuDriverGetVersion has this C signature in every CUDA version.
    let func: DriverGetVersion =
        unsafe { std::mem::transmute::<*mut libc::c_void, DriverGetVersion>(sym) };
    Some(Target {
        path: lib.attach_path.clone(),
        file_offset,
        prologue,
        func,
        name: "libcuda:cuDriverGetVersion".into(),
    })
}

fn self_target() -> Option<Target> {
    let path = std::fs::read_link("/proc/self/exe").ok()?;
    let data = std::fs::read(&path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let (file_offset, prologue) =
        super::symbols::find_function(&file, &data, "vgpu_agent_calibration_target")?;
    Some(Target {
        path,
        file_offset,
        prologue,
        func: self_call,
        name: "self".into(),
    })
}

unsafe extern "C" fn self_call(v: *mut i32) -> i32 {
    vgpu_agent_calibration_target(v)
}

/// Median ns per call over `batches` batches of `batch` calls.
fn time_calls(func: DriverGetVersion, batch: u32, batches: u32) -> f64 {
    let mut per_call = Vec::with_capacity(batches as usize);
    let mut v = 0i32;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..batch {
            // SAFETY: `func` takes one out-pointer to an int, which `v` is.
            black_box(unsafe { func(&mut v) });
        }
        per_call.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

/// Keeps the calibration probes attached and re-measures their cost.
pub struct Calibrator {
    func: DriverGetVersion,
    /// Calls per burst (sized to take about a millisecond probed).
    burst: u32,
    pub cost: ProbeCost,
    /// Probed calls per process at the last poll.
    calls_seen: BTreeMap<u32, u64>,
}

/// Calls per burst batch: about `target` of probed calls at `probed_ns` each.
fn batch_for(target: Duration, probed_ns: f64) -> u32 {
    ((target.as_nanos() as f64 / probed_ns.max(1.0)) as u32).clamp(20, 5_000)
}

impl Calibrator {
    /// Calibrates on `libcuda` (when given) or on the agent itself.
    pub fn start(
        probes: &mut Probes,
        libcuda: Option<&LibraryFile>,
    ) -> Result<Calibrator, ProbeError> {
        let target = libcuda
            .and_then(libcuda_target)
            .or_else(self_target)
            .ok_or_else(|| ProbeError::NotElf {
                path: Path::new("/proc/self/exe").to_owned(),
                reason: "no calibration target found".into(),
            })?;
        let unprobed = time_calls(target.func, 2_000, 9);
        // The links stay attached for the agent's life (scoped to it, they cost nothing else).
        probes.attach_calibration(&target.path, target.file_offset)?;
        // A single-stepped probe can cost ~15 us in a VM: size batches to finish in ~100 ms.
        let probe_once = time_calls(target.func, 20, 1);
        let batch = batch_for(Duration::from_millis(10), probe_once);
        let probed = time_calls(target.func, batch, 9);
        let me = std::process::id();
        let (calls, total_ns) = probes
            .read_stats()?
            .iter()
            .filter(|(k, _)| k.tgid == me && k.api == ProbeCookie::CALIBRATION_API)
            .fold((0u64, 0u64), |(c, t), (_, s)| (c + s.calls, t + s.total_ns));
        let inband_ns = if calls > 0 {
            (total_ns as f64 / calls as f64 - unprobed).max(0.0)
        } else {
            0.0
        };
        probes.remove_stats_rows(me, ProbeCookie::CALIBRATION_API)?;
        let per_hit_ns = (probed - unprobed).max(0.0);
        Ok(Calibrator {
            func: target.func,
            burst: batch_for(Duration::from_micros(700), probed),
            cost: ProbeCost {
                target: target.name,
                prologue: target.prologue,
                calls: u64::from(batch) * 9 + 20,
                unprobed_ns: unprobed,
                per_hit_ns,
                inband_ns,
                remeasured: 0,
                last_per_hit_ns: per_hit_ns,
                charged_ns: BTreeMap::new(),
            },
            calls_seen: BTreeMap::new(),
        })
    }

    /// Re-measures the cost of a hit (three short batches, the median: about 2 ms) and charges
    /// the calls each process made since the last poll at the mean of the cost measured before
    /// and after them. `calls` is every process's probed calls so far.
    pub fn remeasure(&mut self, calls: &BTreeMap<u32, u64>) {
        let probed = time_calls(self.func, self.burst, 3);
        let now = (probed - self.cost.unprobed_ns).max(0.0);
        let per_hit = (now + self.cost.last_per_hit_ns) / 2.0;
        self.cost.remeasured += 1;
        self.cost.calls += u64::from(self.burst) * 3;
        self.cost.last_per_hit_ns = now;
        charge(
            &mut self.cost.charged_ns,
            &mut self.calls_seen,
            calls,
            per_hit,
        );
    }

    /// Forgets exited processes.
    pub fn forget(&mut self, pids: &[u32]) {
        for p in pids {
            self.calls_seen.remove(p);
            self.cost.charged_ns.remove(p);
        }
    }
}

/// Charges each process's calls since the last poll at `per_hit` ns.
fn charge(
    charged: &mut BTreeMap<u32, f64>,
    seen: &mut BTreeMap<u32, u64>,
    calls: &BTreeMap<u32, u64>,
    per_hit: f64,
) {
    for (&pid, &n) in calls {
        // Fewer calls than last time: the rows were removed and the pid reused.
        let before = seen.get(&pid).copied().filter(|&b| b <= n).unwrap_or(0);
        *charged.entry(pid).or_insert(0.0) += (n - before) as f64 * per_hit;
        seen.insert(pid, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_interval_is_charged_at_its_own_cost() {
        let (mut charged, mut seen) = (BTreeMap::new(), BTreeMap::new());
        charge(&mut charged, &mut seen, &[(7, 100)].into(), 1_000.0);
        charge(
            &mut charged,
            &mut seen,
            &[(7, 300), (8, 50)].into(),
            2_000.0,
        );
        assert_eq!(charged[&7], 100.0 * 1_000.0 + 200.0 * 2_000.0);
        assert_eq!(charged[&8], 50.0 * 2_000.0);
        // A reused pid whose rows were removed starts again.
        charge(&mut charged, &mut seen, &[(7, 10)].into(), 3_000.0);
        assert_eq!(
            charged[&7],
            100.0 * 1_000.0 + 200.0 * 2_000.0 + 10.0 * 3_000.0
        );
    }

    #[test]
    fn batches_take_about_the_time_asked() {
        assert_eq!(batch_for(Duration::from_micros(700), 3_500.0), 200);
        assert_eq!(batch_for(Duration::from_millis(10), 0.0), 5_000);
        assert_eq!(batch_for(Duration::from_micros(10), 15_000.0), 20);
    }
}
