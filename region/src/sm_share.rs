//! The container's SM share per device (layout 3.1): the duty cycle that every process of the
//! container draws its GPU time from, and the NVML correction of it. Layout in
//! [`crate::layout::SmShareOf`]; the protocol is documented in docs/region.md ("SM shares").
//!
//! Every step is one 64-bit atomic operation on one word and nothing is ever locked or waited
//! for, so a process killed at any point leaves nothing another process must finish:
//!
//! - `window_start` and `resume_at` only grow (compare-and-swap to the larger value), so the
//!   closes of several processes agree on the latest resume whatever their order, and a window
//!   is never reopened into the past.
//! - A close that moves `resume_at` past the window's start is the window's first close: it alone
//!   counts in `closes` and records the window in `closed_start`.
//! - The duty cycle (`duty`) is written only by compare-and-swap from the value its writer read,
//!   by the process that holds the lease (`feedback_lease`), which lapses when not renewed for
//!   [`LEASE_MS`]: a dead holder's lease is taken over, never stuck.
//!
//! The words hold times and counts, not pointers to other data: Relaxed is enough for all of them
//! (each word is coherent on its own; nothing else is published through them).

use std::sync::atomic::Ordering::Relaxed;

use crate::layout::SmShareOf;
use crate::sync::Atomic64;

/// Where a close stops (a killed process, in the loom models).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Never,
    /// After raising `resume_at`, before recording the close.
    #[cfg_attr(not(loom), allow(dead_code))]
    AfterResume,
}

/// A lease not renewed for this long (CLOCK_BOOTTIME ms) may be taken over.
pub const LEASE_MS: u64 = 2_000;

/// What a launch reads of a device's duty cycle (CLOCK_MONOTONIC ns; 0 = never set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowView {
    /// Start of the active window set by the last opening (a gap in launches, or the first).
    pub start: u64,
    /// A recent launch.
    pub last: u64,
    /// Launches wait until then; the next window starts then.
    pub resume: u64,
    /// Start of the window last closed.
    pub closed: u64,
}

/// `duty`'s word for `target` percent and `permille`.
pub const fn duty_word(target: u8, permille: u16) -> u64 {
    (target as u64) << 16 | permille as u64
}

/// `(target percent, per mille)` of a `duty` word; `None` for 0 (not set).
pub const fn decode_duty(word: u64) -> Option<(u8, u16)> {
    if word == 0 {
        None
    } else {
        Some(((word >> 16) as u8, word as u16))
    }
}

/// A container's QoS state on one device, as the lease holder publishes it in `qos`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QosState {
    /// `limiter_core::qos::Tier::encode`'s byte (1 latency, 2 guaranteed, 3 best effort).
    pub tier: u8,
    /// Per mille.
    pub guarantee_pm: u16,
    /// What the container is allocated now, per mille (0: not yet).
    pub allocated_pm: u16,
    /// Its allocation held it back over the last tick.
    pub held: bool,
    /// Guaranteed: it wanted its guarantee and got less (guarantees that do not fit).
    pub short: bool,
    /// It runs at its ceiling and takes what the others' allocations leave
    /// (`limiter_core::qos::runs_free`).
    pub free: bool,
}

/// `qos`'s word for `state`; 0 for no tier.
pub const fn qos_word(state: QosState) -> u64 {
    if state.tier == 0 {
        return 0;
    }
    state.allocated_pm as u64
        | (state.guarantee_pm as u64) << 16
        | (state.tier as u64) << 32
        | (state.held as u64) << 40
        | (state.short as u64) << 41
        | (state.free as u64) << 42
}

/// The state in a `qos` word; `None` for 0 (no tier).
pub const fn decode_qos(word: u64) -> Option<QosState> {
    if word == 0 {
        return None;
    }
    Some(QosState {
        tier: (word >> 32) as u8,
        guarantee_pm: (word >> 16) as u16,
        allocated_pm: word as u16,
        held: word >> 40 & 1 == 1,
        short: word >> 41 & 1 == 1,
        free: word >> 42 & 1 == 1,
    })
}

fn lease_word(holder: u32, now_ms: u64) -> u64 {
    u64::from(holder) << 32 | (now_ms & 0xFFFF_FFFF)
}

/// Raises `word` to at least `value`; returns what it held before.
fn raise<A: Atomic64>(word: &A, value: u64) -> u64 {
    let mut cur = word.load(Relaxed);
    while cur < value {
        match word.compare_exchange(cur, value, Relaxed, Relaxed) {
            Ok(_) => return cur,
            Err(seen) => cur = seen,
        }
    }
    cur
}

fn add_one<A: Atomic64>(word: &A) {
    let mut cur = word.load(Relaxed);
    while let Err(seen) = word.compare_exchange(cur, cur.wrapping_add(1), Relaxed, Relaxed) {
        cur = seen;
    }
}

// The bound is crate-private on purpose (a sealed trait): production code sees only the std
// atomics of `SmShare`; the loom models instantiate the same code with loom's.
#[allow(private_bounds)]
impl<A: Atomic64> SmShareOf<A> {
    /// The window's words as a launch at `now` reads them.
    #[inline]
    pub fn view(&self) -> WindowView {
        WindowView {
            start: self.window_start.load(Relaxed),
            last: self.last_launch.load(Relaxed),
            resume: self.resume_at.load(Relaxed),
            closed: self.closed_start.load(Relaxed),
        }
    }

    /// Opens a window at `now` (the first launch, or one after a gap longer than a period).
    pub fn open(&self, now: u64) {
        raise(&self.window_start, now);
        self.last_launch.store(now, Relaxed);
    }

    /// Notes a launch at `now` (callers refresh it at most every millisecond).
    #[inline]
    pub fn touch(&self, now: u64) {
        self.last_launch.store(now, Relaxed);
    }

    /// Closes the window that started at `start`: launches wait until at least `resume`. Returns
    /// whether this was the window's first close (counted in `closes`).
    pub fn close(&self, start: u64, resume: u64) -> bool {
        self.close_until(start, resume, Stop::Never)
    }

    /// [`Self::close`], stopping where `stop` says (a process killed there, in the loom models).
    pub(crate) fn close_until(&self, start: u64, resume: u64, stop: Stop) -> bool {
        let before = raise(&self.resume_at, resume);
        let first = before <= start && resume > start;
        if first && stop == Stop::Never {
            raise(&self.closed_start, start);
            add_one(&self.closes);
        }
        first
    }

    /// Windows closed so far.
    #[inline]
    pub fn closes(&self) -> u64 {
        self.closes.load(Relaxed)
    }

    /// Forgets a window whose times cannot be believed (further in the future than any hold: a
    /// file from another boot, or corrupt words). Each word is replaced only if it still holds
    /// what `seen` read, so a concurrent launch's newer value is kept.
    pub fn repair(&self, seen: WindowView) {
        for (word, value) in [
            (&self.window_start, seen.start),
            (&self.resume_at, seen.resume),
            (&self.last_launch, seen.last),
            (&self.closed_start, seen.closed),
        ] {
            let _ = word.compare_exchange(value, 0, Relaxed, Relaxed);
        }
    }

    /// The raw duty-cycle word (see [`duty_word`]).
    #[inline]
    pub fn duty(&self) -> u64 {
        self.duty.load(Relaxed)
    }

    /// Replaces the duty-cycle word if it still holds `seen`.
    pub fn set_duty(&self, seen: u64, word: u64) -> bool {
        self.duty
            .compare_exchange(seen, word, Relaxed, Relaxed)
            .is_ok()
    }

    /// Takes or renews the correction's lease for `holder` (a pid, non-zero) at `now_ms`
    /// (CLOCK_BOOTTIME): renewed if `holder` has it, taken if nobody has renewed it for
    /// [`LEASE_MS`] (32-bit milliseconds, compared wrapping). Whether `holder` has it now.
    pub fn hold_lease(&self, holder: u32, now_ms: u64) -> bool {
        let cur = self.feedback_lease.load(Relaxed);
        let (owner, at) = ((cur >> 32) as u32, cur & 0xFFFF_FFFF);
        let lapsed = (now_ms & 0xFFFF_FFFF).wrapping_sub(at) & 0xFFFF_FFFF > LEASE_MS;
        if cur != 0 && owner != holder && !lapsed {
            return false;
        }
        self.feedback_lease
            .compare_exchange(cur, lease_word(holder, now_ms), Relaxed, Relaxed)
            .is_ok()
    }

    /// The container's QoS word (see [`qos_word`]; 0: no tier).
    #[inline]
    pub fn qos(&self) -> u64 {
        self.qos.load(Relaxed)
    }

    /// Publishes the container's QoS word (by the lease holder; every process applies it).
    pub fn set_qos(&self, word: u64) {
        self.qos.store(word, Relaxed);
    }

    /// The pid holding the correction's lease (0: none), whatever its age.
    pub fn lease_holder(&self) -> u32 {
        (self.feedback_lease.load(Relaxed) >> 32) as u32
    }

    /// Zeroes every word (an initialiser's reset).
    pub(crate) fn reset(&self) {
        for w in [
            &self.window_start,
            &self.last_launch,
            &self.resume_at,
            &self.closed_start,
            &self.closes,
            &self.duty,
            &self.feedback_lease,
            &self.qos,
        ] {
            w.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::SmShare;

    #[test]
    fn closes_keep_the_latest_resume_and_count_once() {
        let s = SmShare::new();
        s.open(100);
        assert_eq!(s.view().start, 100);
        // A late opener cannot move the window into the past.
        s.open(90);
        assert_eq!(s.view().start, 100);
        assert!(s.close(100, 500));
        assert!(!s.close(100, 400), "an earlier resume changes nothing");
        assert!(!s.close(100, 600), "a later one extends, not a new close");
        let v = s.view();
        assert_eq!((v.resume, v.closed), (600, 100));
        assert_eq!(s.closes(), 1);
        // The next window (starting at the resume) closes once more.
        assert!(s.close(600, 900));
        assert_eq!((s.view().closed, s.closes()), (600, 2));
    }

    #[test]
    fn repair_forgets_only_what_it_saw() {
        let s = SmShare::new();
        s.open(1 << 62);
        assert!(s.close(1 << 62, 1 << 63));
        let seen = s.view();
        s.touch(5);
        s.repair(seen);
        let v = s.view();
        assert_eq!((v.start, v.resume, v.closed, v.last), (0, 0, 0, 5));
    }

    #[test]
    fn the_lease_is_renewed_by_its_holder_and_taken_when_it_lapses() {
        let s = SmShare::new();
        assert!(s.hold_lease(7, 1_000));
        assert!(!s.hold_lease(8, 1_000 + LEASE_MS), "still fresh");
        assert!(s.hold_lease(7, 1_000 + LEASE_MS), "renewed");
        assert!(
            s.hold_lease(8, 1_001 + 2 * LEASE_MS + 1),
            "lapsed: taken over"
        );
        assert_eq!(s.lease_holder(), 8);
        assert!(
            !s.hold_lease(7, 1_001 + 2 * LEASE_MS + 2),
            "the old holder lost it"
        );
        // A lease stamped in the future (another boot's clock) has lapsed.
        let t = SmShare::new();
        assert!(t.hold_lease(1, 5_000_000));
        assert!(t.hold_lease(2, 10));
        // 32-bit milliseconds compare wrapping.
        let u = SmShare::new();
        assert!(u.hold_lease(1, 0xFFFF_FF00));
        assert!(
            !u.hold_lease(2, 0x1_0000_0100),
            "0x200 ms later across the wrap"
        );
    }

    #[test]
    fn duty_words_round_trip() {
        assert_eq!(decode_duty(duty_word(40, 555)), Some((40, 555)));
        assert_eq!(decode_duty(0), None);
        let s = SmShare::new();
        assert!(s.set_duty(0, duty_word(40, 400)));
        assert!(!s.set_duty(0, duty_word(40, 500)), "from a stale value");
        assert_eq!(decode_duty(s.duty()), Some((40, 400)));
    }

    #[test]
    fn qos_words_round_trip() {
        let q = QosState {
            tier: 2,
            guarantee_pm: 300,
            allocated_pm: 850,
            held: true,
            short: false,
            free: true,
        };
        assert_eq!(decode_qos(qos_word(q)), Some(q));
        assert_eq!(qos_word(QosState::default()), 0);
        assert_eq!(decode_qos(0), None);
        let s = SmShare::new();
        s.set_qos(qos_word(q));
        assert_eq!(decode_qos(s.qos()), Some(q));
    }
}
