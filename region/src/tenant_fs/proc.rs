//! Bounded reads of kernel-generated files about a tenant's processes (`/proc/<pid>/maps`,
//! `cgroup`, `cmdline`): the kernel writes them, but a process decides how long they get.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::TenantFsError;

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
