//! What one row of the table shows, computed from the model by pure functions: per process, and
//! per container (memory against its limit from the regions, sums of the processes' rates, the
//! worst p99, drift if any process drifts). Sorting, filtering and the tree are here too, so the
//! view only lays rows out.

use std::collections::BTreeSet;

use super::gpu_time::limiter_busy;
use crate::model::{ApiUsage, Container, Process, ProcessKey, Snapshot};

/// A container's memory limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// No region: nothing enforces a limit that the agent can see.
    None,
    /// A region says there is no limit.
    Unlimited,
    Bytes(u64),
}

/// A utilisation figure from NVML's per-process samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Util {
    /// Nothing measured yet (no NVML, or the first snapshot).
    #[default]
    Unknown,
    /// The device gives no per-process utilisation (MIG, vGPU, an older GPU): not 0.
    NotAvailable,
    /// Percent of one device's time, summed over devices (two busy GPUs: 200%).
    Pct(f64),
}

impl Util {
    fn sort_value(self) -> f64 {
        match self {
            Util::Pct(v) => v,
            Util::NotAvailable | Util::Unknown => -1.0,
        }
    }
}

/// Which source a row's GPU busy share comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BusySource {
    /// The limiter's timing of the launches (every process of the row timed).
    Limiter,
    /// NVML's SM samples (no process of the row timed by the limiter).
    #[default]
    Nvml,
    /// Some processes timed by the limiter, the others NVML's samples, summed.
    Mixed,
}

/// A row's GPU busy share: the limiter's timing where it timed the processes (the figure that
/// is each tenant's own on a shared GPU), else NVML's SM samples; the table marks the source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BusyFigure {
    pub share: Util,
    pub source: BusySource,
}

impl BusyFigure {
    fn of_process(p: &Process, sm: Util) -> BusyFigure {
        match limiter_busy(p) {
            Some(r) => BusyFigure {
                share: Util::Pct(r * 100.0),
                source: BusySource::Limiter,
            },
            None => BusyFigure {
                share: sm,
                source: BusySource::Nvml,
            },
        }
    }

    /// A container's: its live processes' summed; NVML's summed per device (`sm`) where the
    /// limiter timed none of them.
    fn of_container(processes: &[BusyFigure], sm: Util) -> BusyFigure {
        let timed = processes
            .iter()
            .filter(|b| b.source == BusySource::Limiter)
            .count();
        if timed == 0 {
            return BusyFigure {
                share: sm,
                source: BusySource::Nvml,
            };
        }
        let sum = processes
            .iter()
            .filter_map(|b| match b.share {
                Util::Pct(v) => Some(v),
                Util::NotAvailable | Util::Unknown => None,
            })
            .sum();
        BusyFigure {
            share: Util::Pct(sum),
            source: if timed == processes.len() {
                BusySource::Limiter
            } else {
                BusySource::Mixed
            },
        }
    }
}

/// SM and memory-bandwidth use of some processes in the latest window.
fn utils(snap: &Snapshot, keys: &[ProcessKey]) -> (Util, Util) {
    let m = snap.gpu_use_of(keys);
    if !m.devices.is_empty() {
        let sum = |f: fn(&crate::model::gpu_use::DeviceUse) -> f64| m.devices.iter().map(f).sum();
        (
            Util::Pct(sum(|d| d.sm_util_pct)),
            Util::Pct(sum(|d| d.mem_util_pct)),
        )
    } else if !m.unavailable.is_empty() {
        (Util::NotAvailable, Util::NotAvailable)
    } else {
        (Util::Unknown, Util::Unknown)
    }
}

/// The figures of one row, a container's or a process's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    pub processes: usize,
    /// GPU memory used (limiter accounting, else NVML, else what the probes tracked).
    pub memory: Option<u64>,
    /// SM busy share in the latest NVML window (always measured, limit or not).
    pub sm: Util,
    /// Memory-bandwidth busy share in the latest NVML window.
    pub mem_bw: Util,
    /// GPU busy share, the limiter's where it timed the processes (the GPU% column).
    pub busy: BusyFigure,
    pub allocs_per_s: Option<f64>,
    pub launches_per_s: Option<f64>,
    /// p99 of all CUDA API calls seen so far, ns.
    pub p99_ns: Option<u64>,
    pub sync_share: Option<f64>,
    pub nccl_bytes_per_s: Option<f64>,
    pub throttled_share: Option<f64>,
    /// Allocations the limiter denied (cumulative).
    pub denied: u64,
    /// The views of memory that disagree, if any.
    pub drift: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerRow<'a> {
    pub container: &'a Container,
    pub figures: Figures,
    pub limit: Limit,
    /// (limit, context charge) of a device whose limit is smaller than one process's context
    /// charge: every allocation there is denied.
    pub limit_below_context: Option<(u64, u64)>,
}

/// One process's memory as the table shows it (an exited process holds none).
pub fn process_memory(p: &Process) -> Option<u64> {
    if !p.alive {
        return None;
    }
    let m = &p.memory;
    m.limiter.or(m.nvml).or(m.probes)
}

/// Every API's histogram merged into one.
pub fn merged_hist(apis: &[&ApiUsage]) -> Vec<u64> {
    let mut h = vec![0u64; agent_common::hist::HIST_BUCKETS];
    for a in apis {
        for (d, s) in h.iter_mut().zip(&a.hist) {
            *d += s;
        }
    }
    h
}

fn p99_of(hist: Vec<u64>) -> Option<u64> {
    let u = ApiUsage {
        api: String::new(),
        kind: String::new(),
        source: crate::model::Source::Probes,
        calls: 0,
        errors: 0,
        bytes: 0,
        total_ns: 0,
        hook_ns: 0,
        denied: 0,
        hist,
        latency: None,
        probed: None,
    };
    u.quantile_ns(0.99)
}

pub fn process_figures(p: &Process) -> Figures {
    let apis = p.effective_apis();
    let r = p.rates.as_ref();
    let measured: Vec<_> = p
        .nvml
        .iter()
        .filter_map(|n| n.sm_util_pct.zip(n.use_window))
        .collect();
    let (sm, mem_bw) = if !measured.is_empty() {
        (
            Util::Pct(measured.iter().map(|m| m.0).sum()),
            Util::Pct(p.nvml.iter().filter_map(|n| n.mem_util_pct).sum()),
        )
    } else if p.nvml.iter().any(|n| n.use_unavailable.is_some()) {
        (Util::NotAvailable, Util::NotAvailable)
    } else {
        (Util::Unknown, Util::Unknown)
    };
    Figures {
        processes: usize::from(p.alive),
        memory: process_memory(p),
        busy: BusyFigure::of_process(p, sm),
        sm,
        mem_bw,
        allocs_per_s: r.map(|r| r.allocations_per_s),
        launches_per_s: r.map(|r| r.launches_per_s),
        p99_ns: p99_of(merged_hist(&apis)),
        sync_share: r.map(|r| r.sync_share),
        nccl_bytes_per_s: r.map(|r| r.nccl_bytes_per_s),
        throttled_share: r.map(|r| r.throttled_share),
        denied: apis.iter().map(|a| a.denied).sum(),
        drift: p.memory.drift.as_ref().map(|d| d.between.clone()),
    }
}

fn add(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, None) => x,
        (None, y) => y,
    }
}

/// A container's row: sums over its processes; memory and limit from its regions when it has
/// any (what the limiter charged), else the sum of its processes' memory.
pub fn container_row<'a>(snap: &Snapshot, c: &'a Container) -> ContainerRow<'a> {
    let procs: Vec<&Process> = c
        .processes
        .iter()
        .filter_map(|k| snap.process(*k))
        .collect();
    let mut f = Figures {
        processes: procs.iter().filter(|p| p.alive).count(),
        ..Figures::default()
    };
    let mut all_apis = Vec::new();
    let mut busy = Vec::new();
    for p in &procs {
        let pf = process_figures(p);
        if p.alive {
            busy.push(pf.busy);
        }
        f.memory = match (f.memory, pf.memory) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        f.allocs_per_s = add(f.allocs_per_s, pf.allocs_per_s);
        f.launches_per_s = add(f.launches_per_s, pf.launches_per_s);
        f.sync_share = add(f.sync_share, pf.sync_share);
        f.nccl_bytes_per_s = add(f.nccl_bytes_per_s, pf.nccl_bytes_per_s);
        f.throttled_share = add(f.throttled_share, pf.throttled_share);
        f.denied += pf.denied;
        if f.drift.is_none() {
            f.drift = pf.drift;
        }
        all_apis.extend(p.effective_apis());
    }
    f.p99_ns = p99_of(merged_hist(&all_apis));
    (f.sm, f.mem_bw) = utils(snap, &c.processes);
    f.busy = BusyFigure::of_container(&busy, f.sm);
    let devices: Vec<_> = c.regions.iter().flat_map(|r| &r.devices).collect();
    // A region has a limit for every device of the node; the container's limit is the sum over
    // the devices it uses (holds memory on or was denied on), else its first device's: a 4 GiB
    // limit on each of 8 GPUs is not 32 GiB for a container on one of them.
    let in_use: Vec<_> = devices
        .iter()
        .filter(|d| d.reserved > 0 || d.denied > 0)
        .collect();
    let limited: Vec<_> = if in_use.is_empty() {
        c.regions.iter().filter_map(|r| r.devices.first()).collect()
    } else {
        in_use.into_iter().copied().collect()
    };
    let limit = if devices.is_empty() {
        Limit::None
    } else {
        f.memory = Some(devices.iter().map(|d| d.reserved).sum());
        f.denied = f.denied.max(devices.iter().map(|d| d.denied).sum());
        if limited.iter().any(|d| d.memory_limit == 0) {
            Limit::Unlimited
        } else {
            Limit::Bytes(limited.iter().map(|d| d.memory_limit).sum())
        }
    };
    let limit_below_context = devices
        .iter()
        .find(|d| d.limit_below_context())
        .and_then(|d| Some((d.memory_limit, d.context_charge?)));
    ContainerRow {
        container: c,
        figures: f,
        limit,
        limit_below_context,
    }
}

/// The container's name as shown: `namespace/pod/container` for pods, else its name, else its key.
pub fn container_label(c: &Container) -> String {
    match (&c.namespace, &c.pod_name) {
        (Some(ns), Some(pod)) if c.name.is_empty() => format!("{ns}/{pod}"),
        (Some(ns), Some(pod)) => format!("{ns}/{pod}/{}", c.name),
        _ if !c.name.is_empty() => c.name.clone(),
        _ => short_key(&c.key),
    }
}

/// Container ids shortened to 12 characters, as docker shows them.
pub fn short_key(key: &str) -> String {
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        key[..12].to_string()
    } else {
        key.to_string()
    }
}

/// The columns the table can be sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortKey {
    Name,
    Processes,
    Memory,
    Gpu,
    Allocs,
    Launches,
    P99,
    Sync,
    Nccl,
    Throttled,
    Denied,
}

impl SortKey {
    pub const ALL: [SortKey; 11] = [
        SortKey::Name,
        SortKey::Processes,
        SortKey::Memory,
        SortKey::Gpu,
        SortKey::Allocs,
        SortKey::Launches,
        SortKey::P99,
        SortKey::Sync,
        SortKey::Nccl,
        SortKey::Throttled,
        SortKey::Denied,
    ];

    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    /// A number to sort by (names sort separately).
    fn value(self, f: &Figures) -> f64 {
        let o = |v: Option<f64>| v.unwrap_or(-1.0);
        match self {
            SortKey::Name => 0.0,
            SortKey::Processes => f.processes as f64,
            SortKey::Memory => f.memory.map(|m| m as f64).unwrap_or(-1.0),
            SortKey::Gpu => f.busy.share.sort_value(),
            SortKey::Allocs => o(f.allocs_per_s),
            SortKey::Launches => o(f.launches_per_s),
            SortKey::P99 => f.p99_ns.map(|m| m as f64).unwrap_or(-1.0),
            SortKey::Sync => o(f.sync_share),
            SortKey::Nccl => o(f.nccl_bytes_per_s),
            SortKey::Throttled => o(f.throttled_share),
            SortKey::Denied => f.denied as f64,
        }
    }
}

/// Which row is meant: stable across snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowId {
    Container(String),
    Process(ProcessKey),
}

#[derive(Clone, Debug, PartialEq)]
pub enum RowKind<'a> {
    Container {
        row: ContainerRow<'a>,
        expanded: bool,
    },
    Process {
        process: &'a Process,
        figures: Figures,
        /// Last child of its container (for the tree's corner).
        last: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Row<'a> {
    pub id: RowId,
    pub kind: RowKind<'a>,
}

/// How the table is arranged.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrangement<'s> {
    pub sort: SortKey,
    /// Largest first (the default for figures; names sort A to Z when false).
    pub descending: bool,
    pub filter: &'s str,
    pub expanded: &'s BTreeSet<String>,
    /// Every container expanded.
    pub tree: bool,
}

fn matches_process(p: &Process, needle: &str) -> bool {
    p.comm.to_lowercase().contains(needle)
        || p.cmdline.to_lowercase().contains(needle)
        || p.key.pid.to_string() == needle
}

fn matches_container(c: &Container, needle: &str) -> bool {
    container_label(c).to_lowercase().contains(needle) || c.key.to_lowercase().contains(needle)
}

fn order(a: (&str, &Figures), b: (&str, &Figures), how: &Arrangement) -> std::cmp::Ordering {
    let by_name = a.0.cmp(b.0);
    let o = if how.sort == SortKey::Name {
        by_name
    } else {
        how.sort
            .value(a.1)
            .total_cmp(&how.sort.value(b.1))
            .then(by_name.reverse())
    };
    if how.descending { o.reverse() } else { o }
}

/// The rows to show, in order: containers, each followed by its processes when expanded. A filter
/// keeps a container whose name matches (with all its processes) or any of whose processes match
/// (with those only).
pub fn rows<'a>(snap: &'a Snapshot, how: &Arrangement) -> Vec<Row<'a>> {
    let needle = how.filter.trim().to_lowercase();
    let mut containers: Vec<(ContainerRow<'a>, Vec<(&'a Process, Figures)>)> = Vec::new();
    for c in &snap.containers {
        let procs: Vec<&Process> = c
            .processes
            .iter()
            .filter_map(|k| snap.process(*k))
            .collect();
        let name_hit = needle.is_empty() || matches_container(c, &needle);
        let shown: Vec<&Process> = if name_hit {
            procs
        } else {
            procs
                .into_iter()
                .filter(|p| matches_process(p, &needle))
                .collect()
        };
        if !name_hit && shown.is_empty() {
            continue;
        }
        let mut procs: Vec<(&Process, Figures)> =
            shown.into_iter().map(|p| (p, process_figures(p))).collect();
        procs.sort_by(|a, b| {
            order(
                (&a.0.key.pid.to_string(), &a.1),
                (&b.0.key.pid.to_string(), &b.1),
                how,
            )
        });
        containers.push((container_row(snap, c), procs));
    }
    containers.sort_by(|a, b| {
        order(
            (&container_label(a.0.container), &a.0.figures),
            (&container_label(b.0.container), &b.0.figures),
            how,
        )
    });
    let mut out = Vec::new();
    for (row, procs) in containers {
        let key = row.container.key.clone();
        let expanded = how.tree || how.expanded.contains(&key) || !needle.is_empty();
        out.push(Row {
            id: RowId::Container(key),
            kind: RowKind::Container { row, expanded },
        });
        if expanded {
            let n = procs.len();
            for (i, (process, figures)) in procs.into_iter().enumerate() {
                out.push(Row {
                    id: RowId::Process(process.key),
                    kind: RowKind::Process {
                        process,
                        figures,
                        last: i + 1 == n,
                    },
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;

    fn arrangement(expanded: &BTreeSet<String>) -> Arrangement<'_> {
        Arrangement {
            sort: SortKey::Memory,
            descending: true,
            filter: "",
            expanded,
            tree: false,
        }
    }

    #[test]
    fn container_memory_and_limit_come_from_the_region() {
        let snap = fixture::snapshot();
        let c = snap
            .containers
            .iter()
            .find(|c| c.key == fixture::TRAIN_ID)
            .unwrap();
        let row = container_row(&snap, c);
        assert_eq!(row.limit, Limit::Bytes(8 << 30));
        assert_eq!(
            row.figures.memory,
            Some(6 << 30),
            "the region's reserved bytes"
        );
        assert_eq!(row.figures.processes, 2);
        let (a, b) = (&snap.processes[0], &snap.processes[1]);
        let want = a.rates.as_ref().unwrap().allocations_per_s
            + b.rates.as_ref().unwrap().allocations_per_s;
        assert_eq!(row.figures.allocs_per_s, Some(want), "rates add up");
        assert_eq!(
            row.figures.drift.as_deref(),
            Some("limiter/nvml"),
            "one drifting process flags the container"
        );
    }

    #[test]
    fn a_container_without_a_region_sums_its_processes_and_has_no_limit() {
        let snap = fixture::snapshot();
        let host = snap.containers.iter().find(|c| c.key == "host").unwrap();
        let row = container_row(&snap, host);
        assert_eq!(row.limit, Limit::None);
        assert_eq!(row.figures.memory, Some(3 << 30));
        assert_eq!(row.figures.drift, None);
    }

    #[test]
    fn denied_allocations_and_unlimited_regions() {
        let snap = fixture::snapshot();
        let c = snap
            .containers
            .iter()
            .find(|c| c.key == fixture::SQUEEZED_ID)
            .unwrap();
        let row = container_row(&snap, c);
        assert_eq!(row.figures.denied, 42);
        let u = snap
            .containers
            .iter()
            .find(|c| c.key == fixture::UNLIMITED_ID)
            .unwrap();
        assert_eq!(container_row(&snap, u).limit, Limit::Unlimited);
    }

    #[test]
    fn p99_is_the_worst_of_the_merged_histograms() {
        let snap = fixture::snapshot();
        let c = snap
            .containers
            .iter()
            .find(|c| c.key == fixture::TRAIN_ID)
            .unwrap();
        let row = container_row(&snap, c);
        let worst = c
            .processes
            .iter()
            .filter_map(|k| process_figures(snap.process(*k).unwrap()).p99_ns)
            .max();
        assert!(row.figures.p99_ns >= worst.map(|w| w / 2), "{row:?}");
        assert!(row.figures.p99_ns.is_some());
    }

    #[test]
    fn sorting_filtering_and_the_tree() {
        let snap = fixture::snapshot();
        let none = BTreeSet::new();
        let how = arrangement(&none);
        let r = rows(&snap, &how);
        assert!(
            r.iter().all(|r| matches!(r.id, RowId::Container(_))),
            "collapsed"
        );
        let mems: Vec<u64> = r
            .iter()
            .map(|r| match &r.kind {
                RowKind::Container { row, .. } => row.figures.memory.unwrap_or(0),
                _ => unreachable!(),
            })
            .collect();
        assert!(
            mems.windows(2).all(|w| w[0] >= w[1]),
            "largest memory first: {mems:?}"
        );

        let by_name = Arrangement {
            sort: SortKey::Name,
            descending: false,
            ..how.clone()
        };
        let names: Vec<String> = rows(&snap, &by_name)
            .iter()
            .map(|r| match &r.kind {
                RowKind::Container { row, .. } => container_label(row.container),
                _ => unreachable!(),
            })
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);

        let expanded: BTreeSet<String> = [fixture::TRAIN_ID.to_string()].into();
        let r = rows(&snap, &arrangement(&expanded));
        assert_eq!(
            r.len(),
            snap.containers.len() + 2,
            "the two trainer processes"
        );

        let filtered = Arrangement {
            filter: "nccl",
            ..how.clone()
        };
        let r = rows(&snap, &filtered);
        assert_eq!(
            r.len(),
            2,
            "one container with the one matching process: {r:?}"
        );
        assert!(
            matches!(&r[1].kind, RowKind::Process { process, .. } if process.cmdline.contains("nccl"))
        );

        let tree = Arrangement { tree: true, ..how };
        assert_eq!(
            rows(&snap, &tree).len(),
            snap.containers.len() + snap.processes.len()
        );
    }

    #[test]
    fn exited_processes_hold_no_memory() {
        let mut snap = fixture::snapshot();
        let host = snap
            .containers
            .iter()
            .find(|c| c.key == "host")
            .unwrap()
            .clone();
        snap.processes
            .iter_mut()
            .find(|p| p.key.pid == 777)
            .unwrap()
            .alive = false;
        let row = container_row(&snap, &host);
        assert_eq!((row.figures.memory, row.figures.processes), (None, 0));
    }

    #[test]
    fn labels() {
        let snap = fixture::snapshot();
        let c = snap
            .containers
            .iter()
            .find(|c| c.key == fixture::TRAIN_ID)
            .unwrap();
        assert_eq!(container_label(c), "ml-team/trainer-0/pytorch");
        assert_eq!(short_key(fixture::TRAIN_ID), &fixture::TRAIN_ID[..12]);
        assert_eq!(short_key("host"), "host");
    }

    #[test]
    fn sm_use_sums_per_container_and_is_n_a_never_0_where_not_measured() {
        let mut snap = fixture::snapshot();
        let row = |snap: &Snapshot, key: &str| {
            let c = snap.containers.iter().find(|c| c.key == key).unwrap();
            container_row(snap, c).figures
        };
        assert_eq!(row(&snap, fixture::TRAIN_ID).sm, Util::Pct(82.0));
        assert_eq!(row(&snap, fixture::TRAIN_ID).mem_bw, Util::Pct(75.0));
        assert_eq!(row(&snap, fixture::UNLIMITED_ID).sm, Util::NotAvailable);
        assert_eq!(process_figures(&snap.processes[0]).sm, Util::Pct(62.0));
        // GPU%: the limiter's timing where it timed the process, else NVML's; a container
        // with both sums them and says so.
        let busy = |u: f64, source| BusyFigure {
            share: Util::Pct(u),
            source,
        };
        assert_eq!(
            process_figures(&snap.processes[0]).busy,
            busy(34.0, BusySource::Limiter)
        );
        assert_eq!(
            process_figures(&snap.processes[1]).busy,
            busy(20.0, BusySource::Nvml)
        );
        assert_eq!(
            row(&snap, fixture::TRAIN_ID).busy,
            busy(54.0, BusySource::Mixed)
        );
        assert_eq!(
            row(&snap, fixture::SQUEEZED_ID).busy,
            busy(30.0, BusySource::Nvml)
        );
        assert_eq!(
            row(&snap, fixture::UNLIMITED_ID).busy.share,
            Util::NotAvailable
        );
        // Largest first; not measured sorts last.
        let none = BTreeSet::new();
        let how = Arrangement {
            sort: SortKey::Gpu,
            ..arrangement(&none)
        };
        let order: Vec<String> = rows(&snap, &how)
            .iter()
            .map(|r| match &r.kind {
                RowKind::Container { row, .. } => row.container.name.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, ["pytorch", "llm-serve", "host", "notebook"]);
        // Without NVML figures: unknown, not n/a.
        for p in &mut snap.processes {
            p.nvml.clear();
        }
        assert_eq!(row(&snap, fixture::TRAIN_ID).sm, Util::Unknown);
    }

    #[test]
    fn a_container_on_two_gpus_is_limited_by_both_and_one_on_one_gpu_by_that_one() {
        let mut snap = fixture::two_gpus::snapshot();
        let ddp = |s: &Snapshot| {
            let c = s
                .containers
                .iter()
                .find(|c| c.key == fixture::two_gpus::DDP_ID)
                .unwrap();
            let r = container_row(s, c);
            (r.figures.memory, r.limit)
        };
        assert_eq!(ddp(&snap), (Some(15 << 30), Limit::Bytes(20 << 30)));
        // Rank 1 gone from GPU1: the container uses GPU0 alone, its limit is GPU0's, not the sum
        // over every device the region has a limit for.
        snap.containers[0].regions[0].devices[1].reserved = 0;
        assert_eq!(ddp(&snap), (Some(6 << 30), Limit::Bytes(8 << 30)));
        // Nothing used yet: the first device's limit.
        snap.containers[0].regions[0].devices[0].reserved = 0;
        assert_eq!(ddp(&snap), (Some(0), Limit::Bytes(8 << 30)));
        // A device in use without a limit makes the container unlimited there.
        snap.containers[0].regions[0].devices[1].reserved = 1 << 30;
        snap.containers[0].regions[0].devices[1].memory_limit = 0;
        assert_eq!(ddp(&snap), (Some(1 << 30), Limit::Unlimited));
    }
}
