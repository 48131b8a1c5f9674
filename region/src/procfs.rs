//! Process identity and liveness from `/proc`: pid, start time (`/proc/<pid>/stat` field 22,
//! read by `tenant_fs::read_stat`), pid namespace (`tenant_fs::own_pid_namespace`), command name,
//! and the clocks the protocol uses.
//!
//! None of this runs on the hot path: only at slot claim, initialisation and dead-slot sweeps.

use std::path::Path;

/// Identity of the calling process as stored in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// Pid as seen in the caller's pid namespace.
    pub pid: u32,
    /// Start time in clock ticks since boot (0 if `/proc` could not be read).
    pub start_time: u64,
    /// Inode of `/proc/self/ns/pid` (0 if unknown).
    pub pid_ns: u64,
    /// `/proc/self/comm`, NUL padded.
    pub name: [u8; 16],
}

impl ProcessIdentity {
    /// The calling process.
    pub fn current() -> ProcessIdentity {
        let pid = std::process::id();
        ProcessIdentity {
            pid,
            start_time: read_stat(pid).map_or(0, |(_, start)| start),
            pid_ns: tenant_fs::own_pid_namespace().unwrap_or(0),
            name: own_name(),
        }
    }
}

/// Start time and state of process `pid` (in the caller's pid namespace), from its
/// `/proc/<pid>/stat`; `None` when it is gone.
fn read_stat(pid: u32) -> Option<(u8, u64)> {
    let mut buf = [0u8; tenant_fs::MAX_STAT_BYTES];
    let stat = tenant_fs::read_stat(Path::new(&format!("/proc/{pid}/stat")), &mut buf).ok()?;
    Some((stat.state, stat.start_ticks))
}

/// Whether a slot's or initialiser's owner still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The pid exists with the recorded start time (or none was recorded).
    Alive,
    /// The pid is gone, a zombie, or reused by another process (start time differs).
    Dead,
}

/// Liveness of `pid` in the caller's pid namespace. `expected_start == 0` means the start time is
/// not known yet, so only existence is checked.
pub(crate) fn liveness(pid: u32, expected_start: u64) -> Liveness {
    if pid == 0 {
        return Liveness::Dead;
    }
    match read_stat(pid) {
        None => Liveness::Dead,
        // Zombie (`Z`) and dead (`X`/`x`) processes run no more code.
        Some((b'Z' | b'X' | b'x', _)) => Liveness::Dead,
        Some((_, start)) if expected_start != 0 && start != expected_start => Liveness::Dead,
        Some(_) => Liveness::Alive,
    }
}

/// The calling thread's command name (`/proc/self/comm` for the main thread), NUL padded: one
/// `prctl`, not a file to open and read.
fn own_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into the buffer, which has 16.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    name
}

/// Kernel thread id of the calling thread.
pub(crate) fn current_tid() -> u64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u64
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids used here always exist on Linux.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_BOOTTIME` in milliseconds (shared by every process of the machine, counts suspend).
pub(crate) fn boottime_ms() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME) / 1_000_000
}

/// `CLOCK_REALTIME` in nanoseconds, for display.
pub(crate) fn unix_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_dead() {
        let me = ProcessIdentity::current();
        assert!(me.start_time > 0);
        assert_eq!(liveness(me.pid, me.start_time), Liveness::Alive);
        assert_eq!(liveness(me.pid, 0), Liveness::Alive);
        assert_eq!(
            liveness(me.pid, me.start_time + 1),
            Liveness::Dead,
            "pid reuse"
        );
        assert_eq!(liveness(0, 0), Liveness::Dead);
    }

    #[test]
    fn a_reaped_child_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(liveness(pid, 0), Liveness::Dead);
    }
}
