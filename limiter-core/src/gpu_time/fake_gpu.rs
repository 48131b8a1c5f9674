//! A fake device for tests: one queue whose clock the test moves; a kernel runs after the work
//! queued before it, and an event records the time at which that work ends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::{Events, Query, StreamRef};

#[derive(Default)]
pub(crate) struct FakeGpu {
    pub(crate) now: Cell<u64>,
    pub(crate) busy_until: Cell<u64>,
    events: RefCell<HashMap<u32, u64>>,
    next: Cell<u32>,
    /// Events created and not destroyed.
    pub(crate) live: Cell<i32>,
    /// Every stream is being captured into a graph.
    pub(crate) capturing: Cell<bool>,
    /// Every record fails.
    pub(crate) fail_records: Cell<bool>,
    /// The device never passes an event again.
    pub(crate) hung: Cell<bool>,
}

impl FakeGpu {
    /// Queues `ns` of work.
    pub(crate) fn launch(&self, ns: u64) {
        let start = self.busy_until.get().max(self.now.get());
        self.busy_until.set(start + ns);
    }

    pub(crate) fn advance(&self, ns: u64) {
        self.now.set(self.now.get() + ns);
    }

    /// Work queued and not yet run, ns.
    pub(crate) fn queued_ns(&self) -> u64 {
        self.busy_until.get().saturating_sub(self.now.get())
    }
}

impl Events for FakeGpu {
    type Event = u32;
    fn create(&self) -> Option<u32> {
        self.next.set(self.next.get() + 1);
        self.live.set(self.live.get() + 1);
        self.events.borrow_mut().insert(self.next.get(), u64::MAX);
        Some(self.next.get())
    }
    fn record(&self, e: u32, _: StreamRef) -> bool {
        if self.fail_records.get() {
            return false;
        }
        let at = self.busy_until.get().max(self.now.get());
        self.events.borrow_mut().insert(e, at);
        true
    }
    fn query(&self, e: u32) -> Query {
        match self.events.borrow().get(&e) {
            _ if self.hung.get() => Query::NotReady,
            Some(&at) if at <= self.now.get() => Query::Done,
            Some(_) => Query::NotReady,
            None => Query::Failed,
        }
    }
    fn elapsed_ns(&self, s: u32, e: u32) -> Option<u64> {
        let ev = self.events.borrow();
        Some(ev.get(&e)? - ev.get(&s)?)
    }
    fn destroy(&self, e: u32) {
        self.live.set(self.live.get() - 1);
        self.events.borrow_mut().remove(&e);
    }
    fn capturing(&self, _: StreamRef) -> Option<bool> {
        Some(self.capturing.get())
    }
}
