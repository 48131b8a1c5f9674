//! The shared-memory accounting region: the protocol between the limiter (writer, in every GPU
//! process of a container) and the agent (reader). See `docs/region.md` for the layout, the
//! protocols and their crash windows.
//!
//! - Writers: [`Region::open_or_create`] (CAS initialisation, no file locks),
//!   [`Region::claim_slot`], [`Region::try_reserve`] / [`Region::release`] (exact limits),
//!   [`Region::shard_writer`] (lock-free per-thread statistics), [`Region::sm_shares`] (the
//!   container's SM duty cycle per device, [`sm_share`]).
//! - Readers: [`reader::RegionReader`] (read-only, validates everything) and
//!   [`hami::HamiReader`] (HAMi-core's v1 cache file).
//!
//! Model checking: `RUSTFLAGS="--cfg loom" cargo test -p region --release --lib loom`.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. layout: `control`, `freeze_pool`, `layout_v2`, `prefetch`, `procfs`, `sigbus`, `sync`, `words`, `layout`,
//!    `reserve`, `seqlock`, `layout_types`, `sm_share`. The file's layout (every major version), its
//!    words and the lock-free protocols on them.
//! 2. access: `loom_tests`, `mapping`, `pread`, `hami`, `handle`, `reader`, `control_file`, `error`,
//!    `holdings`, `qos_board`. Mapping and reading a region file, HAMi-core's format, the control
//!    block, the node's QoS board.
//! 3. process: `config`, `slots`, `init`, `stats`, `region`. Creating or joining a region, a
//!    process's slot and the statistics it records.

mod config;
pub mod control;
mod control_file;
mod error;
pub mod freeze_pool;
pub mod hami;
mod handle;
mod holdings;
mod init;
pub mod layout;
mod layout_types;
pub mod layout_v2;
mod mapping;
mod pread;
pub mod prefetch;
pub mod procfs;
pub mod qos_board;
pub mod reader;
mod region;
mod reserve;
pub mod seqlock;
mod sigbus;
mod slots;
pub mod sm_share;
mod stats;
mod sync;
mod words;

pub use config::{ConfigMismatch, InitOutcome, RegionConfig};
pub use control::{
    ControlError, ControlSettings, ControlSnapshot, FreezeMark, OwnFreeze, OwnFreezeState,
    control_path,
};
pub use control_file::{ControlReader, ControlWriter, read_control};
pub use error::{RegionError, ReserveError};
pub use handle::Region;
pub use holdings::{Holding, SlotGpuTime};
pub use init::{INIT_STALL_MS, INIT_WAIT_LIMIT, REGION_MODE};
pub use layout::{DEFAULT_SLOTS, MAX_SLOTS, SmShare};
pub use region::{Reserver, SWEEP_INTERVAL_MS};
pub use reserve::{Denied, MAX_RESERVABLE};
pub use slots::{RECLAIM_STALL_MS, ReclaimReport, Slot};
pub use stats::{Call, GpuSample, KernelName, SampleProblem, ShardWriter, kernel_name_hash};

#[cfg(all(test, loom))]
mod loom_tests {
    //! Loom models of the seqlock and of the reservation protocol (exact limits, SIGKILL at any point,
    //! exactly-once reclaim). A killed process is a thread that stops where `reserve::Stop` says and
    //! is joined before anyone judges it dead (as the kernel's exit and `/proc` order it).
    //! Run: `RUSTFLAGS="--cfg loom" cargo test -p region --release --lib loom`.

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;
    use loom::thread;
    use std::sync::atomic::Ordering;

    use crate::layout::SmShareOf;
    use crate::reserve::{self, Kind, OpError, Stop};
    use crate::seqlock::{self, SeqRead};
    use crate::sm_share;

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

    /// Layout 3's reader: a record copied twice with an Acquire fence between the copies is taken
    /// when the copies agree and the sequence is even. The writer's sections only grow the fields
    /// (as every statistic does: here by storing 1, then 2) and leave them equal at every section's
    /// end; an accepted copy must never be torn, whatever values the relaxed loads of each copy
    /// return. (Without the fence the model finds a torn copy accepted.)
    #[test]
    fn loom_record_copies_that_agree_are_consistent() {
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
            let copy = || [&shard.0, &shard.1, &shard.2].map(|w| w.load(Ordering::Relaxed));
            let first = copy();
            loom::sync::atomic::fence(Ordering::Acquire);
            let second = copy();
            if seqlock::copies_agree(&first, &second, 0) {
                assert_eq!(first[1], first[2], "torn copy accepted: {first:?}");
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

    type Model = reserve::model::Model<AtomicU64>;

    fn model(slots: u32, devices: u32) -> Arc<Model> {
        Arc::new(Model::new(
            slots,
            devices,
            || AtomicU64::new(0),
            |round| {
                thread::yield_now();
                round < 64
            },
        ))
    }

    fn bounded() -> loom::model::Builder {
        let mut builder = loom::model::Builder::new();
        // Every interleaving with up to two preemptions: about 30 s for all models here, and deep
        // enough to fail when helping is left out of the commit loop or when a reclaimer discards a
        // committed operation (both checked by hand). LOOM_MAX_PREEMPTIONS=3 runs deeper (all pass;
        // about 15 minutes on the dev VM).
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(2);
        }
        builder
    }

    /// Two processes race to reserve 60 each against a limit of 100 (one of them then releases):
    /// exactly one wins, the counter never passes the limit, and it ends equal to what the slots
    /// hold.
    #[test]
    fn loom_two_reservers_race_against_the_limit() {
        const LIMIT: u64 = 100;
        bounded().check(|| {
            let m = model(2, 1);
            let other = {
                let m = m.clone();
                thread::spawn(move || {
                    let won = m.op(1, Kind::Reserve, 60, LIMIT, Stop::Never).is_ok();
                    assert!(m.reserved(0) <= LIMIT);
                    if won {
                        assert_eq!(m.op(1, Kind::Release, 60, 0, Stop::Never), Ok(60));
                    }
                    won
                })
            };
            let mine = m.op(0, Kind::Reserve, 60, LIMIT, Stop::Never);
            assert!(m.reserved(0) <= LIMIT);
            let theirs = other.join().unwrap();
            if let Err(e) = mine {
                assert!(matches!(e, OpError::Denied(d) if d.reserved + 60 > LIMIT));
            }
            assert!(mine.is_ok() || theirs, "one reservation must win");
            assert_eq!(m.reserved(0), m.sum_held(0));
            assert_eq!(m.held_bytes(1, 0), 0);
            assert_eq!(m.held_bytes(0, 0), if mine.is_ok() { 60 } else { 0 });
        });
    }

    /// Process 0 holds 30 and is killed inside a reservation of 50 (after publishing its intent, or
    /// after its container CAS) while process 1 reserves and releases against a limit of 100; then a
    /// reclaimer returns process 0's slot while process 1 is still running. Whatever the kill point
    /// and the interleaving: never above the limit, and at the end reserved == what process 1 holds.
    fn killed_owner_then_reclaimed(stop: Stop) {
        const LIMIT: u64 = 100;
        bounded().check(move || {
            let m = model(2, 1);
            m.op(0, Kind::Reserve, 30, LIMIT, Stop::Never).unwrap();
            let victim = {
                let m = m.clone();
                thread::spawn(move || {
                    // 30 + 50 + 20 fits exactly: both processes' operations always commit, in
                    // either order, so process 1 can commit on top of the victim's commit.
                    assert_eq!(
                        m.op(0, Kind::Reserve, 50, LIMIT, stop),
                        Err(OpError::Stopped)
                    );
                })
            };
            let live = {
                let m = m.clone();
                thread::spawn(move || {
                    if m.op(1, Kind::Reserve, 20, LIMIT, Stop::Never).is_ok() {
                        assert!(m.reserved(0) <= LIMIT);
                        m.op(1, Kind::Release, 5, 0, Stop::Never).unwrap();
                    }
                    assert!(m.reserved(0) <= LIMIT);
                })
            };
            victim.join().unwrap();
            let returned = m.reclaim(0, Stop::Never).expect("the reclaim completes");
            // A commit of process 1 may have helped (applied) it before the reclaim looked.
            assert!(returned.applied + returned.discarded <= 1);
            if stop == Stop::AfterIntent {
                assert_eq!(returned.discarded, 1, "an uncommitted intent is discarded");
            }
            assert!(m.reserved(0) <= LIMIT);
            live.join().unwrap();
            assert_eq!(m.held_bytes(0, 0), 0);
            assert_eq!(m.reserved(0), m.sum_held(0));
            assert_eq!(m.held_bytes(1, 0), 15);
        });
    }

    #[test]
    fn loom_owner_killed_after_commit_is_reclaimed_exactly() {
        killed_owner_then_reclaimed(Stop::AfterCommit);
    }

    #[test]
    fn loom_owner_killed_before_commit_is_reclaimed_exactly() {
        killed_owner_then_reclaimed(Stop::AfterIntent);
    }

    /// A dead slot holding 64 is reclaimed by a reclaimer that is killed right after its container
    /// CAS and, overlapping it (the takeover), by a second one; a live process reserves meanwhile.
    /// The 64 bytes are returned exactly once.
    #[test]
    fn loom_reclaimer_killed_mid_return_is_finished_by_the_next() {
        const LIMIT: u64 = 100;
        bounded().check(|| {
            let m = model(2, 1);
            m.op(0, Kind::Reserve, 64, LIMIT, Stop::Never).unwrap();
            let first = {
                let m = m.clone();
                thread::spawn(move || m.reclaim(0, Stop::AfterCommit))
            };
            let live = {
                let m = m.clone();
                thread::spawn(move || {
                    let ok = m.op(1, Kind::Reserve, 30, LIMIT, Stop::Never).is_ok();
                    assert!(m.reserved(0) <= LIMIT);
                    ok
                })
            };
            let second = m.reclaim(0, Stop::Never).expect("the takeover completes");
            let first = first.join().unwrap();
            let live_ok = live.join().unwrap();
            let returned = second.bytes[0] + first.map_or(0, |r| r.bytes[0]);
            // A first reclaimer that stopped after its CAS reports None, but its CAS counted.
            assert!(returned <= 64);
            assert_eq!(m.held_bytes(0, 0), 0);
            assert_eq!(m.reserved(0), m.sum_held(0));
            assert_eq!(m.held_bytes(1, 0), if live_ok { 30 } else { 0 });
        });
    }

    fn sm_share() -> Arc<SmShareOf<AtomicU64>> {
        let z = || AtomicU64::new(0);
        Arc::new(SmShareOf {
            window_start: z(),
            last_launch: z(),
            resume_at: z(),
            closed_start: z(),
            closes: z(),
            duty: z(),
            feedback_lease: z(),
            qos: z(),
        })
    }

    /// Two processes close the window that started at 100 at once, with different resumes, while a
    /// third launches (reads the window, and opens one at 150 if it finds none): the later resume
    /// wins whatever the order, the window counts one close, and what the launcher reads never goes
    /// backwards.
    #[test]
    fn loom_sm_closes_agree_on_the_latest_resume() {
        bounded().check(|| {
            let s = sm_share();
            s.open(100);
            let closers: Vec<_> = [300, 400]
                .into_iter()
                .map(|resume| {
                    let s = s.clone();
                    thread::spawn(move || s.close(100, resume))
                })
                .collect();
            let first = s.view();
            s.open(150);
            let second = s.view();
            assert!(second.resume >= first.resume && second.start >= first.start);
            assert!(second.start >= 150);
            let firsts = closers
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|&f| f)
                .count();
            assert_eq!(firsts, 1, "one first close per window");
            let v = s.view();
            assert_eq!((v.resume, v.closed, s.closes()), (400, 100, 1));
        });
    }

    /// A process killed in the middle of its close (after raising the resume, before recording the
    /// close) leaves no state anyone waits on: another process's close of the same window still
    /// raises the resume, and the next window (starting at that resume) closes and counts normally.
    #[test]
    fn loom_sm_a_killed_closer_blocks_nobody() {
        bounded().check(|| {
            let s = sm_share();
            s.open(100);
            let victim = {
                let s = s.clone();
                thread::spawn(move || {
                    s.close_until(100, 350, sm_share::Stop::AfterResume);
                })
            };
            s.close(100, 300);
            victim.join().unwrap();
            let v = s.view();
            assert_eq!(
                v.resume, 350,
                "the killed process's resume stands, nothing more"
            );
            assert!(s.closes() <= 1);
            let before = s.closes();
            assert!(s.close(v.resume, 600), "the next window closes");
            assert_eq!(s.closes(), before + 1);
            assert_eq!(s.view().closed, 350);
        });
    }

    /// Two processes ask for the correction's lease at the same moment: exactly one gets it; the
    /// other takes it over only once it has lapsed, after which the first cannot renew it.
    #[test]
    fn loom_sm_the_lease_has_one_holder() {
        bounded().check(|| {
            let s = sm_share();
            let other = {
                let s = s.clone();
                thread::spawn(move || s.hold_lease(2, 1_000))
            };
            let mine = s.hold_lease(1, 1_000);
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one holder");
            let (holder, loser) = if mine { (1, 2) } else { (2, 1) };
            assert_eq!(s.lease_holder(), holder);
            let late = 1_000 + sm_share::LEASE_MS + 1;
            let renew = {
                let s = s.clone();
                thread::spawn(move || s.hold_lease(holder, late))
            };
            let take = s.hold_lease(loser, late);
            let renewed = renew.join().unwrap();
            // Either the holder renewed first (the lease is fresh again), or the loser took the
            // lapsed lease first (and the holder's renewal, now of someone else's lease, fails).
            assert!(renewed ^ take);
            assert_eq!(s.lease_holder(), if take { loser } else { holder });
        });
    }

    /// The duty cycle is replaced only from the value its writer read: a holder that lost the lease
    /// and writes a correction computed earlier cannot overwrite the new holder's newer word.
    #[test]
    fn loom_sm_a_stale_duty_write_is_refused() {
        bounded().check(|| {
            let s = sm_share();
            let start = sm_share::duty_word(40, 400);
            assert!(s.set_duty(0, start));
            let stale = {
                let s = s.clone();
                thread::spawn(move || s.set_duty(start, sm_share::duty_word(40, 450)))
            };
            let newer = s.set_duty(start, sm_share::duty_word(60, 600));
            let stale_won = stale.join().unwrap();
            assert!(newer ^ stale_won, "exactly one write from the same value");
            let want = if newer {
                sm_share::duty_word(60, 600)
            } else {
                sm_share::duty_word(40, 450)
            };
            assert_eq!(s.duty(), want);
        });
    }
}
