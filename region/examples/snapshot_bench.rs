//! Snapshot cost: how long `RegionReader::snapshot` and `HamiReader::snapshot` take on a region
//! with 8 live processes (the agent reads every region once a second). Prints one JSON object
//! per case with the mean, p50 and p99 in microseconds.
//!
//! `cargo run -p region --release --example snapshot_bench [-- --iterations N --dir D]`
//! (default directory `/dev/shm`).
//!
//! Cases: `vgpu_8_slots_2_shards` (128-slot region, 8 live slots, 2 used shards each: a typical
//! process with a main and one worker thread), `vgpu_8_slots_9_shards` (every shard of the 8
//! slots used: the worst case for 8 processes) and `hami_8_procs` (a HAMi-core v1 file with 8
//! occupied process slots).

use std::time::Instant;

use agent_common::api::ApiId;
use region::hami::{HAMI_MAGIC, HAMI_V1_SIZE, HamiReader};
use region::reader::RegionReader;
use region::{Region, RegionConfig};

fn report(case: &str, mut samples_us: Vec<f64>) {
    samples_us.sort_by(f64::total_cmp);
    let n = samples_us.len();
    let q = |p: f64| samples_us[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let mean = samples_us.iter().sum::<f64>() / n as f64;
    println!(
        "{{\"bench\":\"region_snapshot\",\"case\":{case:?},\"iterations\":{n},\
         \"mean_us\":{mean:.1},\"p50_us\":{:.1},\"p99_us\":{:.1}}}",
        q(0.50),
        q(0.99)
    );
}

fn time(iterations: usize, mut f: impl FnMut()) -> Vec<f64> {
    // Warm up (page cache, allocator).
    for _ in 0..iterations / 10 + 1 {
        f();
    }
    (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect()
}

fn vgpu_case(dir: &std::path::Path, iterations: usize, shards: usize) {
    let path = dir.join(format!("region-{shards}"));
    let mut config = RegionConfig::unlimited(8);
    config.memory_limit[0] = 1 << 40;
    let (region, _) = Region::open_or_create(&path, &config).expect("open_or_create");
    let apis: Vec<ApiId> = [
        "cuLaunchKernel",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuCtxSynchronize",
    ]
    .iter()
    .map(|n| ApiId::from_name(n).expect("known API"))
    .collect();
    let slots: Vec<_> = (0..8).map(|_| region.claim_slot().expect("slot")).collect();
    for slot in &slots {
        region.try_reserve(slot, 0, 1 << 30).expect("reserve");
        // One thread takes one shard per `shard_writer` call while it holds the earlier ones.
        let writers: Vec<_> = (0..shards).map(|_| region.shard_writer(slot)).collect();
        for (i, w) in writers.iter().enumerate() {
            for (k, &api) in apis.iter().enumerate() {
                for call in 0..100u64 {
                    w.record_call(api, 1_000 + call * 37 + (i * k) as u64, true);
                }
            }
        }
    }
    let reader = RegionReader::open(&path).expect("open");
    let snap = reader.snapshot().expect("snapshot");
    assert_eq!(snap.slots.len(), 8);
    assert!(snap.slots.iter().all(|s| s.apis.len() == apis.len()));
    let samples = time(iterations, || {
        std::hint::black_box(reader.snapshot().expect("snapshot"));
    });
    report(&format!("vgpu_8_slots_{shards}_shards"), samples);
}

fn hami_case(dir: &std::path::Path, iterations: usize) {
    let mut b = vec![0u8; HAMI_V1_SIZE as usize];
    b[0..4].copy_from_slice(&HAMI_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&1i32.to_le_bytes());
    b[56..64].copy_from_slice(&8u64.to_le_bytes());
    for p in 0..8usize {
        let slot = 1856 + p * 97 * 1960;
        b[slot..slot + 4].copy_from_slice(&(100 + p as i32).to_le_bytes());
        b[slot + 8 + 32..slot + 8 + 40].copy_from_slice(&(1u64 << 30).to_le_bytes());
        b[slot + 1928..slot + 1932].copy_from_slice(&1i32.to_le_bytes());
    }
    let path = dir.join("cudevshr.cache");
    std::fs::write(&path, &b).expect("write");
    let reader = HamiReader::open(&path).expect("open");
    assert_eq!(reader.snapshot().expect("snapshot").processes.len(), 8);
    let samples = time(iterations, || {
        std::hint::black_box(reader.snapshot().expect("snapshot"));
    });
    report("hami_8_procs", samples);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let iterations = arg("--iterations").map_or(2000, |v| v.parse().expect("a number"));
    let base = arg("--dir").map_or_else(
        || std::path::PathBuf::from("/dev/shm"),
        std::path::PathBuf::from,
    );
    let dir = tempfile::Builder::new()
        .tempdir_in(&base)
        .expect("temp dir");
    vgpu_case(dir.path(), iterations, 2);
    vgpu_case(dir.path(), iterations, 9);
    hami_case(dir.path(), iterations);
}
