//! What the probes report about themselves: how they attach, when the launch probes run, what a
//! probe hit costs and what budgeted sampling did. Plain data; `crate::probes` fills it.

pub mod exposure;

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

pub use exposure::Exposure;

/// How the probes attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachMode {
    /// One uprobe_multi link per program and library.
    Multi,
    /// One perf-event link per symbol.
    PerSymbol,
}

/// When the launch-family probes are attached. Off by default: an entry+return probe adds about
/// 1.7 us to a 3.2 us kernel launch (docs/gpu-validation.md, shared notes), so they are for short
/// investigations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum LaunchProbes {
    Off,
    /// Every launch (without a probe budget).
    On,
    /// In the probe budget's windows, like the other high-rate kinds (their duty and rate in
    /// [`SamplingStatus`]): `--probe-launches` with a budget.
    Budget,
    /// Attached for `window` out of every `period` (`--probe-launches sampled` without a budget).
    Sampled {
        #[serde(with = "crate::units::serde_secs")]
        window: Duration,
        #[serde(with = "crate::units::serde_secs")]
        period: Duration,
    },
}

/// The first instruction of a probed function decides what a uprobe hit costs: the kernel
/// emulates `push` and `nop5`, but must single-step most others (about 30x slower in a VM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prologue {
    /// `push %rbp` and other pushes: emulated.
    Push,
    /// A 5-byte nop: optimised to a call on recent kernels.
    Nop5,
    /// `endbr64` (CET builds) followed by a push: probed on the push, past the `endbr64` (which
    /// the kernel would single-step), so emulated as a push is.
    Endbr64,
    /// A jump or conditional jump that every call reaches first, after instructions that
    /// change only the flags (e.g. Debian's libcuda 5xx: a compare of a RIP-relative word, then
    /// `je`): probed on the jump, which the kernel emulates.
    Branch,
    /// Anything else (an `endbr64` followed by anything but a push included): usually
    /// single-stepped.
    Other,
}

/// The measured cost of one probed call of one prologue class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassCost {
    pub prologue: Prologue,
    /// The calibration function measured (a symbol of the agent's binary).
    pub target: String,
    /// Median cost of an unprobed call, ns.
    pub unprobed_ns: f64,
    /// Added cost of one entry + return hit when the agent started, ns.
    pub per_hit_ns: f64,
    /// The part of that cost that falls inside the latency the probes measure (the latency they
    /// measured of the calibration function less its unprobed time; the median of the last few
    /// re-measurements): subtracted when attributing time to the driver.
    pub inband_ns: f64,
    /// The current cost of one hit (the median of the last few re-measurements), ns.
    pub last_per_hit_ns: f64,
    /// One standard error of `last_per_hit_ns`, ns: the spread of the re-measurements it is the
    /// median of (of the batches of the one measurement while there is only one).
    #[serde(default)]
    pub last_se_ns: f64,
    /// Probed calls of this class charged so far, all processes.
    pub charged_calls: u64,
}

/// The measured cost of probed calls, and what was charged to each process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// One standard error of `charged_ns` per process, ns: each interval's calls times the
    /// standard error of the cost they were charged at, summed (not in quadrature: consecutive
    /// intervals are priced from overlapping re-measurements, so their errors are correlated).
    #[serde(default)]
    pub charged_se_ns: BTreeMap<u32, f64>,
    /// The in-band part of the hits charged per process, ns (each interval's calls times the
    /// in-band cost then): what its probed calls' measured latencies are corrected by.
    #[serde(default)]
    pub charged_inband_ns: BTreeMap<u32, f64>,
    /// Hits charged per process whose calls the probes did not count (returns without their
    /// entry, at a sampling window's edge: `ApiStats::unpaired`); they are in `charged_ns` but
    /// not in the in-band part. Cumulative.
    #[serde(default)]
    pub unpaired_hits: BTreeMap<u32, u64>,
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
}

/// What the probes could not record for a process (or, summed, a container): its figures from
/// the probes are incomplete, not exact, while any of these is non-zero. Cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeLosses {
    /// Successful allocations the probes could not track as live memory: past the process's
    /// share of the kernel's allocation table (`--probe-alloc-quota`), or the table full. Its
    /// live-memory figure (`memory.probes`) is short by up to `bytes_untracked`.
    pub allocations_untracked: u64,
    pub bytes_untracked: u64,
    /// Calls not counted: the aggregation row they needed was refused (their cgroup's rows
    /// quota, `--probe-row-quota`, used up, or the map full).
    pub calls_unaggregated: u64,
    /// Aggregation rows whose counters went back (removed and re-created behind the agent): the
    /// agent adds what they had before, but calls made between may be missing.
    pub rows_reset: u64,
}

impl ProbeLosses {
    pub fn is_empty(&self) -> bool {
        *self == ProbeLosses::default()
    }

    /// The live-memory figure lost allocations.
    pub fn memory_incomplete(&self) -> bool {
        self.allocations_untracked > 0
    }

    pub fn add(&mut self, o: &ProbeLosses) {
        self.allocations_untracked += o.allocations_untracked;
        self.bytes_untracked += o.bytes_untracked;
        self.calls_unaggregated += o.calls_unaggregated;
        self.rows_reset += o.rows_reset;
    }
}

/// What the schedule did, for the model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingStatus {
    /// The budget, a share of wall time.
    pub budget_share: f64,
    pub window_seconds: f64,
    pub kinds: Vec<KindSampling>,
    /// Per process (host pid) and kind, cumulative up to the last reading: see [`Exposure`].
    pub exposure: BTreeMap<u32, BTreeMap<String, Exposure>>,
}

fn one() -> f64 {
    1.0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindSampling {
    pub kind: String,
    /// Share of the time it is attached now.
    pub duty: f64,
    /// What a window's whole cycle cost the busiest process (its attach and detach, the calls in
    /// flight across them) over what its rate planned for the window alone; the gaps are that
    /// much longer (1 when it fits the budget whole).
    #[serde(default = "one")]
    pub overrun: f64,
    /// Calls per second of the busiest process in its last window.
    pub rate_per_second: f64,
    /// Seconds attached so far.
    pub attached_seconds: f64,
}
