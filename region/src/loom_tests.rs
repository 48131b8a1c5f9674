//! Loom models of the seqlock, the reservation counter and exactly-once reclaim.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p region --release --lib loom`.

use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;
use loom::thread;
use std::sync::atomic::Ordering;

use crate::reserve;
use crate::seqlock::{self, SeqRead};

/// A writer runs two sections writing the same value into two fields; a concurrent reader must
/// never accept a copy where the fields differ.
#[test]
fn loom_seqlock_reader_never_sees_a_torn_copy() {
    loom::model(|| {
        let shard = Arc::new((AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)));
        let writer = {
            let shard = shard.clone();
            thread::spawn(move || {
                for value in 1..=2 {
                    let odd = seqlock::begin_exclusive(&shard.0);
                    shard.1.store(value, Ordering::Relaxed);
                    shard.2.store(value, Ordering::Relaxed);
                    seqlock::end(&shard.0, odd);
                }
            })
        };
        let (mut a, mut b) = (0, 0);
        if let SeqRead::Consistent { .. } = seqlock::read(&shard.0, || {
            a = shard.1.load(Ordering::Relaxed);
            b = shard.2.load(Ordering::Relaxed);
        }) {
            assert_eq!(a, b, "torn read accepted");
        }
        writer.join().unwrap();
    });
}

/// Two threads share the overflow shard with try-only entry: their increments are never lost
/// (a writer that did not enter counts a drop instead).
#[test]
fn loom_overflow_writers_never_interleave() {
    loom::model(|| {
        let shard = Arc::new((AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let shard = shard.clone();
                thread::spawn(move || match seqlock::try_begin_shared(&shard.0) {
                    Some(odd) => {
                        let v = shard.1.load(Ordering::Relaxed);
                        shard.1.store(v + 1, Ordering::Relaxed);
                        seqlock::end(&shard.0, odd);
                    }
                    None => {
                        shard.2.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let recorded = shard.1.load(Ordering::Relaxed);
        let dropped = shard.2.load(Ordering::Relaxed);
        assert_eq!(recorded + dropped, 2, "an increment was lost");
        assert_eq!(shard.0.load(Ordering::Relaxed) % 2, 0);
    });
}

/// Two processes reserve (one also releases) against one limit while the main thread reserves
/// too; the counter never passes the limit and ends equal to what the slots hold.
#[test]
fn loom_reserve_never_exceeds_limit() {
    const LIMIT: u64 = 100;
    loom::model(|| {
        let reserved = Arc::new(AtomicU64::new(0));
        let held: Arc<[AtomicU64; 3]> =
            Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        let process = |i: usize, reserved: &AtomicU64, held: &[AtomicU64; 3]| {
            let bytes = 40 + i as u64 * 10;
            if reserve::reserve(reserved, LIMIT, bytes).is_ok() {
                reserve::add_held(&held[i], bytes);
                assert!(reserved.load(Ordering::Relaxed) <= LIMIT);
                if i == 0 {
                    let taken = reserve::release_saturating(&held[i], bytes);
                    reserve::release_saturating(reserved, taken);
                }
            }
        };
        let handle = {
            let (reserved, held) = (reserved.clone(), held.clone());
            thread::spawn(move || process(0, &reserved, &held))
        };
        process(1, &reserved, &held);
        process(2, &reserved, &held);
        handle.join().unwrap();
        let total: u64 = held.iter().map(|h| h.load(Ordering::Relaxed)).sum();
        assert_eq!(reserved.load(Ordering::Relaxed), total);
        assert!(total <= LIMIT);
    });
}

/// A dead process's holdings are returned exactly once even when two reclaimers overlap (the
/// takeover case: both run `return_holdings` on the same slot).
#[test]
fn loom_reclaim_returns_holdings_exactly_once() {
    loom::model(|| {
        let reserved = Arc::new(AtomicU64::new(0));
        let held = Arc::new(AtomicU64::new(0));
        reserve::reserve(&*reserved, 0, 64).unwrap();
        reserve::add_held(&*held, 64);
        // Another live process holds 16 more.
        reserve::reserve(&*reserved, 0, 16).unwrap();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (reserved, held) = (reserved.clone(), held.clone());
                thread::spawn(move || reserve::return_holdings(&*held, &*reserved))
            })
            .collect();
        let returned: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(returned, 64);
        assert_eq!(reserved.load(Ordering::Relaxed), 16);
    });
}
