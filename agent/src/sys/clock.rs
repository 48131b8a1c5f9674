//! Kernel clocks the model's process times are counted in.

/// A clock's time in nanoseconds.
fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// CLOCK_BOOTTIME in nanoseconds (process start times count from boot).
pub fn boot_time_ns() -> u64 {
    now_ns(libc::CLOCK_BOOTTIME) as u64
}

/// CLOCK_MONOTONIC in nanoseconds (the clock of the probes' `bpf_ktime_get_ns`).
pub fn monotonic_ns() -> i128 {
    now_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> i128 {
    now_ns(libc::CLOCK_REALTIME)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/PID/stat`'s start time;
/// `None` if sysconf does not say.
pub fn ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_advances_and_ticks_are_known() {
        let a = boot_time_ns();
        let b = boot_time_ns();
        assert!(a > 0 && b >= a);
        assert!(ticks_per_second().is_some_and(|t| t > 0));
    }
}
