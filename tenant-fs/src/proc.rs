//! Bounded reads of kernel-generated files about a tenant's processes (`/proc/<pid>/maps`,
//! `cgroup`, `cmdline`, `stat`, `status`): the kernel writes them, but a process decides how long
//! they get and what its name and paths in them are. And the one parser of each of them.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::error::TenantFsError;

/// How much of a `/proc` file was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcRead {
    /// Bytes read.
    pub bytes: u64,
    /// The file had more than the bound: the rest was not read.
    pub truncated: bool,
    /// Lines longer than the line bound (skipped).
    pub long_lines: u64,
}

/// Reads a kernel-generated file (`/proc/<pid>/maps`, `cgroup`, ...) line by line, at most
/// `max_bytes` in all and `max_line` per line (a longer line is skipped and counted). The kernel
/// writes these files, but a process decides how long they get (mappings, path names).
pub fn read_proc_lines(
    path: &Path,
    max_bytes: u64,
    max_line: usize,
    mut each: impl FnMut(&[u8]),
) -> Result<ProcRead, TenantFsError> {
    let file = File::open(path).map_err(|e| TenantFsError::io("open", path, e))?;
    let mut reader = io::BufReader::with_capacity(64 << 10, file.take(max_bytes + 1));
    let mut out = ProcRead {
        bytes: 0,
        truncated: false,
        long_lines: 0,
    };
    let mut line = Vec::with_capacity(512);
    loop {
        line.clear();
        // Bounded per line: read_until into a buffer that stops growing at `max_line`.
        let mut too_long = false;
        let mut ended = false;
        loop {
            let chunk = match io::BufRead::fill_buf(&mut reader) {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(TenantFsError::io("read", path, e)),
            };
            if chunk.is_empty() {
                ended = true;
                break;
            }
            let (take, newline) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !too_long {
                if line.len() + take > max_line + 1 {
                    too_long = true;
                    line.clear();
                } else {
                    line.extend_from_slice(&chunk[..take]);
                }
            }
            out.bytes += take as u64;
            io::BufRead::consume(&mut reader, take);
            if newline {
                break;
            }
        }
        if out.bytes > max_bytes {
            out.truncated = true;
            out.bytes = max_bytes;
            return Ok(out);
        }
        if too_long {
            out.long_lines += 1;
        } else if !line.is_empty() {
            let l = line.strip_suffix(b"\n").unwrap_or(&line);
            each(l);
        }
        if ended {
            return Ok(out);
        }
    }
}

/// A small kernel-generated file (`/proc/<pid>/cgroup`, `comm`, ...), at most `max` bytes: the
/// first `max` bytes and whether there was more.
pub fn read_proc(path: &Path, max: usize) -> Result<(Vec<u8>, bool), TenantFsError> {
    let file = File::open(path).map_err(|e| TenantFsError::io("open", path, e))?;
    let mut buf = Vec::with_capacity(max.min(64 << 10) + 1);
    file.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| TenantFsError::io("read", path, e))?;
    let more = buf.len() > max;
    buf.truncate(max);
    Ok((buf, more))
}

/// Bytes of a `/proc/<pid>/stat` line read at most: 52 numeric fields of at most 20 digits each
/// and a command name of at most 64 bytes (a kernel worker's) take about 1.2 KiB.
pub const MAX_STAT_BYTES: usize = 2048;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat<'a> {
    /// Field 2, without its parentheses: the command name, any bytes the process chose.
    pub comm: &'a [u8],
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: u8,
    /// Field 22: start time in clock ticks after boot. `(pid, start_ticks)` is unique for the
    /// life of the boot: the kernel reuses pids, never a pid with the same start time.
    pub start_ticks: u64,
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) may contain spaces, parentheses
/// and bytes that are not UTF-8 (a process sets its own), so it runs from the first `(` to the
/// *last* `)`, and the fields after it are counted from there.
pub fn parse_stat(stat: &[u8]) -> Option<ProcStat<'_>> {
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let comm = stat.get(open + 1..close)?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Field 3 is `state`; field 22 is 19 fields later.
    let start_ticks = fields.nth(18)?.parse().ok()?;
    Some(ProcStat {
        comm,
        state,
        start_ticks,
    })
}

/// Reads and parses a `stat` file (`/proc/<pid>/stat`) into `buf`, with no allocation: it runs
/// when a limiter claims a slot and when it checks whether a slot's owner still runs.
pub fn read_stat<'b>(
    path: &Path,
    buf: &'b mut [u8; MAX_STAT_BYTES],
) -> Result<ProcStat<'b>, TenantFsError> {
    let mut file = File::open(path).map_err(|e| TenantFsError::io("open", path, e))?;
    // Read until EOF: a stat line comes in one `read`, but nothing promises it.
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TenantFsError::io("read", path, e)),
        }
    }
    parse_stat(&buf[..len]).ok_or_else(|| TenantFsError::Malformed {
        path: path.to_owned(),
    })
}

/// The last value of the `NSpid:` line of a `/proc/<pid>/status` text: the pid inside the
/// innermost pid namespace. The text is bytes: its `Name:` line is the process's own.
pub fn innermost_pid(status: &[u8]) -> Option<u32> {
    status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"NSpid:"))
        .and_then(|v| {
            std::str::from_utf8(v)
                .ok()?
                .split_whitespace()
                .last()?
                .parse()
                .ok()
        })
}

/// `pid:[4026531836]` -> 4026531836.
fn namespace_inode(link: &[u8]) -> Option<u64> {
    std::str::from_utf8(link.strip_prefix(b"pid:[")?.strip_suffix(b"]")?)
        .ok()?
        .parse()
        .ok()
}

/// The inode of the pid namespace of the process whose `/proc` directory is `pid_dir`
/// (`/proc/<pid>`, or `/proc/self` for the caller's own), from its `ns/pid` link. `None` when
/// the process is gone or the link is not a pid namespace's.
pub fn pid_namespace(pid_dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let link = std::fs::read_link(pid_dir.join("ns/pid")).ok()?;
    namespace_inode(link.as_os_str().as_bytes())
}

/// The inode of the caller's own pid namespace (`/proc/self/ns/pid`).
pub fn own_pid_namespace() -> Option<u64> {
    pid_namespace(Path::new("/proc/self"))
}

/// The cgroup v2 path of a process from its `/proc/<pid>/cgroup` text (the `0::` line).
pub fn cgroup_v2_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = b"4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 \
                     987654 1000 10 18446744073709551615\n";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                comm: b"my (odd) name",
                state: b'S',
                start_ticks: 987654
            })
        );
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S"), None);
        assert_eq!(parse_stat(b"1 (x) S 1 2"), None);
        assert_eq!(parse_stat(b") 1 (x"), None, "a `)` before the `(`");
    }

    #[test]
    fn a_comm_that_is_not_utf8_is_kept_as_bytes() {
        let odd =
            b"4242 (a\xff\xfeb) Z 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000";
        let stat = parse_stat(odd).unwrap();
        assert_eq!(stat.comm, b"a\xff\xfeb");
        assert_eq!((stat.state, stat.start_ticks), (b'Z', 987654));
    }

    #[test]
    fn reads_this_process_stat_and_refuses_what_is_not_a_stat_line() {
        let mut buf = [0u8; MAX_STAT_BYTES];
        let me = read_stat(Path::new("/proc/thread-self/stat"), &mut buf).unwrap();
        assert!(me.start_ticks > 0);
        assert_eq!(me.state, b'R', "the reading thread runs");
        let mut buf = [0u8; MAX_STAT_BYTES];
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("stat");
        std::fs::write(&garbage, b"1 (x) S 1 2\n").unwrap();
        let err = read_stat(&garbage, &mut buf).unwrap_err();
        assert!(matches!(err, TenantFsError::Malformed { .. }), "{err}");
        let mut buf = [0u8; MAX_STAT_BYTES];
        let err = read_stat(Path::new("/proc/0/stat"), &mut buf).unwrap_err();
        assert!(matches!(err, TenantFsError::NotFound { .. }), "{err}");
    }

    #[test]
    fn reads_namespace_coordinates() {
        assert_eq!(innermost_pid(b"Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(innermost_pid(b"NSpid:\t4242\n"), Some(4242));
        assert_eq!(innermost_pid(b"Name:\t\xff\xfe\nNSpid:\t9\n"), Some(9));
        assert_eq!(innermost_pid(b"Name: x\n"), None);
        assert_eq!(namespace_inode(b"pid:[4026531836]"), Some(4026531836));
        assert_eq!(namespace_inode(b"net:[1]"), None);
        assert_eq!(namespace_inode(b"pid:[x]"), None);
    }

    #[test]
    fn this_process_pid_namespace_is_the_one_its_link_names() {
        use std::os::unix::fs::MetadataExt;
        let ns = pid_namespace(Path::new("/proc/self")).unwrap();
        // `stat` follows the link to the namespace's own inode.
        assert_eq!(ns, std::fs::metadata("/proc/self/ns/pid").unwrap().ino());
        let own = format!("/proc/{}", std::process::id());
        assert_eq!(pid_namespace(Path::new(&own)), Some(ns));
        assert_eq!(pid_namespace(Path::new("/proc/0")), None);
    }

    #[test]
    fn reads_the_cgroup_v2_line() {
        let text = "12:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/system.slice/docker-abc.scope\n";
        assert_eq!(cgroup_v2_path(text), Some("/system.slice/docker-abc.scope"));
        assert_eq!(cgroup_v2_path("4:cpu:/x\n"), None);
    }

    /// A stat line as the kernel writes it, with `comm` in its parentheses.
    fn stat_line(comm: &[u8], state: u8, start: u64) -> Vec<u8> {
        let mut line = b"4242 (".to_vec();
        line.extend_from_slice(comm);
        line.extend_from_slice(b") ");
        line.push(state);
        line.extend_from_slice(b" 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 ");
        line.extend_from_slice(start.to_string().as_bytes());
        line.extend_from_slice(b" 1000 10 18446744073709551615\n");
        line
    }

    proptest! {
        /// Whatever bytes a process names itself (up to the kernel's 64), its start time and
        /// state are read right, and its name comes back as it chose it.
        #[test]
        fn any_comm_keeps_the_fields_after_it(
            comm in proptest::collection::vec(any::<u8>(), 0..64),
            state in proptest::sample::select(b"RSDZTtXxIP".to_vec()),
            start in any::<u64>(),
        ) {
            let line = stat_line(&comm, state, start);
            let stat = parse_stat(&line).unwrap();
            prop_assert_eq!(stat.start_ticks, start);
            prop_assert_eq!(stat.state, state);
            prop_assert_eq!(stat.comm, &comm[..]);
        }

        /// Arbitrary bytes never panic any parser.
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_stat(&bytes);
            let _ = innermost_pid(&bytes);
            let _ = namespace_inode(&bytes);
            let _ = crate::maps::parse_line(&bytes);
            let _ = cgroup_v2_path(&String::from_utf8_lossy(&bytes));
        }

        /// `read_proc_lines` hands over only whole lines within both bounds, and says how much
        /// it read and skipped.
        #[test]
        fn proc_lines_stay_within_their_bounds(
            lines in proptest::collection::vec(proptest::collection::vec(b'a'..=b'z', 0..80), 0..40),
            max_bytes in 0u64..2048,
            max_line in 1usize..64,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("maps");
            let mut text = Vec::new();
            for l in &lines {
                text.extend_from_slice(l);
                text.push(b'\n');
            }
            std::fs::write(&path, &text).unwrap();
            let mut seen = Vec::new();
            let read = read_proc_lines(&path, max_bytes, max_line, |l| seen.push(l.to_vec())).unwrap();
            prop_assert!(read.bytes <= max_bytes);
            prop_assert_eq!(read.truncated, text.len() as u64 > max_bytes);
            for l in &seen {
                prop_assert!(l.len() <= max_line);
            }
            // What was handed over is, in order, the short lines (empty ones too) among those read in
            // full.
            let mut expected = Vec::new();
            let mut long = 0;
            let mut at = 0u64;
            for l in &lines {
                at += l.len() as u64 + 1;
                if at > max_bytes {
                    break;
                }
                if l.len() > max_line {
                    long += 1;
                } else {
                    expected.push(l.clone());
                }
            }
            prop_assert_eq!(seen, expected);
            prop_assert_eq!(read.long_lines, long);
        }

        /// `read_proc` returns at most its bound, and says whether there was more.
        #[test]
        fn proc_files_are_cut_at_their_bound(len in 0usize..4096, max in 0usize..4096) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("cmdline");
            let text: Vec<u8> = (0..len).map(|i| i as u8).collect();
            std::fs::write(&path, &text).unwrap();
            let (bytes, more) = read_proc(&path, max).unwrap();
            prop_assert_eq!(&bytes[..], &text[..len.min(max)]);
            prop_assert_eq!(more, len > max);
        }
    }
}
