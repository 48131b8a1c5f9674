//! The reader's budget: a region whose records stay odd (a stuck writer in every record, or a
//! tenant that writes odd sequences on purpose) is read until its budget runs out, and what was
//! not read is named, never waited for. Budgets here are in retries (deterministic); the wall
//! time bound is the same check with a clock (`hostile_snapshot_bench` measures it).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use agent_common::api::{API_SLOTS, ApiId};
use region::layout::{
    API_RECORD_SIZE, HEADER_SIZE, SHARD_SIZE, SHARDS_PER_SLOT, SLOT_SIZE, SlotHeader, SlotRecord,
};
use region::reader::{BudgetLimit, ReadBudget, RegionReader, ShardProblemKind};
use region::{Region, RegionConfig, Slot};

/// A region of `slots` slots, all claimed by this process; in the first `stuck` of them every
/// shard is marked used and the sequence of its first `records` records is odd.
fn region_with_stuck_slots(
    path: &Path,
    slots: u32,
    stuck: u32,
    records: usize,
) -> (Region, Vec<Slot>) {
    let mut config = RegionConfig::unlimited(1);
    config.slots = slots;
    let (region, _) = Region::open_or_create(path, &config).unwrap();
    let claimed: Vec<Slot> = (0..slots).map(|_| region.claim_slot().unwrap()).collect();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut indices: Vec<u32> = claimed.iter().map(|s| s.index()).collect();
    indices.sort_unstable();
    for &index in indices.iter().take(stuck as usize) {
        let slot_at = HEADER_SIZE + index as usize * SLOT_SIZE;
        let used = slot_at + std::mem::offset_of!(SlotHeader, used_shards);
        file.write_all_at(&((1u64 << SHARDS_PER_SLOT) - 1).to_le_bytes(), used as u64)
            .unwrap();
        for shard in 0..SHARDS_PER_SLOT {
            let shard_at = slot_at + std::mem::offset_of!(SlotRecord, shards) + shard * SHARD_SIZE;
            for record in 0..records {
                let at = shard_at + record * API_RECORD_SIZE;
                file.write_all_at(&1u64.to_le_bytes(), at as u64).unwrap();
            }
        }
    }
    (region, claimed)
}

const NO_TIME_LIMIT: Duration = Duration::from_secs(3600);

#[test]
fn a_region_of_stuck_records_is_read_until_its_retries_run_out_and_the_rest_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (_region, _slots) = region_with_stuck_slots(&path, 16, 16, 2);
    let reader = RegionReader::open(&path).unwrap();
    // A slot of 9 shards with 2 stuck records each costs 9 x 2 x 62 = 1,116 retries: 2,000
    // read the first slot whole and run out in the second.
    let budget = ReadBudget {
        time: NO_TIME_LIMIT,
        retries: 2_000,
    };
    let snap = reader.snapshot_within(&budget).unwrap();
    let unread = snap.unread.expect("the budget ran out");
    assert_eq!(unread.limit, BudgetLimit::Retries);
    assert_eq!(snap.slots.len(), 1, "{:?}", snap.slots);
    // The slot the budget ran out in is left out (its figures would be short), not shown
    // part-read.
    assert_eq!(
        unread.first_slot as usize,
        snap.slots.last().map_or(0, |s| s.index as usize + 1)
    );
    assert_eq!(
        snap.slots.len() + unread.slots as usize,
        16,
        "every claimed slot is either read or counted unread"
    );
    // The slots read are whole: each of their stuck records was given every retry.
    for slot in &snap.slots {
        assert_eq!(slot.shard_problems.len(), SHARDS_PER_SLOT);
    }
    assert!(snap.counters.seqlock_retries <= budget.retries);
}

#[test]
fn a_spent_time_budget_reads_nothing_and_counts_every_claimed_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (_region, _slots) = region_with_stuck_slots(&path, 8, 0, 0);
    let reader = RegionReader::open(&path).unwrap();
    let snap = reader
        .snapshot_within(&ReadBudget {
            time: Duration::ZERO,
            retries: u64::MAX,
        })
        .unwrap();
    assert!(snap.slots.is_empty());
    let unread = snap.unread.unwrap();
    assert_eq!(
        (unread.limit, unread.first_slot, unread.slots),
        (BudgetLimit::Time, 0, 8)
    );
}

#[test]
fn healthy_slots_beside_a_stuck_one_are_read_whole_within_the_default_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (region, slots) = region_with_stuck_slots(&path, 8, 1, 1);
    let launch = ApiId::from_name("cuLaunchKernel").unwrap();
    let stuck_index = slots.iter().map(|s| s.index()).min().unwrap();
    for slot in slots.iter().filter(|s| s.index() != stuck_index) {
        region.shard_writer(slot).record_call(launch, 1_000, true);
    }
    // The default's retries; its 100 ms are the wall time of a loaded CI host, not of the reader.
    let budget = ReadBudget {
        time: Duration::from_secs(30),
        ..ReadBudget::DEFAULT
    };
    let snap = RegionReader::open(&path)
        .unwrap()
        .snapshot_within(&budget)
        .unwrap();
    assert_eq!(
        snap.unread, None,
        "a dead writer's stuck record in each shard fits the default budget"
    );
    assert_eq!(snap.slots.len(), 8);
    for s in &snap.slots {
        if s.index == stuck_index {
            assert_eq!(s.shard_problems.len(), SHARDS_PER_SLOT);
            assert!(s.apis.is_empty());
            assert!(
                s.shard_problems
                    .iter()
                    .all(|p| p.kind == ShardProblemKind::Stuck)
            );
        } else {
            assert!(s.shard_problems.is_empty());
            assert_eq!(s.apis.len(), 1);
            assert_eq!(s.apis[0].calls, 1);
        }
    }
}

#[test]
fn the_default_budget_ends_a_1024_slot_region_of_stuck_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    // Stuck records in the first 64 slots already outlast the budget; the rest are claimed.
    let (_region, _slots) = region_with_stuck_slots(&path, 1024, 64, API_SLOTS);
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    let unread = snap.unread.expect("the budget ran out");
    assert_eq!(snap.slots.len() + unread.slots as usize, 1024);
    assert!(snap.counters.seqlock_retries <= ReadBudget::DEFAULT.retries);
}
