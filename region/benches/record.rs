//! Cost of the hot-path writer operations: recording one call (one seqlock write section) and a
//! try_reserve + release pair. Run: `cargo bench -p region --bench record`.

use std::hint::black_box;

use agent_common::api::ApiId;
use criterion::{Criterion, criterion_group, criterion_main};
use region::{Region, RegionConfig};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RegionConfig::unlimited(1);
    config.memory_limit[0] = 1 << 40;
    config.slots = 4;
    let (region, _) = Region::open_or_create(&dir.path().join("region"), &config).unwrap();
    let slot = region.claim_slot().unwrap();
    let writer = region.shard_writer(&slot);
    let launch = ApiId::from_name("cuLaunchKernel").unwrap();
    let mut latency = 1_000u64;
    c.bench_function("record_call (thread shard)", |b| {
        b.iter(|| {
            latency = latency.wrapping_mul(6364136223846793005).wrapping_add(1) >> 44;
            writer.record_call_timed(black_box(launch), black_box(latency), black_box(25), true);
        })
    });
    // The overflow shard: the same section entered with a CAS on the sequence.
    let _taken: Vec<_> = (0..7).map(|_| region.shard_writer(&slot)).collect();
    let overflow = region.shard_writer(&slot);
    assert!(!overflow.is_exclusive());
    c.bench_function("record_call (overflow shard)", |b| {
        b.iter(|| overflow.record_call(black_box(launch), black_box(3_000), true))
    });
    c.bench_function("try_reserve + release", |b| {
        b.iter(|| {
            region.try_reserve(&slot, 0, black_box(4096)).unwrap();
            region.release(&slot, 0, black_box(4096));
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
