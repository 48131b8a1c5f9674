//! The hooks' clock: one read before and one after the driver call.
//!
//! On x86_64 with an invariant TSC (CPUID leaf 0x80000007, EDX bit 8: what Linux shows as
//! `constant_tsc` and `nonstop_tsc`) a read is `rdtsc` (~7-25 ns, no system call, no vDSO page)
//! and ticks become nanoseconds by one 128-bit multiply with a factor calibrated against
//! `CLOCK_MONOTONIC`. Elsewhere, or when the calibration looks wrong, reads are `CLOCK_MONOTONIC`
//! through the vDSO (~20-65 ns on the CI VM). Neither the check nor the calibration reads
//! `/proc/cpuinfo` (text the kernel builds for every CPU, tens of microseconds on a large
//! machine). `CLOCK_MONOTONIC_COARSE` is cheaper still but ticks in milliseconds: useless for
//! microsecond latencies.
//!
//! The process-wide clock is a [`LazyClock`]: its calibration starts at initialisation and
//! finishes at the first conversion of ticks to nanoseconds, which comes after the first driver
//! call (`cuInit`, milliseconds later), so the window is long and nobody waits for it. Until then
//! reads are already TSC ticks. Initialisation used to spin out a 100 us window: most of its
//! CPU time, and the time during which 64 processes starting together got preempted
//! (docs/benchmarks.md, "start-up").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How time is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// Nanoseconds per tick, as a 32.32 fixed-point number; 0 = ticks are nanoseconds
    /// (`CLOCK_MONOTONIC`).
    tsc_mult: u64,
}

/// Shortest calibration window.
const CALIBRATION: Duration = Duration::from_micros(100);

/// [`LazyClock::mult`] while the calibration is still open.
const PENDING: u64 = u64::MAX;

/// Largest spread, in ticks, of the two TSC reads around a `CLOCK_MONOTONIC` read for a
/// calibration sample (a few microseconds at any plausible frequency): a sample whose reads
/// were split by a preemption or an interrupt is taken again.
const SAMPLE_SPREAD_TICKS: u64 = 20_000;

/// The process-wide clock: reads are available at once, conversions from the first
/// [`LazyClock::get`] on (see the module documentation).
#[derive(Debug)]
pub(crate) struct LazyClock {
    /// The calibrated [`Clock`]'s factor; [`PENDING`] while calibrating (reads are TSC ticks);
    /// 0 for `CLOCK_MONOTONIC`. Relaxed: a value that changes once, from `PENDING` to the factor
    /// every thread agrees on (the first one stored, by compare-and-swap).
    mult: AtomicU64,
    /// The calibration's first sample: (`CLOCK_MONOTONIC` ns, TSC ticks).
    start: (u64, u64),
}

impl LazyClock {
    /// Starts calibrating (or settles on `CLOCK_MONOTONIC` without an invariant TSC).
    pub(crate) fn start() -> LazyClock {
        if !invariant_tsc() {
            return LazyClock {
                mult: AtomicU64::new(0),
                start: (0, 0),
            };
        }
        LazyClock {
            mult: AtomicU64::new(PENDING),
            start: sample(),
        }
    }

    /// A timestamp in this clock's ticks (TSC ticks from the start if there is an invariant TSC).
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        // Relaxed: see the field.
        if self.mult.load(Ordering::Relaxed) != 0 {
            tsc()
        } else {
            monotonic_ns()
        }
    }

    /// The calibrated clock, finishing the calibration if it is still open.
    #[inline(always)]
    pub(crate) fn get(&self) -> Clock {
        // Relaxed: see the field.
        match self.mult.load(Ordering::Relaxed) {
            PENDING => self.finish(),
            tsc_mult => Clock { tsc_mult },
        }
    }

    /// Whether the calibration is still open.
    #[cfg(test)]
    pub(crate) fn is_pending(&self) -> bool {
        self.mult.load(Ordering::Relaxed) == PENDING
    }

    /// Closes the calibration: waits for what is left of the shortest window (only if the first
    /// conversion comes within 100 us of the start), then keeps the first factor stored. A
    /// calibration that looks wrong falls back to `CLOCK_MONOTONIC`; a call timed across that
    /// switch has one meaningless latency (saturated at 0 or huge), nothing worse.
    #[cold]
    #[inline(never)]
    fn finish(&self) -> Clock {
        let (ns0, c0) = self.start;
        while monotonic_ns().saturating_sub(ns0) < CALIBRATION.as_nanos() as u64 {
            std::hint::spin_loop();
        }
        let (ns1, c1) = sample();
        let clock = Clock::from_sample(u128::from(ns1 - ns0), c1.wrapping_sub(c0));
        // Relaxed: see the field; on failure another thread's factor is used.
        match self.mult.compare_exchange(
            PENDING,
            clock.tsc_mult,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => clock,
            Err(tsc_mult) => Clock { tsc_mult },
        }
    }
}

/// One calibration sample, (`CLOCK_MONOTONIC` ns, TSC ticks): the monotonic read between two
/// TSC reads close together (retried a few times; the last one is taken whatever its spread).
fn sample() -> (u64, u64) {
    let mut best = (0, 0);
    for _ in 0..4 {
        let a = tsc();
        let ns = monotonic_ns();
        let b = tsc();
        best = (ns, a / 2 + b / 2);
        if b.wrapping_sub(a) <= SAMPLE_SPREAD_TICKS {
            break;
        }
    }
    best
}

impl Clock {
    /// `CLOCK_MONOTONIC` in nanoseconds.
    pub(crate) const MONOTONIC: Clock = Clock { tsc_mult: 0 };

    /// The cheapest trustworthy clock of this machine, calibrated for 100 us from now.
    #[cfg(test)]
    pub(crate) fn calibrate() -> Clock {
        LazyClock::start().get()
    }

    /// The clock for a calibration sample of `ticks` TSC ticks in `ns` nanoseconds; falls back to
    /// `CLOCK_MONOTONIC` for a frequency outside 100 MHz..=20 GHz (a virtualised or broken TSC).
    pub(crate) fn from_sample(ns: u128, ticks: u64) -> Clock {
        if ticks == 0 {
            return Clock::MONOTONIC;
        }
        let mult = (ns << 32) / u128::from(ticks);
        // 20 GHz = 0.05 ns per tick; 100 MHz = 10 ns per tick.
        if (((1u128 << 32) / 20)..=(10u128 << 32)).contains(&mult) {
            Clock {
                tsc_mult: mult as u64,
            }
        } else {
            Clock::MONOTONIC
        }
    }

    /// Whether reads are TSC ticks.
    #[cfg(test)]
    pub(crate) fn is_tsc(self) -> bool {
        self.tsc_mult != 0
    }

    /// A timestamp in this clock's ticks.
    #[inline(always)]
    pub(crate) fn now(self) -> u64 {
        if self.tsc_mult != 0 {
            tsc()
        } else {
            monotonic_ns()
        }
    }

    /// About `ns` nanoseconds in this clock's ticks.
    pub(crate) fn ticks(self, ns: u64) -> u64 {
        if self.tsc_mult != 0 {
            ((u128::from(ns) << 32) / u128::from(self.tsc_mult)) as u64
        } else {
            ns
        }
    }

    /// Nanoseconds between two timestamps (0 if the second is earlier).
    #[inline(always)]
    pub(crate) fn ns_between(self, t0: u64, t1: u64) -> u64 {
        let d = t1.saturating_sub(t0);
        if self.tsc_mult != 0 {
            ((u128::from(d) * u128::from(self.tsc_mult)) >> 32) as u64
        } else {
            d
        }
    }
}

/// CPU time of the calling thread, ns (a system call: for start-up figures, not hot paths). It
/// tells time spent working from time spent waiting (descheduled, or for another process).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Out of line: on machines with an invariant TSC (the common case) it is never called, and
/// its code stays out of the hooks' hot lines.
#[cold]
#[inline(never)]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64 (it only reads the time-stamp counter).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn tsc() -> u64 {
    monotonic_ns()
}

/// Whether the TSC ticks at a constant rate through frequency changes and sleep states: the
/// invariant TSC bit, CPUID leaf 0x80000007 EDX bit 8 (from which Linux derives `constant_tsc` and
/// `nonstop_tsc`).
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 0x80000000 reports the highest extended leaf, so 0x80000007 is read only where it
    // exists.
    __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn samples_outside_plausible_frequencies_fall_back() {
        assert!(!Clock::from_sample(1000, 0).is_tsc());
        assert!(!Clock::from_sample(1000, 1_000_000).is_tsc()); // 1 THz
        assert!(!Clock::from_sample(1_000_000, 10).is_tsc()); // 10 Hz
        let c = Clock::from_sample(1_000_000, 3_000_000); // 3 GHz
        assert!(c.is_tsc());
        assert_eq!(c.ns_between(0, 3_000), 999); // rounded down by the fixed point
        assert_eq!(c.ns_between(10, 5), 0);
        assert!(c.ticks(1_000).abs_diff(3_000) <= 1, "{}", c.ticks(1_000));
        assert_eq!(Clock::MONOTONIC.ticks(1_000), 1_000);
    }

    #[test]
    fn a_lazy_clock_reads_before_it_converts_and_agrees_with_monotonic() {
        let lazy = LazyClock::start();
        let (t0, i0) = (lazy.now(), Instant::now());
        if invariant_tsc() {
            assert!(lazy.is_pending(), "reading must not close the calibration");
        }
        std::thread::sleep(Duration::from_millis(20));
        let (t1, d) = (lazy.now(), i0.elapsed().as_nanos() as u64);
        let clock = lazy.get();
        assert!(!lazy.is_pending());
        // The factor is kept: a second conversion uses the same one.
        assert_eq!(lazy.get().tsc_mult, clock.tsc_mult);
        let ns = clock.ns_between(t0, t1);
        assert!(ns.abs_diff(d) < d / 20, "clock {ns} ns vs Instant {d} ns");
    }

    #[test]
    fn an_early_conversion_waits_out_the_shortest_window() {
        let lazy = LazyClock::start();
        let started = Instant::now();
        let clock = lazy.get();
        if invariant_tsc() {
            assert!(started.elapsed() >= CALIBRATION, "{:?}", started.elapsed());
            assert!(clock.is_tsc());
        }
    }

    #[test]
    fn calibrated_clock_agrees_with_monotonic() {
        let c = Clock::calibrate();
        let (t0, i0) = (c.now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, d) = (c.now(), i0.elapsed().as_nanos() as u64);
        let ns = c.ns_between(t0, t1);
        // Within 5% (the reads are not simultaneous; the VM is shared).
        assert!(
            ns.abs_diff(d) < d / 20,
            "clock {ns} ns vs Instant {d} ns, tsc {}",
            c.is_tsc()
        );
    }
}
