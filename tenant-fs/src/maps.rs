//! Reading `/proc/<pid>/maps`: bounded in bytes (a process decides how many mappings it has and
//! how long their paths are) and parsed as bytes (a path need not be UTF-8). The kernel escapes a
//! newline in a path as `\012` and nothing else (not even a backslash), so a path that shows
//! `\012` may be either; the (device, inode) on the line is what identifies the file, and every
//! open checks it (see [`crate::open_mapped`]).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::{FileKey, ProcRead, TenantFsError};

/// Bytes of one process's maps read at most. A GPU process with PyTorch has about 1 MiB.
pub const MAX_MAPS_BYTES: u64 = 16 << 20;
/// Longest maps line read (a 4,096-byte path, every byte escaped, and the fields before it).
pub const MAX_MAPS_LINE: usize = 4 * 4096 + 128;

/// A file-backed mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    /// `st_dev` of the file (from the maps line's `major:minor`).
    pub dev: u64,
    pub inode: u64,
    /// A shared mapping (`s` in the permissions), as a region is mapped.
    pub shared: bool,
    /// The path inside the process's mount namespace, unescaped.
    pub path: PathBuf,
    /// The file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
}

impl MappedFile {
    pub fn key(&self) -> FileKey {
        FileKey {
            dev: self.dev,
            ino: self.inode,
        }
    }

    pub fn range(&self) -> (u64, u64) {
        (self.start, self.end)
    }
}

/// `makedev` as glibc encodes it, so maps devices compare equal to `stat`'s `st_dev`.
pub fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0xff)
}

/// Undoes the kernel's escaping of a maps path (`seq_file_path(..., "\n")`): `\012` is a
/// newline; every other byte is as the kernel wrote it.
pub fn unescape(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i..].starts_with(b"\\012") {
            out.push(b'\n');
            i += 4;
        } else {
            out.push(path[i]);
            i += 1;
        }
    }
    out
}

fn field<'a>(rest: &mut &'a [u8]) -> &'a [u8] {
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    let r = &rest[start..];
    let end = r.iter().position(|&b| b == b' ').unwrap_or(r.len());
    *rest = &r[end..];
    &r[..end]
}

fn hex(b: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

/// Parses one maps line; `None` for anonymous or malformed mappings.
pub fn parse_line(line: &[u8]) -> Option<MappedFile> {
    // addr perms offset dev inode path... (the path is the rest and may contain spaces)
    let mut rest = line;
    let addr = field(&mut rest);
    let perms = field(&mut rest);
    let _offset = field(&mut rest);
    let dev = field(&mut rest);
    let inode = field(&mut rest);
    let start_path = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    let path = &rest[start_path..];
    if !path.starts_with(b"/") {
        return None;
    }
    let split = |b: &'static u8, s: &[u8]| -> Option<(Vec<u8>, Vec<u8>)> {
        let i = s.iter().position(|c| c == b)?;
        Some((s[..i].to_vec(), s[i + 1..].to_vec()))
    };
    let (start, end) = split(&b'-', addr)?;
    let (major, minor) = split(&b':', dev)?;
    let inode: u64 = std::str::from_utf8(inode).ok()?.parse().ok()?;
    if inode == 0 {
        return None;
    }
    let (path, deleted) = match path.strip_suffix(b" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MappedFile {
        start: hex(&start)?,
        end: hex(&end)?,
        dev: makedev(hex(&major)?, hex(&minor)?),
        inode,
        shared: perms.get(3) == Some(&b's'),
        path: PathBuf::from(OsString::from_vec(unescape(path))),
        deleted,
    })
}

/// The file-backed mappings of process `pid`, read from `<proc>/<pid>/maps` within
/// [`MAX_MAPS_BYTES`]. The second value says whether the file was cut at the bound.
pub fn read(proc: &Path, pid: u32) -> Result<(Vec<MappedFile>, ProcRead), TenantFsError> {
    let mut out = Vec::new();
    let read = crate::read_proc_lines(
        &proc.join(pid.to_string()).join("maps"),
        MAX_MAPS_BYTES,
        MAX_MAPS_LINE,
        |line| out.extend(parse_line(line)),
    )?;
    Ok((out, read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_library_lines() {
        let l = "7f1c2a000000-7f1c2a200000 r-xp 00000000 fd:01 1234567                    /usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01";
        let m = parse_line(l.as_bytes()).unwrap();
        assert_eq!(m.start, 0x7f1c2a000000);
        assert_eq!(m.inode, 1234567);
        assert_eq!(m.dev, makedev(0xfd, 1));
        assert_eq!(
            m.path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01")
        );
        assert!(!m.deleted);
    }

    #[test]
    fn keeps_spaces_and_notes_deleted_files() {
        let l = "7f00-7f10 r--p 00000000 00:2a 99 /tmp/my dir/libcuda.so.1 (deleted)";
        let m = parse_line(l.as_bytes()).unwrap();
        assert_eq!(m.path, PathBuf::from("/tmp/my dir/libcuda.so.1"));
        assert!(m.deleted);
    }

    #[test]
    fn skips_anonymous_and_special_mappings() {
        assert_eq!(
            parse_line(b"7ffd-7ffe rw-p 00000000 00:00 0                          [stack]"),
            None
        );
        assert_eq!(parse_line(b"7ffd-7ffe rw-p 00000000 00:00 0"), None);
        assert_eq!(parse_line(b"garbage"), None);
        assert_eq!(parse_line(b""), None);
        assert_eq!(parse_line(b"zz-7f rw-p 0 0:0 5 /x"), None);
    }

    #[test]
    fn makedev_matches_stat() {
        use std::os::unix::fs::MetadataExt;
        let (maps, _) = read(Path::new("/proc"), std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = maps
            .into_iter()
            .find(|m| m.path == exe)
            .expect("own executable is mapped");
        let meta = std::fs::metadata(&exe).unwrap();
        assert_eq!((m.dev, m.inode), (meta.dev(), meta.ino()));
    }

    #[test]
    fn unescapes_newlines_and_keeps_other_bytes() {
        assert_eq!(unescape(b"/a\\012b/lib"), b"/a\nb/lib");
        assert_eq!(unescape(b"/a\\01"), b"/a\\01");
        assert_eq!(unescape(b"/tab\there"), b"/tab\there");
        let l = b"7f00-7f10 r-xp 00000000 00:2a 99 /x\\012/libcuda.so.1 (deleted)";
        let m = parse_line(l).unwrap();
        assert_eq!(m.path, PathBuf::from("/x\n/libcuda.so.1"));
        assert!(m.deleted && !m.shared);
        let mut raw = b"7f00-7f10 rw-s 00000000 00:2a 99 /r\xff\xfe.region".to_vec();
        let m = parse_line(&raw).unwrap();
        assert!(m.shared);
        assert_eq!(
            std::os::unix::ffi::OsStrExt::as_bytes(m.path.as_os_str()),
            b"/r\xff\xfe.region",
            "not UTF-8, kept"
        );
        raw.truncate(10);
        assert_eq!(parse_line(&raw), None);
    }

    /// A path the kernel printed with `\012` is the newline path; the file really there under the
    /// path is checked by identity when opened, so a FIFO or link named with the literal
    /// characters is never the one used.
    #[test]
    fn a_real_process_mapping_a_file_under_a_newline_directory_is_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("lib\n");
        std::fs::create_dir(&odd).unwrap();
        let file = odd.join("libcuda.so.1");
        std::fs::write(&file, [0u8; 4096]).unwrap();
        let f = std::fs::File::open(&file).unwrap();
        // SAFETY: a fresh private read-only mapping of a valid fd, unmapped below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let (maps, r) = read(Path::new("/proc"), std::process::id()).unwrap();
        assert!(!r.truncated);
        let m = maps
            .iter()
            .find(|m| m.start == ptr as u64)
            .expect("the mapping is listed");
        assert_eq!(m.path, file);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(ptr, 4096) };
    }
}
