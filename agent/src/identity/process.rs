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

/// A small procfs file of process `dir` as text (bytes that are not UTF-8 replaced), within
/// `max` bytes; `None` if it cannot be read (the process is gone).
pub fn read_proc_text(path: &Path, max: usize) -> Option<String> {
    let (bytes, _) = tenant_fs::read_proc(path, max).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

impl ProcessFacts {
    /// Reads a process's facts from `proc` (normally `/proc`); `None` if it is gone.
    pub fn read(proc: &Path, pid: u32) -> Option<ProcessFacts> {
        let dir = proc.join(pid.to_string());
        let mut stat = [0u8; tenant_fs::MAX_STAT_BYTES];
        let stat = tenant_fs::read_stat(&dir.join("stat"), &mut stat).ok()?;
        // A process sets its own comm: any bytes, kept with those that are not UTF-8 escaped.
        let comm = escape_invalid_utf8(stat.comm);
        let start_ticks = stat.start_ticks;
        // A process chooses how long its command line is (megabytes): read what is shown.
        let cmdline = tenant_fs::read_proc(&dir.join("cmdline"), MAX_CMDLINE_BYTES)
            .map(|(b, _)| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(String::from_utf8_lossy)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let cgroup_path = read_proc_text(&dir.join("cgroup"), MAX_CGROUP_BYTES)
            .and_then(|t| tenant_fs::cgroup_v2_path(&t).map(str::to_owned));
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
    fn a_name_that_is_not_utf8_is_kept_escaped() {
        assert_eq!(escape_invalid_utf8(b"my (odd) name"), "my (odd) name");
        assert_eq!(escape_invalid_utf8(b"a\xff\xfeb"), "a\\xff\\xfeb");
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
