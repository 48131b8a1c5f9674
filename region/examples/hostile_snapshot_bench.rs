//! What a hostile region costs one snapshot: a valid-layout region of 1,024 live slots whose
//! every statistics record stays odd (a writer stuck inside every section, or a tenant that
//! wrote odd sequences on purpose), every shard marked used. Prints one JSON object per run with
//! the wall time of `RegionReader::snapshot_within` under the default read budget, and what the
//! budget left unread.
//!
//! `cargo run -p region --release --example hostile_snapshot_bench [-- --dir D --runs N --slots S
//! --records R --budget-ms T]` (default directory `/dev/shm`; R odd records per shard, default
//! all 96: the region then takes S x 433 KiB there, 453 MB for 1,024 slots; T the read budget's
//! time, default `ReadBudget::DEFAULT`'s 100 ms; the daemon gives a region 250 ms at its default
//! 1 s interval).

use std::os::unix::fs::FileExt;
use std::time::Instant;

use agent_common::api::API_SLOTS;
use region::layout::{
    API_RECORD_SIZE, HEADER_SIZE, SHARD_SIZE, SHARDS_PER_SLOT, SLOT_SIZE, SlotHeader, SlotRecord,
};
use region::reader::{ReadBudget, RegionReader};
use region::{Region, RegionConfig};

/// Creates the hostile region at `path` with `slots` slots, all claimed by this process, the
/// first `records` records of every shard odd.
fn hostile_region(path: &std::path::Path, slots: u32, records: usize) {
    let mut config = RegionConfig::unlimited(1);
    config.slots = slots;
    let (region, _) = Region::open_or_create(path, &config).expect("open_or_create");
    let claimed: Vec<_> = (0..slots)
        .map(|_| region.claim_slot().expect("slot"))
        .collect();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for writing");
    let odd = 1u64.to_le_bytes();
    for index in 0..slots as usize {
        let slot_at = HEADER_SIZE + index * SLOT_SIZE;
        let used = slot_at + std::mem::offset_of!(SlotHeader, used_shards);
        file.write_all_at(&((1u64 << SHARDS_PER_SLOT) - 1).to_le_bytes(), used as u64)
            .expect("pwrite");
        for shard in 0..SHARDS_PER_SLOT {
            let shard_at = slot_at + std::mem::offset_of!(SlotRecord, shards) + shard * SHARD_SIZE;
            for record in 0..records {
                let at = shard_at + record * API_RECORD_SIZE;
                file.write_all_at(&odd, at as u64).expect("pwrite");
            }
        }
    }
    // The slots stay claimed (this process is their live owner) until the file is removed.
    std::mem::forget(claimed);
    std::mem::forget(region);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let runs: usize = arg("--runs").map_or(3, |v| v.parse().expect("a number"));
    let slots: u32 = arg("--slots").map_or(1024, |v| v.parse().expect("a number"));
    let records: usize = arg("--records").map_or(API_SLOTS, |v| v.parse().expect("a number"));
    let base = arg("--dir").map_or_else(
        || std::path::PathBuf::from("/dev/shm"),
        std::path::PathBuf::from,
    );
    let dir = tempfile::Builder::new()
        .tempdir_in(&base)
        .expect("temp dir");
    let path = dir.path().join("hostile");
    hostile_region(&path, slots, records.min(API_SLOTS));
    let reader = RegionReader::open(&path).expect("open");
    let mut budget = ReadBudget::default();
    if let Some(ms) = arg("--budget-ms") {
        budget.time = std::time::Duration::from_millis(ms.parse().expect("a number"));
    }
    for _ in 0..runs {
        let started = Instant::now();
        let snap = reader.snapshot_within(&budget).expect("snapshot");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let unread = snap.unread.map_or(0, |u| u.slots);
        println!(
            "{{\"bench\":\"hostile_region_snapshot\",\"slots\":{slots},\"odd_records_per_shard\":{records},\"ms\":{ms:.1},\
             \"slots_read\":{},\"slots_unread\":{unread},\"budget_ms\":{},\"budget_retries\":{}}}",
            snap.slots.len(),
            budget.time.as_millis(),
            budget.retries
        );
    }
}
