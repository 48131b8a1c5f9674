//! End-to-end behaviour of the writer API and the readers, through real files.

use std::path::Path;
use std::process::Command;

use agent_common::api::ApiId;
use agent_common::hist::bucket_of;
use region::reader::{ReadError, RegionReader, ShardProblemKind};
use region::{InitOutcome, Region, RegionConfig, ReserveError};

fn config(limit: u64, slots: u32) -> RegionConfig {
    let mut c = RegionConfig::unlimited(2);
    c.memory_limit[0] = limit;
    c.sm_limit[1] = 50;
    c.slots = slots;
    c
}

fn launch() -> ApiId {
    ApiId::from_name("cuLaunchKernel").unwrap()
}

#[test]
fn first_process_creates_later_ones_join_and_mismatches_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (a, outcome) = Region::open_or_create(&path, &config(1000, 4)).unwrap();
    assert_eq!(outcome, InitOutcome::Created);
    let (_b, outcome) = Region::open_or_create(&path, &config(1000, 4)).unwrap();
    assert_eq!(outcome, InitOutcome::Joined);
    let (c, outcome) = Region::open_or_create(&path, &config(2000, 8)).unwrap();
    match outcome {
        InitOutcome::ConfigMismatch(m) => {
            assert_eq!(m.effective.memory_limit[0], 1000);
            assert_eq!(m.requested.memory_limit[0], 2000);
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // The first initialiser wins, including the slot count.
    assert_eq!(c.limit(0), 1000);
    assert_eq!(c.slot_count(), 4);
    assert_eq!(a.sm_limit(1), 50);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, region::REGION_MODE);
    assert_eq!(
        region::REGION_MODE,
        0o600,
        "owner only: see docs/security.md"
    );
}

/// A region file the deployment created beforehand (to share it between uids) keeps its mode.
#[test]
fn an_existing_region_file_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.region");
    std::fs::File::create(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    Region::open_or_create(&path, &config(0, 4)).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666);
}

#[test]
fn reservations_are_exact_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::open_or_create(&dir.path().join("r"), &config(1000, 4)).unwrap();
    let slot = region.claim_slot().unwrap();
    region.try_reserve(&slot, 0, 600).unwrap();
    region.try_reserve(&slot, 0, 400).unwrap();
    match region.try_reserve(&slot, 0, 1) {
        Err(ReserveError::Denied { device: 0, denied }) => {
            assert_eq!(
                (denied.limit, denied.reserved, denied.requested),
                (1000, 1000, 1)
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(region.reserved(0), 1000);
    assert_eq!(region.held(&slot, 0), 1000);
    region.release(&slot, 0, 600);
    // Releasing more than held is clamped.
    region.release(&slot, 0, 10_000);
    assert_eq!(region.reserved(0), 0);
    // Device 1 is unlimited (up to what a counter holds, 2^48 - 1); device 2 does not exist.
    region
        .try_reserve(&slot, 1, region::MAX_RESERVABLE)
        .unwrap();
    assert!(matches!(
        region.try_reserve(&slot, 1, 1),
        Err(ReserveError::Denied { device: 1, .. })
    ));
    assert!(matches!(
        region.try_reserve(&slot, 2, 1),
        Err(ReserveError::NoSuchDevice { .. })
    ));
    let report = region.retire_slot(slot);
    assert_eq!(report.bytes_returned[1], region::MAX_RESERVABLE);
    assert_eq!(region.reserved(1), 0);
}

#[test]
fn a_reserver_reserves_and_releases_like_the_region() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::open_or_create(&dir.path().join("r"), &config(1000, 4)).unwrap();
    let slot = region.claim_slot().unwrap();
    let other = region.claim_slot().unwrap();
    assert!(region.reserver(&slot, 2).is_none(), "no device 2");
    let r = region.reserver(&slot, 0).unwrap();
    r.try_reserve(600).unwrap();
    // Another process's reservations count against the same limit.
    region.try_reserve(&other, 0, 300).unwrap();
    match r.try_reserve(101) {
        Err(ReserveError::Denied { device: 0, denied }) => {
            assert_eq!(
                (denied.limit, denied.reserved, denied.requested),
                (1000, 900, 101)
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    r.try_reserve(100).unwrap();
    assert_eq!((region.reserved(0), region.held(&slot, 0)), (1000, 700));
    r.release(200);
    // Releasing more than held is clamped.
    r.release(10_000);
    assert_eq!((region.reserved(0), region.held(&slot, 0)), (300, 0));
    // Operations through the reserver and through the region interleave (one ticket sequence).
    r.try_reserve(50).unwrap();
    region.release(&slot, 0, 20);
    r.try_reserve(70).unwrap();
    assert_eq!((region.reserved(0), region.held(&slot, 0)), (400, 100));
    let report = region.retire_slot(slot);
    assert_eq!(report.bytes_returned[0], 100);
    // Once the slot is retired, its reserver changes nothing.
    assert!(r.try_reserve(1).is_err());
    r.release(1);
    assert_eq!(region.reserved(0), 300);
}

#[test]
fn a_retired_handle_cannot_touch_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::open_or_create(&dir.path().join("r"), &config(0, 2)).unwrap();
    let slot = region.claim_slot().unwrap();
    let index = slot.index();
    let copy_of_handle = region.claim_slot().unwrap();
    region.retire_slot(slot);
    let again = region.claim_slot().unwrap();
    assert_eq!(again.index(), index, "slots are reused in place");
    assert_ne!(copy_of_handle.index(), index);
    assert_eq!(again.generation(), 1);
    assert!(again.owned_by_current_process());
}

/// A child claims a slot, reserves, and is SIGKILLed: the next writer reclaims its holdings
/// exactly once; the reader never reclaims.
#[test]
fn dead_processes_are_reclaimed_by_writers() {
    if std::env::var_os("REGION_TEST_CHILD_RESERVE").is_some() {
        return child_reserve_and_wait();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(1000, 4)).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dead_processes_are_reclaimed_by_writers",
            "--nocapture",
        ])
        .env("REGION_TEST_CHILD_RESERVE", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The test harness prints its own lines first.
    assert!(
        lines.any(|l| l.unwrap().contains("reserved")),
        "child never reserved"
    );
    assert_eq!(region.reserved(0), 700);
    let reader = RegionReader::open(&path).unwrap();
    let before = reader.snapshot().unwrap();
    assert_eq!(before.slots.len(), 1);
    assert_eq!(before.slots[0].held[0], 700);
    assert_eq!(before.slots[0].alive, Some(true));
    child.kill().unwrap();
    child.wait().unwrap();
    // The reader reports the dead process but does not reclaim it.
    let after = reader.snapshot().unwrap();
    assert_eq!(after.slots[0].alive, Some(false));
    assert_eq!(after.devices[0].reserved, 700);
    // A writer that is denied reclaims the dead slot and retries.
    let slot = region.claim_slot().unwrap();
    region.try_reserve(&slot, 0, 900).unwrap();
    assert_eq!(region.reserved(0), 900);
    assert_eq!(
        region.reclaim_dead_slots().slots_reclaimed,
        0,
        "exactly once"
    );
    let snap = reader.snapshot().unwrap();
    assert_eq!(snap.devices[0].reclaimed_bytes, 700);
    assert_eq!(snap.slots.len(), 1);
}

fn child_reserve_and_wait() {
    let path = std::env::var_os("REGION_TEST_CHILD_RESERVE").unwrap();
    let (region, _) = Region::open_or_create(Path::new(&path), &config(1000, 4)).unwrap();
    let slot = region.claim_slot().unwrap();
    region.try_reserve(&slot, 0, 700).unwrap();
    println!("reserved");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn statistics_round_trip_through_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 2)).unwrap();
    let slot = region.claim_slot().unwrap();
    let alloc = ApiId::from_name("cuMemAlloc_v2").unwrap();
    let writer = region.shard_writer(&slot);
    assert!(writer.is_exclusive());
    writer.record_call_timed(launch(), 3_000, 40, true);
    writer.record_call(launch(), 200_000, false);
    writer.record_alloc(alloc, 1 << 20);
    writer.record_free(alloc, 1 << 19);
    writer.record_denied(alloc, 1 << 30);
    writer.add_hook_ns(alloc, 99);
    writer.add_throttled_ns(launch(), 5_000);
    // Another thread gets its own shard; with all taken, threads share the overflow shard.
    let first_shard = writer.shard_index();
    std::thread::scope(|s| {
        s.spawn(|| {
            let w = region.shard_writer(&slot);
            assert!(w.is_exclusive());
            assert_ne!(w.shard_index(), first_shard);
            w.record_call(launch(), 3_000, true);
        });
    });
    region.set_context_bytes(&slot, 0, 512 << 20);
    // A context charge refused on device 1 (the limit had no room for it) reads as refused,
    // not held.
    region.set_context_refused(&slot, 1, 544 << 20);
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let s = &snap.slots[0];
    assert_eq!(s.pid, std::process::id());
    assert!(!s.name.is_empty());
    assert_eq!(s.context_bytes, [512 << 20, 0]);
    assert_eq!(s.context_refused, [0, 544 << 20]);
    assert_eq!(s.throttled_ns, 5_000);
    assert!(s.shard_problems.is_empty());
    let l = s.apis.iter().find(|a| a.api == launch()).unwrap();
    assert_eq!(
        (l.calls, l.errors, l.latency_ns, l.hook_ns),
        (3, 1, 206_000, 40)
    );
    assert_eq!(l.histogram[bucket_of(3_000)], 2);
    assert_eq!(l.histogram[bucket_of(200_000)], 1);
    let a = s.apis.iter().find(|a| a.api == alloc).unwrap();
    assert_eq!(
        (a.bytes_allocated, a.bytes_freed, a.denied, a.denied_bytes),
        (1 << 20, 1 << 19, 1, 1 << 30)
    );
    assert_eq!(a.hook_ns, 99);
}

#[test]
fn overflow_shard_is_shared_without_interleaving() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 1)).unwrap();
    let slot = region.claim_slot().unwrap();
    let barrier = std::sync::Barrier::new(12);
    std::thread::scope(|s| {
        for _ in 0..12 {
            s.spawn(|| {
                let w = region.shard_writer(&slot);
                barrier.wait();
                for _ in 0..20_000 {
                    w.record_call(launch(), 1_000, true);
                }
                barrier.wait();
            });
        }
    });
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let s = &snap.slots[0];
    let calls = s.apis.iter().find(|a| a.api == launch()).unwrap().calls;
    // Every record either landed or was counted as dropped: none is lost or doubled.
    assert_eq!(calls + s.dropped_records, 12 * 20_000);
}

/// A writer that dies inside a section leaves an odd sequence: readers report the shard with
/// the writer's pid and skip the record instead of spinning; the shard's other records count.
#[test]
fn a_stuck_shard_is_reported_not_spun_on() {
    use region::layout::{API_RECORD_SIZE, HEADER_SIZE, SHARD_SIZE, SlotRecord};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 1)).unwrap();
    let slot = region.claim_slot().unwrap();
    let w = region.shard_writer(&slot);
    w.record_call(launch(), 1_000, true);
    let alloc = ApiId::from_name("cuMemAlloc_v2").unwrap();
    w.record_call(alloc, 2_000, true);
    // Simulate the dead writer by opening a section on the raw file and never closing it.
    let seq_offset = HEADER_SIZE
        + std::mem::offset_of!(SlotRecord, shards)
        + w.shard_index() * SHARD_SIZE
        + usize::from(launch().0) * API_RECORD_SIZE;
    let mut bytes = std::fs::read(&path).unwrap();
    let seq = u64::from_le_bytes(bytes[seq_offset..seq_offset + 8].try_into().unwrap());
    bytes[seq_offset..seq_offset + 8].copy_from_slice(&(seq + 1).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let started = std::time::Instant::now();
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    let problem = snap.slots[0].shard_problems[0];
    assert_eq!(problem.kind, ShardProblemKind::Stuck);
    assert_eq!(problem.pid, std::process::id());
    assert_eq!(snap.counters.shards_skipped, 1);
    let apis: Vec<_> = snap.slots[0]
        .apis
        .iter()
        .map(|a| (a.api, a.calls))
        .collect();
    assert_eq!(
        apis,
        vec![(alloc, 1)],
        "the stuck record's values are left out, not the others"
    );
}

#[test]
fn reader_rejects_what_it_cannot_trust() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    Region::open_or_create(&path, &config(0, 2)).unwrap();
    let good = std::fs::read(&path).unwrap();
    let check = |mutate: &dyn Fn(&mut Vec<u8>), expect: &dyn Fn(&ReadError) -> bool| {
        let mut bytes = good.clone();
        mutate(&mut bytes);
        let p = dir.path().join("bad");
        std::fs::write(&p, &bytes).unwrap();
        let err = RegionReader::open(&p).unwrap_err();
        assert!(expect(&err), "unexpected error {err:?}");
    };
    check(&|b| b.truncate(100), &|e| {
        matches!(e, ReadError::Truncated { .. })
    });
    check(&|b| b.truncate(good.len() - 1), &|e| {
        matches!(e, ReadError::Truncated { .. })
    });
    check(&|b| b[0..8].fill(0), &|e| {
        matches!(e, ReadError::NotReady { .. })
    });
    check(&|b| b[8] ^= 1, &|e| matches!(e, ReadError::BadMagic { .. }));
    check(&|b| b[20] = 4, &|e| {
        matches!(e, ReadError::UnsupportedVersion { major: 4, .. })
    });
    check(
        &|b| b[32..36].copy_from_slice(&5000u32.to_le_bytes()),
        &|e| {
            matches!(
                e,
                ReadError::BadField {
                    field: "slot_count",
                    ..
                }
            )
        },
    );
    check(&|b| b[40] = 7, &|e| {
        matches!(
            e,
            ReadError::BadField {
                field: "api_slots",
                ..
            }
        )
    });
    check(&|b| b[52] = 17, &|e| {
        matches!(
            e,
            ReadError::BadField {
                field: "device_count",
                ..
            }
        )
    });
    // A newer minor version is fine.
    let mut bytes = good.clone();
    bytes[16] = 9;
    std::fs::write(dir.path().join("minor"), &bytes).unwrap();
    assert_eq!(
        RegionReader::open(&dir.path().join("minor"))
            .unwrap()
            .geometry()
            .minor,
        9
    );
}

#[test]
fn a_dead_initialiser_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    // A file whose initialiser (a pid that cannot exist) stalled 5 s ago.
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let mut bytes = vec![0u8; 4096];
    let now_ms = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
    };
    let word = 1u64 << 62 | u64::from(dead_pid) << 40 | (now_ms - 5_000);
    bytes[0..8].copy_from_slice(&word.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let started = std::time::Instant::now();
    let (region, outcome) = Region::open_or_create(&path, &config(0, 2)).unwrap();
    assert_eq!(
        outcome,
        InitOutcome::TookOver {
            stale_pid: dead_pid
        }
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(100));
    assert!(region.claim_slot().is_ok());
    assert_eq!(
        RegionReader::open(&path)
            .unwrap()
            .snapshot()
            .unwrap()
            .init_takeovers,
        1
    );
}

#[test]
fn slots_run_out_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let (region, _) = Region::open_or_create(&dir.path().join("r"), &config(0, 2)).unwrap();
    let _a = region.claim_slot().unwrap();
    let _b = region.claim_slot().unwrap();
    assert!(matches!(
        region.claim_slot(),
        Err(region::RegionError::SlotsFull { slots: 2, .. })
    ));
}

#[test]
fn limits_past_what_a_counter_holds_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = Region::open_or_create(
        &dir.path().join("r"),
        &config(region::MAX_RESERVABLE + 1, 2),
    )
    .unwrap_err();
    assert!(
        matches!(&err, region::RegionError::InvalidConfig { reason } if reason.contains("memory_limit[0]")),
        "{err:?}"
    );
    Region::open_or_create(&dir.path().join("r"), &config(region::MAX_RESERVABLE, 2)).unwrap();
}

/// A writer that died inside its very first section of a record, before storing anything, leaves
/// an odd sequence over zeroes: the reader still reports it (it skips only records that are all
/// zero with an even sequence).
#[test]
fn a_writer_stuck_in_its_first_section_is_reported() {
    use region::layout::{API_RECORD_SIZE, HEADER_SIZE, SHARD_SIZE, SlotRecord};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 1)).unwrap();
    let slot = region.claim_slot().unwrap();
    let w = region.shard_writer(&slot);
    w.record_call(launch(), 1_000, true);
    let seq_offset = HEADER_SIZE
        + std::mem::offset_of!(SlotRecord, shards)
        + w.shard_index() * SHARD_SIZE
        + usize::from(ApiId::from_name("cuMemAlloc_v2").unwrap().0) * API_RECORD_SIZE;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[seq_offset..seq_offset + 8].copy_from_slice(&1u64.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let s = &snap.slots[0];
    assert_eq!(s.shard_problems.len(), 1);
    assert_eq!(s.shard_problems[0].kind, ShardProblemKind::Stuck);
    assert_eq!(s.shard_problems[0].seq, 1);
    assert_eq!(s.apis.len(), 1, "the launch record still counts");
}

/// GPU time (layout 3.3): per device and per kernel name, merged over a process's shards; names
/// past 64 bytes are cut with their whole length kept; kernels past the table's entries are
/// summed in the other entry; a reused slot starts from zero.
#[test]
fn gpu_time_round_trips_through_the_reader() {
    use region::layout::KERNEL_ENTRIES;
    use region::{GpuSample, KernelName, SampleProblem};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 2)).unwrap();
    let slot = region.claim_slot().unwrap();
    let sample = |elapsed_ns, launches| GpuSample {
        elapsed_ns,
        launches,
    };
    let long_name = [b'k'; 100];
    {
        let w = region.shard_writer(&slot);
        w.record_gpu_sample(0, sample(1_000, 10));
        w.record_gpu_sample(1, sample(3_000, 1));
        w.record_gpu_sample(99, sample(3_000, 1));
        w.record_kernel_sample(&KernelName::new(b"gemm"), sample(1_000, 10));
        w.record_kernel_sample(&KernelName::new(&long_name), sample(500, 2));
        w.count_sample_problem(SampleProblem::EventError);
        w.count_sample_problem(SampleProblem::Skipped);
        w.count_sample_problem(SampleProblem::Skipped);
        std::thread::scope(|s| {
            s.spawn(|| {
                let w = region.shard_writer(&slot);
                w.record_gpu_sample(0, sample(2_000, 5));
                w.record_kernel_sample(&KernelName::new(b"gemm"), sample(2_000, 5));
                // More names than entries: the last entry sums the rest.
                for i in 0..KERNEL_ENTRIES + 3 {
                    w.record_kernel_sample(
                        &KernelName::new(format!("k{i}").as_bytes()),
                        sample(1, 1),
                    );
                }
            });
        });
    }
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let s = &snap.slots[0];
    assert!(s.shard_problems.is_empty());
    assert_eq!(
        s.throttled_ns, 0,
        "the GPU records add nothing to throttled time"
    );
    assert_eq!(s.gpu_time.len(), 2);
    let d0 = s.gpu_time[0];
    assert_eq!(
        (d0.estimated_ns, d0.sampled_ns, d0.samples, d0.launches),
        (20_000, 3_000, 2, 15)
    );
    assert_eq!(s.gpu_time[1].estimated_ns, 3_000);
    assert_eq!((s.sample_errors, s.samples_skipped), (1, 2));
    let gemm = &s.kernels[0];
    assert_eq!(gemm.name, b"gemm");
    assert_eq!(gemm.name_hash, region::kernel_name_hash(b"gemm"));
    assert_eq!(
        (
            gemm.time.estimated_ns,
            gemm.time.samples,
            gemm.time.launches
        ),
        (20_000, 2, 15),
        "merged over both shards"
    );
    let long = s.kernels.iter().find(|k| k.name_len == 100).unwrap();
    assert_eq!(long.name, &long_name[..64]);
    assert_eq!(long.time.estimated_ns, 1_000);
    // The second thread's shard: gemm and 14 names of their own, then the other entry.
    let other = s.kernels.iter().find(|k| k.other).unwrap();
    assert!(other.name.is_empty());
    assert_eq!(other.time.samples, (KERNEL_ENTRIES + 3 - 14) as u64);
    let named = s
        .kernels
        .iter()
        .filter(|k| k.name.starts_with(b"k") && k.name_len < 10);
    assert_eq!(named.count(), 14);
    // A reused slot starts from zero.
    let index = slot.index();
    region.retire_slot(slot);
    let again = region.claim_slot().unwrap();
    assert_eq!(again.index(), index, "the slot is reused");
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    for s in &snap.slots {
        assert!(s.kernels.is_empty(), "{:?}", s.kernels);
        assert!(s.gpu_time.iter().all(|t| t.samples == 0));
    }
}

/// Threads sharing the overflow shard take kernel entries and add samples without losing or
/// doubling any: each lands or is counted as dropped, and no entry holds two names.
#[test]
fn overflow_writers_share_kernel_entries_without_mixing_names() {
    use region::{GpuSample, KernelName};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, _) = Region::open_or_create(&path, &config(0, 1)).unwrap();
    let slot = region.claim_slot().unwrap();
    let threads = 12;
    let per_thread = 5_000u64;
    let barrier = std::sync::Barrier::new(threads);
    let reading = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, region, slot) = (&barrier, &region, &slot);
            s.spawn(move || {
                let w = region.shard_writer(slot);
                barrier.wait();
                for i in 0..per_thread {
                    let name = format!("kernel{}", (i + t as u64) % 6);
                    let one = GpuSample {
                        elapsed_ns: 10,
                        launches: 1,
                    };
                    w.record_kernel_sample(&KernelName::new(name.as_bytes()), one);
                    w.record_gpu_sample(0, one);
                }
            });
        }
        // A concurrent reader never sees a torn entry: every name it shows has its hash.
        s.spawn(|| {
            let reader = RegionReader::open(&path).unwrap();
            for _ in 0..50 {
                if let Ok(snap) = reader.snapshot() {
                    for k in snap.slots.iter().flat_map(|s| &s.kernels) {
                        assert_eq!(k.name_hash, region::kernel_name_hash(&k.name));
                    }
                }
            }
            reading.store(false, std::sync::atomic::Ordering::Relaxed);
        });
    });
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let s = &snap.slots[0];
    let samples: u64 = s.kernels.iter().map(|k| k.time.samples).sum();
    let device = s.gpu_time[0].samples;
    let total = threads as u64 * per_thread;
    assert_eq!(samples + device + s.dropped_records, 2 * total);
    for k in &s.kernels {
        assert!(!k.other, "six names fit");
        assert_eq!(k.name_hash, region::kernel_name_hash(&k.name));
        assert_eq!(k.time.estimated_ns, 10 * k.time.samples);
    }
    assert!(!reading.load(std::sync::atomic::Ordering::Relaxed));
}

/// An allocation's wait for device memory, as the reader shows it: published while it lasts,
/// a later wait of another thread replaces it (the earlier one's end leaves it alone), cleared
/// when the last ends, and gone with the slot's owner.
#[test]
fn a_wait_for_memory_is_published_while_it_lasts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let (region, _) = Region::open_or_create(&path, &config(0, 4)).unwrap();
    let slot = region.claim_slot().unwrap();
    let wait = || {
        let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
        snap.slots[0].oom_wait.map(|w| (w.device, w.bytes, w.seq))
    };
    assert_eq!(wait(), None);
    let first = region.begin_oom_wait(&slot, 1, 3 << 30);
    assert_eq!(wait(), Some((1, 3 << 30, first)));
    let second = region.begin_oom_wait(&slot, 0, 1 << 20);
    assert_ne!(first, second);
    assert_eq!(wait(), Some((0, 1 << 20, second)));
    region.end_oom_wait(&slot, first);
    assert_eq!(
        wait(),
        Some((0, 1 << 20, second)),
        "not the first's to clear"
    );
    region.end_oom_wait(&slot, second);
    assert_eq!(wait(), None);
    // A wait its owner never ended (killed) is not the next owner's.
    region.begin_oom_wait(&slot, 0, 1 << 20);
    let index = slot.index();
    region.retire_slot(slot);
    let slot = region.claim_slot().unwrap();
    assert_eq!(slot.index(), index, "the same slot, another owner");
    assert_eq!(wait(), None);
    region.retire_slot(slot);
}
