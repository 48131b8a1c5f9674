//! The gate every hooked call passes while the in-process freeze is on: it counts the calls in
//! flight, so that a freeze starts only when none is (a call that reached the driver may use the
//! memory about to move), and it holds new calls while the memory is away.
//!
//! Each thread counts in one of [`SHARDS`] cache-line counters (its own, mostly), so passing the
//! gate is an uncontended increment, a load, and a decrement at the call's end. The freeze
//! closes the gate and then sums the counters; a call increments and then looks at the gate.
//! Both pairs are `SeqCst`: either the call sees the gate closed (and backs out), or the freeze
//! sees its count (and waits for it), never neither (the store-load order that only `SeqCst`
//! gives across two locations).

use std::{
    cell::Cell,
    sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

/// Counters of calls in flight.
pub(crate) const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Counter(AtomicU64);

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
    in_flight: [Counter; SHARDS],
    /// The next thread's counter.
    next: AtomicUsize,
}

thread_local! {
    /// This thread's counter (`usize::MAX`: not chosen yet).
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// A call in flight: counted until dropped.
#[derive(Debug)]
pub(crate) struct Admitted(&'static AtomicU64);

impl Drop for Admitted {
    fn drop(&mut self) {
        // SeqCst: the call's driver work is done before the freeze can see the count fall
        // (pairs with the freeze's SeqCst sum).
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    fn counter(&'static self) -> &'static AtomicU64 {
        let i = SHARD.with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                // Relaxed: only spreads threads over the counters.
                i = self.next.fetch_add(1, Ordering::Relaxed) % SHARDS;
                s.set(i);
            }
            i
        });
        &self.in_flight[i].0
    }

    /// Counts the calling thread in if the gate is open; `None` if it is closed (the caller
    /// waits for it to open, then tries again).
    #[inline]
    pub(crate) fn try_admit(&'static self) -> Option<Admitted> {
        let c = self.counter();
        // SeqCst: the increment is ordered before the load of `closed` (see the module
        // documentation).
        c.fetch_add(1, Ordering::SeqCst);
        if !self.closed.load(Ordering::SeqCst) {
            return Some(Admitted(c));
        }
        c.fetch_sub(1, Ordering::SeqCst);
        None
    }

    /// Closes the gate and waits until no call is in flight, at most `limit`; `false` (the
    /// gate is open again) if calls stayed in flight that long.
    pub(crate) fn close_and_drain(&self, limit: Duration) -> bool {
        // SeqCst: pairs with `try_admit` (see the module documentation).
        self.closed.store(true, Ordering::SeqCst);
        let started = Instant::now();
        loop {
            let n: u64 = self
                .in_flight
                .iter()
                .map(|c| c.0.load(Ordering::SeqCst))
                .sum();
            if n == 0 {
                return true;
            }
            if started.elapsed() >= limit {
                self.open();
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Opens the gate.
    pub(crate) fn open(&self) {
        // SeqCst: the memory's return is ordered before the calls that pass from now on.
        self.closed.store(false, Ordering::SeqCst);
    }

    /// Whether the gate is closed.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    fn leaked() -> &'static Gate {
        Box::leak(Box::default())
    }

    #[test]
    fn a_closed_gate_admits_nobody_and_a_drain_waits_for_the_calls_in_flight() {
        let gate = leaked();
        let call = gate.try_admit().expect("open");
        // A call in flight keeps the drain from completing within its bound, and the gate is
        // open again after a drain that gave up.
        assert!(!gate.close_and_drain(Duration::from_millis(20)));
        assert!(!gate.is_closed());
        // The drain completes once the call ends.
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(call);
        });
        assert!(gate.close_and_drain(Duration::from_secs(10)));
        released.join().unwrap();
        assert!(gate.try_admit().is_none(), "closed");
        gate.open();
        assert!(gate.try_admit().is_some());
    }

    #[test]
    fn no_call_is_in_flight_once_a_drain_completes() {
        // Threads pass the gate in a loop, marking when they are inside; the drain must never
        // complete while one is inside.
        let gate = leaked();
        let inside = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (inside, stop, start) = (inside.clone(), stop.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(a) = gate.try_admit() {
                            inside.fetch_add(1, Ordering::SeqCst);
                            std::hint::spin_loop();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            drop(a);
                        }
                    }
                })
            })
            .collect();
        start.wait();
        for _ in 0..200 {
            assert!(gate.close_and_drain(Duration::from_secs(10)));
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "a call inside a closed gate"
            );
            gate.open();
        }
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
}
