//! A best-effort thread's work in flight, bounded while a latency-tier neighbour is on its GPU.
//!
//! Without MPS the GPU time-slices between contexts: when a latency request arrives, whatever
//! best-effort work is already queued shares the GPU with it until it has run, whatever the gate
//! on new launches says (`super::super::sm`: best-effort launches wait while latency work is in
//! flight). A framework queues as much as it can (PyTorch: hundreds of kernels, seconds of a
//! training step), so the gate alone cannot keep a request's latency. While a latency neighbour is
//! on the board, each best-effort launching thread therefore records a marker event after every
//! [`EVERY`] launches and, before a launch, waits until fewer than [`MARKS`] of its markers are
//! still ahead of the GPU: at most `EVERY x MARKS` launches of the thread (plus those since its
//! latest marker) are queued when a request arrives. Markers are plain events queried without
//! blocking (`cuEventQuery`), one wait at most [`MAX_WAIT_NS`]; a stream being captured into a
//! graph gets none (the event would become a node of the application's graph).
//!
//! This is the logic only; the limiter (`limiter/src/runtime/backlog.rs`) keeps one per thread
//! over the real driver's events.

use std::collections::VecDeque;

use crate::gpu_time::{Events, Query, StreamRef};

/// A marker after every this many launches.
pub const EVERY: u32 = 2;
/// At most this many markers ahead of the GPU before a launch.
pub const MARKS: usize = 2;
/// The longest one launch waits for its thread's backlog: a GPU that never passes a marker (a
/// hung kernel, a lost context) slows best-effort work down, never stops it.
pub const MAX_WAIT_NS: u64 = 1_000_000_000;
/// How long a wait sleeps between two queries for its first [`FAST_POLL_NS`]; after that each
/// sleep doubles, up to [`MAX_POLL_NS`] (a marker is seen within 20 us of passing in a normal
/// wait; a stuck GPU is not polled 50,000 times a second).
pub const POLL_NS: u64 = 20_000;
/// How long a wait polls every [`POLL_NS`].
pub const FAST_POLL_NS: u64 = 1_000_000;
/// The longest sleep between two queries.
pub const MAX_POLL_NS: u64 = 1_000_000;
/// Idle marker events kept for reuse per thread.
const POOL: usize = 8;

/// The clock and the sleep a wait uses.
pub trait Pause {
    /// `CLOCK_MONOTONIC`, ns.
    fn now_ns(&self) -> u64;
    /// Sleeps about `ns`.
    fn sleep_ns(&self, ns: u64);
}

/// One thread's markers.
#[derive(Debug)]
pub struct Backlog<E> {
    /// Markers recorded and not yet seen passed, oldest first, with their context.
    ahead: VecDeque<(u64, E)>,
    /// Idle marker events and their context.
    pool: Vec<(u64, E)>,
    /// Launches since the latest marker.
    since: u32,
}

impl<E: Copy> Default for Backlog<E> {
    fn default() -> Self {
        Backlog {
            ahead: VecDeque::with_capacity(MARKS + 1),
            pool: Vec::with_capacity(POOL),
            since: 0,
        }
    }
}

impl<E: Copy> Backlog<E> {
    /// Before a launch: waits until fewer than [`MARKS`] markers are ahead of the GPU (at most
    /// [`MAX_WAIT_NS`]); returns the time waited, ns.
    pub fn admit<V: Events<Event = E>>(&mut self, events: &V, pause: &impl Pause) -> u64 {
        self.retire(events);
        if self.ahead.len() < MARKS {
            return 0;
        }
        let start = pause.now_ns();
        let mut poll = POLL_NS;
        loop {
            pause.sleep_ns(poll);
            self.retire(events);
            let waited = pause.now_ns().saturating_sub(start);
            if waited >= FAST_POLL_NS {
                poll = (poll * 2).min(MAX_POLL_NS);
            }
            if self.ahead.len() < MARKS {
                return waited;
            }
            if waited >= MAX_WAIT_NS {
                // Given up on the oldest: it is forgotten (and its event destroyed), not waited
                // on again.
                if let Some((_, e)) = self.ahead.pop_front() {
                    events.destroy(e);
                }
                return waited;
            }
        }
    }

    /// After a launch on `stream` in `context`: every [`EVERY`] launches, records a marker.
    pub fn launched<V: Events<Event = E>>(&mut self, events: &V, context: u64, stream: StreamRef) {
        self.since += 1;
        if self.since < EVERY || events.capturing(stream) != Some(false) {
            return;
        }
        let event = match self.pool.iter().rposition(|p| p.0 == context) {
            Some(i) => self.pool.swap_remove(i).1,
            None => match events.create() {
                Some(e) => e,
                None => return,
            },
        };
        if events.record(event, stream) {
            self.since = 0;
            self.ahead.push_back((context, event));
        } else {
            events.destroy(event);
        }
    }

    /// The gate is lifted: markers are no longer waited on (their events go back to the pool
    /// once passed, or are destroyed).
    #[cfg(test)]
    pub(crate) fn release<V: Events<Event = E>>(&mut self, events: &V) {
        while let Some((ctx, e)) = self.ahead.pop_front() {
            self.keep(events, ctx, e);
        }
        self.since = 0;
    }

    /// Markers ahead of the GPU.
    #[cfg(test)]
    pub(crate) fn ahead(&self) -> usize {
        self.ahead.len()
    }

    /// Destroys every event (the thread ends).
    #[cfg(test)]
    pub(crate) fn clear<V: Events<Event = E>>(&mut self, events: &V) {
        for (_, e) in self.ahead.drain(..).chain(self.pool.drain(..)) {
            events.destroy(e);
        }
    }

    /// Markers the GPU has passed (or that failed) leave the front.
    fn retire<V: Events<Event = E>>(&mut self, events: &V) {
        while let Some(&(ctx, e)) = self.ahead.front() {
            match events.query(e) {
                Query::NotReady => return,
                Query::Done => {
                    self.ahead.pop_front();
                    self.keep(events, ctx, e);
                }
                Query::Failed => {
                    self.ahead.pop_front();
                    events.destroy(e);
                }
            }
        }
    }

    fn keep<V: Events<Event = E>>(&mut self, events: &V, context: u64, event: E) {
        if self.pool.len() < POOL {
            self.pool.push((context, event));
        } else {
            events.destroy(event);
        }
    }
}

#[cfg(test)]
mod tests {
    //! A best-effort thread on a simulated device queue in virtual time (time moves only when
    //! the thread sleeps).

    use super::*;
    use crate::gpu_time::fake_gpu::FakeGpu;

    impl Pause for FakeGpu {
        fn now_ns(&self) -> u64 {
            self.now.get()
        }
        fn sleep_ns(&self, ns: u64) {
            self.advance(ns);
        }
    }

    const STREAM: StreamRef = StreamRef {
        handle: 7,
        per_thread: false,
    };

    /// A thread that launches `n` kernels of `kernel_ns` back to back (1 us of CPU each), under
    /// the bound; returns the most work it ever had queued, ns.
    fn run(q: &FakeGpu, b: &mut Backlog<u32>, n: usize, kernel_ns: u64) -> u64 {
        let mut most = 0;
        for _ in 0..n {
            b.admit(q, q);
            q.launch(kernel_ns);
            b.launched(q, 1, STREAM);
            most = most.max(q.queued_ns());
            q.sleep_ns(1_000);
        }
        most
    }

    #[test]
    fn a_thread_never_has_more_than_its_bound_queued() {
        let q = FakeGpu::default();
        let mut b = Backlog::default();
        // 28 us matmuls, launched in 1 us: unbounded, 2,000 of them would queue 54 ms.
        let n = if cfg!(miri) { 200 } else { 2_000 };
        let most = run(&q, &mut b, n, 28_000);
        let bound = u64::from(EVERY) * (MARKS as u64 + 1) * 28_000;
        assert!(most <= bound, "{most} ns queued, bound {bound}");
        // The GPU stays fed: the thread's launches kept it busy all along (no gap wider than a
        // poll).
        let work = n as u64 * 28_000;
        assert!(q.busy_until.get() >= work, "{}", q.busy_until.get());
        assert!(q.now.get() <= work + POLL_NS, "{}", q.now.get());
    }

    #[test]
    fn short_kernels_pay_nothing_while_the_gpu_keeps_up() {
        let q = FakeGpu::default();
        let mut b = Backlog::default();
        // Kernels shorter than a launch: the queue never builds up, no launch waits.
        for _ in 0..if cfg!(miri) { 100 } else { 1_000 } {
            assert_eq!(b.admit(&q, &q), 0);
            q.launch(500);
            b.launched(&q, 1, STREAM);
            q.sleep_ns(1_000);
        }
        assert!(b.ahead() < MARKS);
    }

    #[test]
    fn events_are_reused_and_all_destroyed_at_the_end() {
        let q = FakeGpu::default();
        let mut b = Backlog::default();
        run(&q, &mut b, if cfg!(miri) { 100 } else { 500 }, 28_000);
        assert!(
            q.live.get() <= (MARKS + 1 + POOL) as i32,
            "{} events",
            q.live.get()
        );
        b.release(&q);
        assert_eq!(b.ahead(), 0);
        b.clear(&q);
        assert_eq!(q.live.get(), 0);
    }

    #[test]
    fn a_capturing_stream_gets_no_marker() {
        let q = FakeGpu::default();
        q.capturing.set(true);
        let mut b = Backlog::default();
        run(&q, &mut b, 100, 28_000);
        assert_eq!(b.ahead(), 0);
        assert_eq!(q.live.get(), 0);
    }

    #[test]
    fn a_gpu_that_never_passes_a_marker_slows_launches_down_never_stops_them() {
        let q = FakeGpu::default();
        let mut b = Backlog::default();
        run(&q, &mut b, 2 * EVERY as usize, 28_000);
        q.hung.set(true);
        let waited = b.admit(&q, &q);
        assert!(
            (MAX_WAIT_NS..MAX_WAIT_NS + MAX_POLL_NS).contains(&waited),
            "{waited}"
        );
        // The oldest marker is given up: the next launch has room at once.
        assert_eq!(b.ahead(), MARKS - 1);
        assert_eq!(b.admit(&q, &q), 0);
    }
}
