use std::time::Instant;

use super::*;

fn charge(device: usize, bytes: u64) -> Charge {
    Charge {
        device,
        bytes,
        pool: 0,
    }
}

type Addresses = AllocTable<ADDRESS_BUCKETS>;

/// `n` distinct addresses whose home bucket in a table of `B` buckets is the same.
fn colliding<const B: usize>(_: &AllocTable<B>, n: usize) -> Vec<u64> {
    let home = AllocTable::<B>::home(0x7f00_0000_0000);
    (0..)
        .map(|i| 0x7f00_0000_0000 + i * 512)
        .filter(|&k| AllocTable::<B>::home(k) == home)
        .take(n)
        .collect()
}

#[test]
fn tracks_charges() {
    let t = Addresses::new();
    let c = charge(1, 4096);
    assert_eq!(t.insert(0x7f00_0000_0000, c), None);
    assert_eq!(t.insert(0x7f00_0000_0200, charge(0, 1)), None);
    assert_eq!(t.len(), 2);
    assert_eq!(t.remove(0x7f00_0000_0000), Some(c));
    assert_eq!(t.remove(0x7f00_0000_0000), None);
    assert_eq!(t.len(), 1);
    assert_eq!(t.remove(0x7f00_0000_0200), Some(charge(0, 1)));
    assert!(t.is_empty());
}

#[test]
fn a_key_inserted_again_returns_the_stale_charge() {
    let t = Addresses::new();
    assert_eq!(t.insert(0x1000, charge(0, 10)), None);
    assert_eq!(t.insert(0x1000, charge(0, 20)), Some(charge(0, 10)));
    assert_eq!(t.remove(0x1000), Some(charge(0, 20)));
    assert!(t.is_empty());
}

#[test]
fn what_does_not_pack_goes_to_the_fallback() {
    let t = Addresses::new();
    let pooled = Charge {
        device: 0,
        bytes: 1 << 20,
        pool: 0xdead,
    };
    let odd = [
        (0, charge(0, 5)),
        (RESERVED, charge(0, 6)),
        (0x2000, pooled),
        (0x3000, charge(1 << 16, 7)),
        (0x4000, charge(2, 1 << 48)),
    ];
    for (k, c) in odd {
        assert_eq!(t.insert(k, c), None);
    }
    assert_eq!(t.in_fallback.load(Ordering::Relaxed), odd.len());
    assert_eq!(t.len(), odd.len());
    // A key that moves from the fallback to the fast table on a repeated insert.
    assert_eq!(t.insert(0x2000, charge(0, 8)), Some(pooled));
    for (k, c) in odd.into_iter().filter(|(k, _)| *k != 0x2000) {
        assert_eq!(t.remove(k), Some(c), "{k:#x}");
    }
    assert_eq!(t.remove(0x2000), Some(charge(0, 8)));
    assert!(t.is_empty());
    assert_eq!(t.in_fallback.load(Ordering::Relaxed), 0);
}

#[test]
fn a_full_bucket_overflows_into_the_next_ones_then_the_fallback() {
    let t = AllocTable::<64>::new();
    // Three entries per bucket, PROBE buckets: the rest of the keys go to the fallback.
    let keys = colliding(&t, 3 * PROBE + 5);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(t.insert(k, charge(0, i as u64 + 1)), None);
    }
    assert_eq!(t.in_fallback.load(Ordering::Relaxed), 5);
    assert_eq!(t.len(), keys.len());
    // Stale inserts are found wherever the key lives.
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(
            t.insert(k, charge(0, 100 + i as u64)),
            Some(charge(0, i as u64 + 1))
        );
    }
    for (i, &k) in keys.iter().enumerate().rev() {
        assert_eq!(t.remove(k), Some(charge(0, 100 + i as u64)), "{i}");
    }
    assert!(t.is_empty());
}

#[test]
fn concurrent_threads_keep_every_charge() {
    const THREADS: u64 = 4;
    // Miri interprets every access: fewer keys there, still crossing buckets and threads.
    const KEYS: u64 = if cfg!(miri) { 60 } else { 2_000 };
    let t = AllocTable::<64>::new();
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let t = &t;
            s.spawn(move || {
                for round in 0..3 {
                    for i in 0..KEYS {
                        let key = 0x7f00_0000_0000 + (th << 32) + i * 512;
                        assert_eq!(t.insert(key, charge(th as usize, i + round)), None);
                    }
                    for i in 0..KEYS {
                        let key = 0x7f00_0000_0000 + (th << 32) + i * 512;
                        assert_eq!(t.remove(key), Some(charge(th as usize, i + round)));
                    }
                }
            });
        }
    });
    assert!(t.is_empty());
    assert_eq!(t.in_fallback.load(Ordering::Relaxed), 0);
}

proptest::proptest! {
    // Under miri, a few cases and no regression file (miri isolates the file system).
    #![proptest_config(if cfg!(miri) {
        proptest::test_runner::Config { cases: 2, failure_persistence: None, ..Default::default() }
    } else {
        proptest::test_runner::Config::default()
    })]
    /// Any sequence of inserts and removes on a small table (keys that collide, so buckets
    /// overflow; charges that do not pack, so the fallback fills and empties) gives what a map
    /// gives: the one-bucket fast paths of `insert` and `remove` and their slow paths agree.
    #[test]
    fn the_table_behaves_as_a_map(ops in proptest::collection::vec((0u8..3, 0usize..20, 1u64..1000), 1..300)) {
        let t = AllocTable::<4>::new();
        let keys: Vec<u64> = (0..20u64).map(|i| 0x7f00_0000_0000 + i * 0x20_0000).collect();
        let mut model = std::collections::HashMap::new();
        for (op, k, bytes) in ops {
            let key = keys[k];
            match op {
                0 | 1 => {
                    // One insert in eight does not pack (a pool allocation): it goes to the fallback.
                    let c = Charge { device: 0, bytes, pool: u64::from(bytes % 8 == 0) };
                    proptest::prop_assert_eq!(t.insert(key, c), model.insert(key, c), "insert {:#x}", key);
                }
                _ => proptest::prop_assert_eq!(t.remove(key), model.remove(&key), "remove {:#x}", key),
            }
            proptest::prop_assert_eq!(t.len(), model.len());
        }
    }
}

/// The allocation table sits on the cudaMalloc/cudaFree path (budget +0.5 us per pair): measure
/// an insert+remove pair with 4 threads contending, and fail far above the budget.
#[test]
#[cfg_attr(miri, ignore = "timed")]
fn alloc_table_pair_is_cheap() {
    const PAIRS: u64 = 200_000;
    let t = Addresses::new();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                for i in 0..PAIRS {
                    let key = 0x7f00_0000_0000 + (th << 32) + i * 512;
                    t.insert(key, charge(0, 512));
                    t.remove(key);
                }
            });
        }
    });
    let per_pair = t0.elapsed().as_nanos() as u64 / PAIRS;
    eprintln!(
        "alloc table: {per_pair} ns per insert+remove pair per thread (4 threads, debug={})",
        cfg!(debug_assertions)
    );
    // Unoptimised builds on 2 shared cores: a generous ceiling that still catches a pathology.
    assert!(per_pair < 20_000, "{per_pair} ns");
    assert_eq!(t.len(), 0);
}
