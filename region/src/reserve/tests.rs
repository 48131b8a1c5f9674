//! Unit and property tests of the reservation protocol (sequential; the concurrent cases are the
//! loom models in `loom_tests.rs` and the multi-process stress test).

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;

use super::model::Model;
use super::*;
use crate::region::{Region, RegionConfig};
use crate::slots::{PHASE_LIVE, slot_generation, slot_word};

fn model(slots: u32, devices: u32) -> Model<AtomicU64> {
    Model::new(slots, devices, || AtomicU64::new(0), |round| round < 4)
}

#[test]
fn words_round_trip() {
    assert_eq!(
        [1, 2, 3, 128, 129, 1024].map(slot_bits),
        [0, 1, 2, 7, 8, 10]
    );
    let it = Intent {
        state: STATE_PENDING,
        kind: Kind::ReturnAll as u64,
        device: 15,
        ticket: TAG_MASK,
        seq: SEQ_MASK,
    };
    assert_eq!(Intent::decode(it.encode()), it);
    assert_eq!(Intent::decode(Intent::done(it.encode())).seq, SEQ_MASK);
    assert_eq!(
        Intent::decode(0).state,
        STATE_DONE,
        "a zeroed slot has no intent"
    );
    // At 1024 slots a container tag has 10 slot bits and 5 ticket bits (the top bit is APPLIED).
    let w = pack(MAX_RESERVABLE, last_tag(1023, 31, 10));
    assert_eq!(word_bytes(w), MAX_RESERVABLE);
    assert_eq!(container_tag(w), CONTAINER_TAG_MASK);
    assert_eq!(w & APPLIED, 0, "a commit is not applied yet");
    assert_eq!(container_tag(w | APPLIED), container_tag(w));
    assert_eq!(word_bytes(w | APPLIED), MAX_RESERVABLE);
    assert_eq!(
        last_tag(1023, 32, 10),
        last_tag(1023, 0, 10),
        "tickets wrap"
    );
}

#[test]
fn the_limit_is_exact_and_releases_clamp() {
    let m = model(2, 1);
    assert_eq!(m.op(0, Kind::Reserve, 60, 100, Stop::Never), Ok(60));
    assert_eq!(m.op(1, Kind::Reserve, 40, 100, Stop::Never), Ok(40));
    assert_eq!(
        m.op(0, Kind::Reserve, 1, 100, Stop::Never),
        Err(OpError::Denied(Denied {
            limit: 100,
            reserved: 100,
            requested: 1
        }))
    );
    assert_eq!(
        m.op(1, Kind::Release, 1000, 0, Stop::Never),
        Ok(40),
        "clamped"
    );
    assert_eq!(m.op(1, Kind::Release, 5, 0, Stop::Never), Ok(0));
    assert_eq!((m.reserved(0), m.sum_held(0)), (60, 60));
    // Unlimited still stops at what a word holds.
    assert_eq!(
        m.op(1, Kind::Reserve, MAX_RESERVABLE - 60, 0, Stop::Never),
        Ok(MAX_RESERVABLE - 60)
    );
    assert!(matches!(
        m.op(0, Kind::Reserve, 1, 0, Stop::Never),
        Err(OpError::Denied(_))
    ));
}

#[test]
fn tickets_wrap_without_losing_exactness() {
    let m = model(1, 1);
    for i in 0..70_000u64 {
        m.op(0, Kind::Reserve, 1 + i % 7, 0, Stop::Never).unwrap();
        if i % 2 == 1 {
            m.op(0, Kind::Release, 3, 0, Stop::Never).unwrap();
        }
    }
    assert_eq!(m.reserved(0), m.sum_held(0));
}

/// Killed after its commit: a reclaim applies the operation when the container word still names
/// it, and finds it applied when another process's commit helped it first.
#[test]
fn a_commit_without_its_apply_is_applied_once() {
    for helped in [false, true] {
        let m = model(2, 1);
        m.op(0, Kind::Reserve, 10, 100, Stop::Never).unwrap();
        assert_eq!(
            m.op(0, Kind::Reserve, 20, 100, Stop::AfterCommit),
            Err(OpError::Stopped)
        );
        assert_eq!((m.reserved(0), m.held_bytes(0, 0)), (30, 10));
        if helped {
            m.op(1, Kind::Reserve, 5, 100, Stop::Never).unwrap();
            assert_eq!(m.held_bytes(0, 0), 30, "the next commit helped first");
        }
        let r = m.reclaim(0, Stop::Never).unwrap();
        assert_eq!(r.applied, u32::from(!helped));
        assert_eq!(r.bytes[0], 30);
        assert_eq!(
            (m.reserved(0), m.sum_held(0)),
            (m.held_bytes(1, 0), m.held_bytes(1, 0))
        );
        assert_eq!(
            m.reclaim(0, Stop::Never).unwrap(),
            Returned::default(),
            "once"
        );
    }
}

#[derive(Clone, Debug)]
enum Step {
    Op {
        slot: u32,
        release: bool,
        bytes: u64,
        stop: u8,
    },
    Reclaim {
        slot: u32,
        stop: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..3, any::<bool>(), 1u64..80, 0u8..8).prop_map(|(slot, release, bytes, stop)| {
            Step::Op {
                slot,
                release,
                bytes,
                stop,
            }
        }),
        (0u32..3, any::<bool>()).prop_map(|(slot, stop)| Step::Reclaim { slot, stop }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random operations of three slots, some "killed" before or after their commit, dead slots
    /// reclaimed (reclaimers themselves sometimes killed after a commit, then reclaimed again):
    /// never above the limit, and once every dead slot is reclaimed, reserved == sum(held).
    #[test]
    fn kills_anywhere_leave_the_counters_exact(steps in proptest::collection::vec(step(), 1..60)) {
        const LIMIT: u64 = 150;
        let m = model(3, 2);
        let mut dead = [false; 3];
        for s in steps {
            match s {
                Step::Op { slot, release, bytes, stop } if !dead[slot as usize] => {
                    let stop = match stop { 0 => Stop::AfterIntent, 1 => Stop::AfterCommit, _ => Stop::Never };
                    let kind = if release { Kind::Release } else { Kind::Reserve };
                    let device = (bytes % 2) as u32;
                    let r = owner_op(&m, slot, device, kind, bytes, LIMIT, || true, stop);
                    dead[slot as usize] = r == Err(OpError::Stopped);
                }
                Step::Reclaim { slot, stop } if dead[slot as usize] => {
                    let stop = if stop { Stop::AfterCommit } else { Stop::Never };
                    dead[slot as usize] = m.reclaim(slot, stop).is_none();
                }
                _ => {}
            }
            for d in 0..2 {
                prop_assert!(m.reserved(d) <= LIMIT);
            }
        }
        for slot in 0..3 {
            if dead[slot as usize] {
                prop_assert!(m.reclaim(slot, Stop::Never).is_some());
                for d in 0..2 {
                    prop_assert_eq!(m.held_bytes(slot, d), 0);
                }
            }
        }
        for d in 0..2 {
            prop_assert_eq!(m.reserved(d), m.sum_held(d));
        }
    }

    /// Garbage in every word of the protocol (a container can write anything into its own
    /// region): operations and reclaims return (typed errors or clamped values), never panic or
    /// hang, and byte counts stay within a word.
    #[test]
    fn garbage_words_never_panic_or_hang(words in proptest::collection::vec(any::<u64>(), 12)) {
        let m = model(2, 2);
        let cells = m.containers.iter().chain(&m.intents).chain(&m.intent_bytes)
            .chain(m.held.iter().flatten());
        for (w, v) in cells.zip(&words) {
            w.store(*v, Ordering::Relaxed);
        }
        for slot in 0..2 {
            let _ = owner_op(&m, slot, words[0] as u32 % 3, Kind::Reserve, 5, 0, || true, Stop::Never);
            let _ = owner_op(&m, slot, 1, Kind::Release, words[1], 0, || true, Stop::Never);
            let _ = m.reclaim(slot, Stop::Never);
            let _ = return_holdings(&m, slot, false, || true, Stop::Never);
        }
        for d in 0..2 {
            prop_assert!(m.reserved(d) <= MAX_RESERVABLE);
        }
    }
}

/// The same on a real region: the owner "dies" right after its container CAS (its slot is then
/// marked as owned by a process that has exited), and `reclaim_dead_slots` applies the commit and
/// returns everything.
#[test]
fn a_region_reclaims_an_owner_killed_after_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RegionConfig::unlimited(1);
    config.memory_limit[0] = 1000;
    config.slots = 4;
    let (region, _) = Region::open_or_create(&dir.path().join("r"), &config).unwrap();
    let survivor = region.claim_slot().unwrap();
    let victim = region.claim_slot().unwrap();
    region.try_reserve(&survivor, 0, 100).unwrap();
    region.try_reserve(&victim, 0, 300).unwrap();
    assert_eq!(
        region.owner_op_until(&victim, 0, Kind::Reserve, 200, 1000, Stop::AfterCommit),
        Err(OpError::Stopped)
    );
    assert_eq!((region.reserved(0), region.held(&victim, 0)), (600, 300));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let record = region.slot_record(victim.index()).unwrap();
    let word = slot_word(slot_generation(victim.state_word()), PHASE_LIVE, dead_pid);
    record.header.state.store(word, Ordering::Release);
    let report = region.reclaim_dead_slots();
    assert_eq!(report.slots_reclaimed, 1);
    assert_eq!(report.pending_applied, 1);
    assert_eq!(report.bytes_returned[0], 500);
    assert_eq!(region.reserved(0), 100);
    assert_eq!(region.held(&survivor, 0), 100);
}
