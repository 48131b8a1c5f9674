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
    let want =
        a.rates.as_ref().unwrap().allocations_per_s + b.rates.as_ref().unwrap().allocations_per_s;
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
    // Largest first; not measured sorts last.
    let none = BTreeSet::new();
    let how = Arrangement {
        sort: SortKey::Sm,
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
