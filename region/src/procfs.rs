//! Process identity and liveness from `/proc`: pid, start time (`/proc/<pid>/stat` field 22),
//! pid namespace, command name, and the clocks the protocol uses.
//!
//! None of this runs on the hot path: only at slot claim, initialisation and dead-slot sweeps.

use std::os::unix::fs::MetadataExt;

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
            start_time: read_stat(pid).map(|s| s.start_time).unwrap_or(0),
            pid_ns: pid_namespace_inode().unwrap_or(0),
            name: own_name(),
        }
    }
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: u8,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

/// Parses the contents of a `/proc/<pid>/stat` file. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the *last* `)`.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let mut fields = after_name.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Field 3 is `state`; field 22 is 19 fields later.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

pub(crate) fn read_stat(pid: u32) -> Option<ProcStat> {
    use std::io::Read;
    // One buffer that holds any stat line (52 numeric fields and a 16-byte name), read until
    // EOF: `read_to_string` starts from 32 bytes and doubles, six `read` calls for a stat line.
    let mut buf = [0u8; 2048];
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(std::str::from_utf8(&buf[..len]).ok()?)
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
        Some(stat) if matches!(stat.state, b'Z' | b'X' | b'x') => Liveness::Dead,
        Some(stat) if expected_start != 0 && stat.start_time != expected_start => Liveness::Dead,
        Some(_) => Liveness::Alive,
    }
}

/// Inode of the caller's pid namespace (`/proc/self/ns/pid`).
pub fn pid_namespace_inode() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
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
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "1234 (evil) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000000 100 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: b'S',
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

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
