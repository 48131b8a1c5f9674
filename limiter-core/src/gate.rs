//! The in-process freeze's gate (`VGPU_FREEZE_IN_PROCESS`): every hooked CUDA call passes it,
//! counted while it runs; a freeze closes it and waits until no call is counted, so that no call
//! touches the memory while it moves, and holds new calls until it opens again.
//!
//! Each call counts in one of [`SHARDS`] cache-line counters (the caller picks one per thread,
//! so passing is an uncontended increment, a load, and a decrement at the call's end). The freeze
//! stores `closed` and then sums the counters; a call increments and then loads `closed`. A
//! `SeqCst` fence sits between each side's write and its read: in the fences' single total order
//! either the call's comes first (and the sum sees its increment) or the freeze's does (and the
//! call sees the gate closed and backs out), never neither: the store-load order that plain
//! acquire and release cannot give across two locations. (`SeqCst` accesses alone would give it
//! too; the fences are what loom models, and on x86 the increment's locked instruction already
//! orders as much.) Checked by a loom model (`RUSTFLAGS="--cfg loom" cargo test -p limiter-core
//! --release --lib loom`), which finds the interleaving that admits a call into a drained gate
//! when the fences are left out.

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

/// Counters of calls in flight.
pub const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Debug)]
struct Counter(AtomicU64);

/// See the module documentation.
#[derive(Debug)]
pub struct Gate {
    closed: AtomicBool,
    in_flight: [Counter; SHARDS],
}

/// A call in flight: counted until dropped.
#[derive(Debug)]
pub struct Admitted<'a>(&'a AtomicU64);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        // SeqCst: the call's work is done before the freeze can see the count fall (pairs with
        // the freeze's SeqCst sum).
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            closed: AtomicBool::new(false),
            in_flight: std::array::from_fn(|_| Counter(AtomicU64::new(0))),
        }
    }
}

impl Gate {
    /// Counts a call in on counter `shard` (any number: taken modulo [`SHARDS`]) if the gate is
    /// open; `None` if it is closed (the caller waits for it to open, then tries again).
    #[inline]
    pub fn try_admit(&self, shard: usize) -> Option<Admitted<'_>> {
        let c = &self.in_flight[shard % SHARDS].0;
        c.fetch_add(1, Ordering::SeqCst);
        // SeqCst: orders the increment before the load of `closed`; pairs with the fence in
        // `close` (module documentation).
        fence(Ordering::SeqCst);
        if !self.closed.load(Ordering::SeqCst) {
            return Some(Admitted(c));
        }
        c.fetch_sub(1, Ordering::SeqCst);
        None
    }

    /// Closes the gate: calls that try from now on are not admitted.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // SeqCst: orders the store before the loads of `in_flight` that follow; pairs with the
        // fence in `try_admit` (module documentation).
        fence(Ordering::SeqCst);
    }

    /// Calls in flight now. Once the gate is closed, 0 stays 0 until it opens.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
            .iter()
            .map(|c| c.0.load(Ordering::SeqCst))
            .sum()
    }

    /// Opens the gate.
    pub fn open(&self) {
        // SeqCst: what the freeze did is ordered before the calls that pass from now on.
        self.closed.store(false, Ordering::SeqCst);
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::{
        Arc, Barrier,
        atomic::{AtomicBool, AtomicU64, Ordering},
    };

    #[test]
    fn a_closed_gate_admits_nobody_and_counts_the_calls_in_flight() {
        let gate = Gate::default();
        let call = gate.try_admit(3).expect("open");
        assert_eq!(gate.in_flight(), 1);
        gate.close();
        assert!(gate.try_admit(3).is_none() && gate.try_admit(19).is_none());
        assert_eq!(gate.in_flight(), 1, "a refused call is not counted");
        drop(call);
        assert_eq!(gate.in_flight(), 0);
        gate.open();
        assert!(!gate.is_closed());
        assert!(gate.try_admit(0).is_some());
    }

    #[test]
    fn no_call_is_in_flight_once_a_closed_gate_counts_none() {
        // Threads pass the gate in a loop, marking when they are inside; a closed gate that
        // counts no call must have nobody inside.
        let gate = Arc::new(Gate::default());
        let inside = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(5));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (gate, inside, stop, start) =
                    (gate.clone(), inside.clone(), stop.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(a) = gate.try_admit(t) {
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
        // Fewer rounds under miri, which runs every thread's loop instruction by instruction.
        let rounds = if cfg!(miri) { 3 } else { 200 };
        let mut drained = 0;
        while drained < rounds {
            gate.close();
            while gate.in_flight() != 0 {
                std::hint::spin_loop();
            }
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "a call inside a closed gate"
            );
            drained += 1;
            gate.open();
        }
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Run: `RUSTFLAGS="--cfg loom" cargo test -p limiter-core --release --lib loom`.

    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};

    /// A call and a freeze race: if the freeze closes the gate and then sees no call counted,
    /// the call was not admitted and never will be while the gate stays closed; if the call is
    /// admitted, the freeze sees it counted (or the call ended first). Two calls on one counter
    /// and on two.
    #[test]
    fn loom_a_drained_gate_has_no_call_inside() {
        for shards in [(0, 0), (0, 1)] {
            loom::model(move || {
                let gate = Arc::new(Gate::default());
                let drained = Arc::new(AtomicBool::new(false));
                let calls: Vec<_> = [shards.0, shards.1]
                    .into_iter()
                    .map(|shard| {
                        let (gate, drained) = (gate.clone(), drained.clone());
                        loom::thread::spawn(move || {
                            if let Some(a) = gate.try_admit(shard) {
                                // Inside: the freeze must not have found the gate drained.
                                assert!(!drained.load(Ordering::SeqCst), "admitted after a drain");
                                drop(a);
                            }
                        })
                    })
                    .collect();
                gate.close();
                if gate.in_flight() == 0 {
                    drained.store(true, Ordering::SeqCst);
                }
                for c in calls {
                    c.join().unwrap();
                }
            });
        }
    }
}
