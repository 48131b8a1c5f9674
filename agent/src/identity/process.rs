//! Facts about a process read from procfs.

use std::path::Path;

/// What identifies and names a process. `(pid, start_ticks)` is unique for the life of the boot:
/// the kernel reuses pids, never a pid with the same start time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProcessFacts {
    pub pid: u32,
    /// Start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_ticks: u64,
    /// The command name (`comm`).
    pub comm: String,
    /// The command line, arguments joined by spaces.
    pub cmdline: String,
    /// The cgroup v2 path (from `/proc/<pid>/cgroup`).
    pub cgroup_path: Option<String>,
}

/// Bytes of `/proc/<pid>/cmdline` read.
const MAX_CMDLINE_BYTES: usize = 64 << 10;

/// Bytes of `/proc/<pid>/stat` read (a line of 52 numbers and a comm of 16 bytes at most).
const MAX_STAT_BYTES: usize = 4 << 10;

/// Bytes of `/proc/<pid>/cgroup` read (one line per hierarchy; a cgroup v2 path is at most a few
/// KiB, and a tenant can nest its own cgroups).
pub const MAX_CGROUP_BYTES: usize = 64 << 10;

/// `bytes` as text: valid UTF-8 as is, every byte that is not part of valid UTF-8 written as
/// `\xNN`, so a name a process chose (a comm is any 15 bytes) is shown, never lost.
pub fn escape_invalid_utf8(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Parses `comm` and the start time out of a `/proc/<pid>/stat` line. The comm is in parentheses
/// and may itself contain spaces, parentheses and bytes that are not UTF-8 (a process sets its
/// own), so fields are counted from the last `)` and the comm is kept as escaped bytes.
pub fn parse_stat(stat: &[u8]) -> Option<(String, u64)> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let comm = escape_invalid_utf8(stat.get(open + 1..close)?);
    // After ") " come fields 3.. ; start time is field 22, i.e. index 19 of the rest.
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let start = rest.split(' ').nth(19)?.parse().ok()?;
    Some((comm, start))
}

/// A small procfs file of process `dir` as text (bytes that are not UTF-8 replaced), within
/// `max` bytes; `None` if it cannot be read (the process is gone).
pub fn read_proc_text(path: &Path, max: usize) -> Option<String> {
    let (bytes, _) = region::tenant_fs::read_proc(path, max).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

impl ProcessFacts {
    /// Reads a process's facts from `proc` (normally `/proc`); `None` if it is gone.
    pub fn read(proc: &Path, pid: u32) -> Option<ProcessFacts> {
        let dir = proc.join(pid.to_string());
        let (stat, _) = region::tenant_fs::read_proc(&dir.join("stat"), MAX_STAT_BYTES).ok()?;
        let (comm, start_ticks) = parse_stat(&stat)?;
        // A process chooses how long its command line is (megabytes): read what is shown.
        let cmdline = region::tenant_fs::read_proc(&dir.join("cmdline"), MAX_CMDLINE_BYTES)
            .map(|(b, _)| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(String::from_utf8_lossy)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let cgroup_path = read_proc_text(&dir.join("cgroup"), MAX_CGROUP_BYTES)
            .and_then(|t| super::cgroup::v2_path_of(&t));
        Some(ProcessFacts {
            pid,
            start_ticks,
            comm,
            cmdline,
            cgroup_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_comm() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(line.as_bytes()),
            Some(("my (odd) name".into(), 987654))
        );
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S"), None);
        let odd =
            b"4242 (a\xff\xfeb) S 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000";
        assert_eq!(
            parse_stat(odd),
            Some(("a\\xff\\xfeb".into(), 987654)),
            "a comm that is not UTF-8 is kept, escaped"
        );
    }

    #[test]
    fn reads_this_process() {
        let me = ProcessFacts::read(Path::new("/proc"), std::process::id()).unwrap();
        assert!(me.start_ticks > 0);
        assert!(!me.comm.is_empty());
        assert_eq!(ProcessFacts::read(Path::new("/proc"), u32::MAX), None);
    }

    /// A process with a 1 MB command line costs the reader 64 KiB.
    #[test]
    fn a_huge_command_line_is_read_within_its_bound() {
        // Ten arguments of 100 KiB (one argument may be at most 128 KiB).
        let long = "x".repeat(100 << 10);
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30"])
            .args(std::iter::repeat_n(&long, 10))
            .spawn()
            .unwrap();
        // Until the child has called exec, its command line is the test binary's.
        let read = || ProcessFacts::read(Path::new("/proc"), child.id()).unwrap();
        let started = std::time::Instant::now();
        let mut facts = read();
        while !facts.cmdline.starts_with("sh ")
            && started.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
            facts = read();
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            facts.cmdline.starts_with("sh -c sleep 30 xxx"),
            "{}",
            facts.cmdline.chars().take(40).collect::<String>()
        );
        assert!(
            facts.cmdline.len() <= MAX_CMDLINE_BYTES,
            "{}",
            facts.cmdline.len()
        );
    }
}
