//! Waiting for device memory (`VGPU_OOM_WAIT`): when the GPU has no physical room for an
//! allocation that the container's limit allows, an opted-in tenant retries it until memory frees
//! or the wait's timeout passes, instead of failing at once.
//!
//! [`OomWait`] is the schedule, in the caller's nanoseconds (tests drive it with virtual time):
//! after each failed attempt it says how long to sleep before the next, doubling from
//! [`FIRST_SLEEP_NS`] to [`MAX_SLEEP_NS`] (memory that frees is found within a few ms; a long wait
//! costs a few wake-ups a second), and never past the deadline; once the deadline has passed it
//! says stop. The caller holds no lock while it sleeps: the allocation's reservation under the
//! limit is the tenant's own, and nothing else is held.

use std::time::Duration;

use crate::config::Level;

/// The first sleep after a failed attempt.
pub const FIRST_SLEEP_NS: u64 = 1_000_000;
/// The longest sleep between two attempts.
pub const MAX_SLEEP_NS: u64 = 64_000_000;

/// One allocation's wait: see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomWait {
    deadline_ns: u64,
    next_sleep_ns: u64,
}

impl OomWait {
    /// A wait of `timeout` that starts at `now_ns` (the first attempt's failure).
    pub fn start(now_ns: u64, timeout: Duration) -> OomWait {
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        OomWait {
            deadline_ns: now_ns.saturating_add(timeout_ns),
            next_sleep_ns: FIRST_SLEEP_NS,
        }
    }

    /// After a failed attempt at `now_ns`: how long to sleep before the next attempt (ns), or
    /// `None` when the deadline has passed and the allocation fails. The last sleep ends at the
    /// deadline, so a final attempt is made there.
    pub fn after_failure(&mut self, now_ns: u64) -> Option<u64> {
        let left = self.deadline_ns.checked_sub(now_ns).filter(|l| *l > 0)?;
        let sleep = self.next_sleep_ns.min(left);
        self.next_sleep_ns = (self.next_sleep_ns * 2).min(MAX_SLEEP_NS);
        Some(sleep)
    }
}

/// The level at which an allocation that the limit allows and the GPU has no room for is
/// reported: information where the limits are known to add up to more than the GPU
/// (`CUDA_OVERSUBSCRIBE=true`: expected), a warning elsewhere (limits that fit the GPU, so memory
/// is held outside them: a process without the limiter, or another container's larger limit).
pub fn physical_oom_level(oversubscribe: bool) -> Level {
    if oversubscribe {
        Level::Info
    } else {
        Level::Warn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_the_gpu_is_expected_only_when_oversubscribed() {
        assert_eq!(physical_oom_level(true), Level::Info);
        assert_eq!(physical_oom_level(false), Level::Warn);
    }

    /// Runs a wait in virtual time: attempts fail until `frees_at_ns` (never if `None`); each
    /// attempt itself takes `attempt_ns`. Returns (succeeded, attempts, time spent).
    fn simulate(timeout: Duration, frees_at_ns: Option<u64>, attempt_ns: u64) -> (bool, u32, u64) {
        let start = 1_000;
        let mut now = start + attempt_ns;
        let mut wait = OomWait::start(now, timeout);
        let mut attempts = 1;
        loop {
            let Some(sleep) = wait.after_failure(now) else {
                return (false, attempts, now - start);
            };
            now += sleep + attempt_ns;
            attempts += 1;
            if frees_at_ns.is_some_and(|t| now - attempt_ns >= start + t) {
                return (true, attempts, now - start);
            }
        }
    }

    #[test]
    fn memory_that_frees_is_found_soon_after() {
        // Freed 10 ms in: found within one sleep (at most doubled to 16 ms), far under the
        // timeout.
        let (ok, attempts, spent) = simulate(Duration::from_secs(5), Some(10_000_000), 0);
        assert!(ok);
        assert!(
            (10_000_000..10_000_000 + 16_000_000).contains(&spent),
            "{spent}"
        );
        assert!(attempts <= 6, "{attempts}");
    }

    #[test]
    fn a_wait_ends_at_its_deadline_with_a_last_attempt_there() {
        let timeout = Duration::from_millis(300);
        let (ok, attempts, spent) = simulate(timeout, None, 0);
        assert!(!ok);
        assert_eq!(spent, 300_000_000, "the last sleep ends at the deadline");
        // 1, 2, 4, 8, 16, 32, 64, 64, 64 ms (255 ms) then 45 ms: 10 sleeps, 11 attempts.
        assert_eq!(attempts, 11);
        // Attempts that take time themselves do not stretch the wait past the deadline by more
        // than one attempt.
        let (ok, _, spent) = simulate(timeout, None, 5_000_000);
        assert!(!ok);
        assert!(spent <= 300_000_000 + 2 * 5_000_000, "{spent}");
    }

    #[test]
    fn sleeps_double_up_to_the_cap() {
        let mut w = OomWait::start(0, Duration::from_secs(60));
        let sleeps: Vec<u64> = (0..9).map(|_| w.after_failure(0).unwrap()).collect();
        assert_eq!(
            sleeps,
            [1, 2, 4, 8, 16, 32, 64, 64, 64].map(|ms| ms * 1_000_000)
        );
    }

    #[test]
    fn a_passed_or_empty_deadline_stops_at_once() {
        assert_eq!(OomWait::start(5, Duration::ZERO).after_failure(5), None);
        let mut w = OomWait::start(0, Duration::from_millis(1));
        assert_eq!(w.after_failure(2_000_000), None);
        // A timeout too long for the clock saturates instead of wrapping.
        let mut w = OomWait::start(u64::MAX - 10, Duration::from_secs(1));
        assert_eq!(w.after_failure(u64::MAX - 10), Some(10));
    }
}
