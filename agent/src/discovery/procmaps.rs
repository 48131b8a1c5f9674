//! Parsing `/proc/<pid>/maps` lines.

use std::path::PathBuf;

/// A file-backed mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    /// `st_dev` of the file (from the maps line's `major:minor`).
    pub dev: u64,
    pub inode: u64,
    /// The path inside the process's mount namespace.
    pub path: PathBuf,
    /// The file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
}

/// `makedev` as glibc encodes it, so maps devices compare equal to `stat`'s `st_dev`.
pub fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0xff)
}

/// Parses one maps line; `None` for anonymous or malformed mappings.
pub fn parse_line(line: &str) -> Option<MappedFile> {
    // addr perms offset dev inode path... (the path is the rest and may contain spaces)
    let mut rest = line;
    let mut fields = [""; 5];
    for f in &mut fields {
        rest = rest.trim_start_matches(' ');
        let end = rest.find(' ').unwrap_or(rest.len());
        *f = &rest[..end];
        rest = &rest[end..];
    }
    let path = rest.trim_start_matches(' ');
    if !path.starts_with('/') {
        return None;
    }
    let (start, end) = fields[0].split_once('-')?;
    let (major, minor) = fields[3].split_once(':')?;
    let inode: u64 = fields[4].parse().ok()?;
    if inode == 0 {
        return None;
    }
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MappedFile {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        dev: makedev(
            u64::from_str_radix(major, 16).ok()?,
            u64::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        path: PathBuf::from(path),
        deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_library_lines() {
        let l = "7f1c2a000000-7f1c2a200000 r-xp 00000000 fd:01 1234567                    /usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01";
        let m = parse_line(l).unwrap();
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
        let m = parse_line(l).unwrap();
        assert_eq!(m.path, PathBuf::from("/tmp/my dir/libcuda.so.1"));
        assert!(m.deleted);
    }

    #[test]
    fn skips_anonymous_and_special_mappings() {
        assert_eq!(
            parse_line("7ffd-7ffe rw-p 00000000 00:00 0                          [stack]"),
            None
        );
        assert_eq!(parse_line("7ffd-7ffe rw-p 00000000 00:00 0"), None);
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line(""), None);
    }

    #[test]
    fn makedev_matches_stat() {
        use std::os::unix::fs::MetadataExt;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = maps
            .lines()
            .filter_map(parse_line)
            .find(|m| m.path == exe)
            .expect("own executable is mapped");
        let meta = std::fs::metadata(&exe).unwrap();
        assert_eq!((m.dev, m.inode), (meta.dev(), meta.ino()));
    }
}
