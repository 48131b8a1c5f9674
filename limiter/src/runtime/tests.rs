//! The runtime's process lifecycle and run-time limit changes, in process over the fake driver of
//! `test_support`: what a forked child and an exit do to this process's accounting, a creation
//! race, and a control block change reaching the SM controller and the region.

use std::sync::Barrier;

use agent_common::api::ApiId;
use limiter_core::accounting::{Accounting as _, Call};
use region::{ControlWriter, control_path, reader::SlotPhase};

use super::Runtime;
use crate::test_support::{Cx, config};

const MIB: u64 = 1 << 20;

fn alloc_call() -> Call {
    Call {
        latency_ns: 1_000,
        ok: true,
        bytes_allocated: MIB,
        bytes_freed: 0,
        bytes_moved: 0,
    }
}

#[test]
fn a_forked_child_forgets_the_parents_accounting_and_exit_returns_its_own() {
    let cx = Cx::new(config(1 << 30), "fork");
    let rt = Runtime::with_state(cx.state);
    let api = ApiId::from_name("cuMemAlloc_v2").unwrap();
    let parent = rt.process_or_create(cx.state);
    assert!(std::ptr::eq(rt.process().unwrap(), parent));
    assert_eq!(
        rt.entry_lines()[2].load(std::sync::atomic::Ordering::Relaxed),
        parent.ptrs.base(),
        "the hints know the table"
    );
    parent.ledger.try_reserve(0, 64 * MIB).unwrap();
    parent.ledger.record(api, alloc_call(), || 10);
    // The child handler: the parent's accounting is forgotten, not torn down.
    rt.after_fork_in_child();
    assert!(rt.process().is_none());
    let child = rt.process_or_create(cx.state);
    assert!(!std::ptr::eq(child, parent));
    let (_, parent_slot) = parent.region_slot().unwrap();
    let (_, child_slot) = child.region_slot().unwrap();
    assert_ne!(parent_slot.index(), child_slot.index(), "its own slot");
    child.ledger.try_reserve(0, 32 * MIB).unwrap();
    // This thread's writer belonged to the parent's ledger: the child's record lands in its own
    // slot.
    child.ledger.record(api, alloc_call(), || 10);
    let snap = cx.snapshot();
    for slot in [parent_slot.index(), child_slot.index()] {
        let s = snap.slots.iter().find(|s| s.index == slot).unwrap();
        assert_eq!(s.phase, SlotPhase::Live);
        let a = s.apis.iter().find(|a| a.api == api).unwrap();
        assert_eq!(a.calls, 1, "slot {slot}");
    }
    // Exit retires the child's slot only, returning what it held.
    rt.at_exit();
    let region = cx.state.region().unwrap();
    assert_eq!(region.reserved(0), 64 * MIB);
    let snap = cx.snapshot();
    assert!(
        !snap
            .slots
            .iter()
            .any(|s| s.index == child_slot.index() && s.phase == SlotPhase::Live)
    );
}

#[test]
fn threads_racing_to_create_the_process_share_one_and_the_losers_give_their_slots_back() {
    let cx = Cx::new(config(1 << 30), "race");
    let rt = Runtime::with_state(cx.state);
    let start = Barrier::new(4);
    let made: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    std::ptr::from_ref(rt.process_or_create(cx.state)) as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(made.iter().all(|&p| p == made[0]));
    // `cx` built a process of its own; the runtime's is the only other live slot.
    let live = cx
        .snapshot()
        .slots
        .iter()
        .filter(|s| s.phase == SlotPhase::Live)
        .count();
    assert_eq!(live, 2);
}

#[test]
fn a_control_block_change_reaches_the_controller_and_the_region() {
    let mut c = config(1 << 30);
    c.sm_limit[1] = Some(50);
    c.sm_feedback = false;
    let cx = Cx::new(c.clone(), "control");
    let region = cx.state.region().unwrap();
    assert_eq!(cx.state.sm.percent(0), 0);
    let block = tenant_fs::open_no_links(
        &control_path(cx.region.as_ref().unwrap()),
        tenant_fs::Access::ReadWrite,
    )
    .unwrap();
    let writer = ControlWriter::new(&block).unwrap();
    writer
        .update(|s| {
            s.sm_percent[0] = Some(30);
            s.memory_limit[0] = Some(2 << 30);
        })
        .unwrap();
    cx.state.poll_control();
    assert_eq!(cx.state.sm.percent(0), 30);
    assert_eq!(
        cx.state.sm.percent(1),
        50,
        "not overridden: the environment's"
    );
    assert_eq!(region.limit(0), 2 << 30);
    // Lowered below what is held: further reservations are denied, nothing is revoked.
    cx.process.ledger.try_reserve(0, 64 * MIB).unwrap();
    writer.update(|s| s.memory_limit[0] = Some(MIB)).unwrap();
    cx.state.poll_control();
    assert!(cx.process.ledger.try_reserve(0, MIB).is_err());
    assert_eq!(cx.process.ledger.used(0), 64 * MIB);
    // A process that starts after the change applies it from its first call.
    c.shared_cache = cx.region.clone();
    let later = crate::test_support::state(c);
    assert_eq!(later.sm.percent(0), 30);
}
