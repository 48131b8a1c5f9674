//! A best-effort thread's work in flight while a latency-tier neighbour is on its GPU
//! (`limiter_core::qos::backlog`), over the real driver's events: one [`Backlog`] per launching
//! thread, created at its first launch under the gate.
//!
//! The launch hook comes here only while some device is gated (`limiter_core::sm::Controller::
//! gating`): [`before`] waits until the thread's backlog is under its bound, [`after`] records
//! a marker every few launches. Elsewhere a launch pays one relaxed load.

use std::cell::RefCell;

use limiter_core::{
    gpu_time::StreamRef,
    qos::backlog::{Backlog, Pause},
};

use super::state::State;
use crate::platform::{clock::Clock, driver::DriverEvents};

struct Thread {
    backlog: Backlog<usize>,
    /// `None`: the driver lacks an event function; the thread is not bounded.
    events: Option<DriverEvents>,
}

thread_local! {
    static BACKLOG: RefCell<Option<Thread>> = const { RefCell::new(None) };
}

struct Sleep;

impl Pause for Sleep {
    fn now_ns(&self) -> u64 {
        Clock::MONOTONIC.now()
    }
    fn sleep_ns(&self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}

/// Runs `f` with this thread's backlog and the driver's events (nothing if the driver lacks
/// them, or the thread's storage is gone or busy).
fn with<T>(state: &State, f: impl FnOnce(&mut Backlog<usize>, &DriverEvents) -> T) -> Option<T> {
    BACKLOG
        .try_with(|cell| {
            let mut cell = cell.try_borrow_mut().ok()?;
            let thread = cell.get_or_insert_with(|| Thread {
                backlog: Backlog::default(),
                events: state.driver.events(),
            });
            let events = thread.events?;
            Some(events.relaxed(|| f(&mut thread.backlog, &events)))
        })
        .ok()
        .flatten()
}

/// Before a launch while some device is gated: if the current device is, waits until the
/// thread's backlog is under its bound. Returns whether the launch is to be marked (gated) and
/// the time waited, ns.
#[cold]
#[inline(never)]
pub(crate) fn before(state: &State) -> (bool, u64) {
    if !state.sm.gated(state.current_device()) {
        return (false, 0);
    }
    let waited = with(state, |backlog, events| backlog.admit(events, &Sleep)).unwrap_or(0);
    (true, waited)
}

/// After a gated launch on `stream`: counts it, every few launches records a marker.
#[cold]
#[inline(never)]
pub(crate) fn after(state: &State, stream: StreamRef) {
    with(state, |backlog, events| {
        backlog.launched(events, events.current_context(), stream)
    });
}
