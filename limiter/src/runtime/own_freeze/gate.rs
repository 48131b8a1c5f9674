//! The gate of the process (`limiter_core::gate`, where its protocol and model live): each
//! thread counts on a counter of its own (chosen at its first call), and a freeze waits for the
//! calls in flight with a bound.

use std::{
    cell::Cell,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use limiter_core::gate::{self, Admitted};

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    inner: gate::Gate,
    /// The next thread's counter.
    next: AtomicUsize,
}

thread_local! {
    /// This thread's counter (`usize::MAX`: not chosen yet).
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

impl Gate {
    fn shard(&self) -> usize {
        SHARD.with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                // Relaxed: only spreads threads over the counters.
                i = self.next.fetch_add(1, Ordering::Relaxed) % gate::SHARDS;
                s.set(i);
            }
            i
        })
    }

    /// Counts the calling thread in if the gate is open; `None` if it is closed.
    #[inline]
    pub(crate) fn try_admit(&self) -> Option<Admitted<'_>> {
        self.inner.try_admit(self.shard())
    }

    /// Closes the gate and waits until no call is in flight, at most `limit`; `false` (the
    /// gate is open again) if calls stayed in flight that long.
    pub(crate) fn close_and_drain(&self, limit: Duration) -> bool {
        self.inner.close();
        let started = Instant::now();
        while self.inner.in_flight() != 0 {
            if started.elapsed() >= limit {
                self.inner.open();
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Opens the gate.
    pub(crate) fn open(&self) {
        self.inner.open();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_waits_for_the_calls_in_flight_within_its_bound() {
        let gate: &'static Gate = Box::leak(Box::default());
        let call = gate.try_admit().expect("open");
        // A call in flight keeps the drain from completing within its bound, and the gate is
        // open again after a drain that gave up.
        assert!(!gate.close_and_drain(Duration::from_millis(20)));
        assert!(gate.try_admit().is_some(), "open again");
        // The drain completes once the call ends, on another thread.
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
}
