//! Finding limiter regions: files under the configured directories, and region files that GPU
//! processes have mapped (reached through `/proc/<pid>/root`, so regions inside containers are
//! found without configuration). Both this project's format and HAMi-core's v1 format are read
//! (by [`super::region_scan`]), lock-free and read-only; a corrupt or hostile file is reported,
//! never trusted.

use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
};

use region::{
    hami::{HAMI_MAGIC, HamiSnapshot},
    layout::{REGION_MAGIC, RegionHeader},
    reader::RegionSnapshot,
};

/// Directories searched by default: this project's, and HAMi's per-container directories on the
/// host (`<hostHookPath>/vgpu/containers/<podUID>_<container>/`).
pub const DEFAULT_REGION_DIRS: &[&str] =
    &["/var/lib/vgpu-agent/regions", "/usr/local/vgpu/containers"];

/// How deep below a region directory files are looked for.
pub(super) const MAX_DEPTH: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Vgpu,
    Hami,
}

/// One region as read this time.
#[derive(Debug)]
pub enum RegionRead {
    Vgpu(Box<RegionSnapshot>),
    Hami(Box<HamiSnapshot>),
    /// The file looked like a region but could not be read: the reason, for people.
    Failed(Format, String),
    /// Not read this time: a read of it started earlier has not returned for `seconds` (the
    /// file blocks: a FUSE file, a stuck filesystem). `format` if it was sniffed before.
    Blocked {
        format: Option<Format>,
        seconds: f64,
    },
}

/// Where this project's magic sits in a region file (after the initialisation state word).
pub const MAGIC_OFFSET: usize = std::mem::offset_of!(RegionHeader, magic);

/// What kind of region a file is, from its first bytes; `None` for anything else.
pub fn sniff(path: &Path) -> Option<Format> {
    let mut head = [0u8; MAGIC_OFFSET + 8];
    fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    let magic = u64::from_le_bytes(head[MAGIC_OFFSET..].try_into().expect("8 bytes"));
    if magic == REGION_MAGIC {
        Some(Format::Vgpu)
    } else if i32::from_le_bytes(head[..4].try_into().expect("4 bytes")) == HAMI_MAGIC {
        Some(Format::Hami)
    } else {
        None
    }
}

/// The first bytes of a region file of this project's format, for tests.
#[cfg(test)]
pub fn magic_prefix() -> Vec<u8> {
    let mut v = vec![0u8; MAGIC_OFFSET];
    v.extend(REGION_MAGIC.to_le_bytes());
    v
}

pub(super) fn files_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_file() {
            out.push(e.path());
        } else if t.is_dir() && depth > 0 {
            files_under(&e.path(), depth - 1, out);
        }
    }
}

/// Files other than libraries that a process maps (region candidates), as reachable from here.
pub fn mapped_files(proc: &Path, pid: u32) -> Vec<PathBuf> {
    let Ok(maps) = fs::read_to_string(proc.join(pid.to_string()).join("maps")) else {
        return vec![];
    };
    let mut out: Vec<PathBuf> = maps
        .lines()
        .filter(|l| l.contains(" rw-s ") || l.contains(" r--s "))
        .filter_map(crate::discovery::procmaps::parse_line)
        .filter(|m| !m.deleted && !m.path.starts_with("/dev/") && !m.path.starts_with("/memfd:"))
        .map(|m| {
            proc.join(pid.to_string())
                .join("root")
                .join(m.path.strip_prefix("/").unwrap_or(&m.path))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_both_formats_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        fs::write(&v, magic_prefix()).unwrap();
        let h = dir.path().join("h");
        let mut bytes = HAMI_MAGIC.to_le_bytes().to_vec();
        bytes.extend([0u8; 12]);
        fs::write(&h, bytes).unwrap();
        let other = dir.path().join("o");
        fs::write(&other, b"#!/bin/sh\n").unwrap();
        let short = dir.path().join("s");
        fs::write(&short, b"VG").unwrap();
        assert_eq!(sniff(&v), Some(Format::Vgpu));
        assert_eq!(sniff(&h), Some(Format::Hami));
        assert_eq!(sniff(&other), None);
        assert_eq!(sniff(&short), None);
        assert_eq!(sniff(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_corrupt_region_is_reported_not_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("pod_ctr");
        fs::create_dir_all(&sub).unwrap();
        // The right magic, then garbage: a region that cannot be read.
        let mut bytes = magic_prefix();
        bytes.extend([0xffu8; 200]);
        fs::write(sub.join("r.cache"), &bytes).unwrap();
        fs::write(sub.join("not-a-region"), b"hello").unwrap();
        let mut scan = super::super::region_scan::RegionScan::new(
            vec![dir.path().to_owned()],
            Path::new("/proc"),
        );
        let far = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let reads = scan.scan(&[], far);
        assert_eq!(reads.len(), 1, "{reads:?}");
        assert!(
            matches!(&reads[0].1, RegionRead::Failed(Format::Vgpu, msg) if !msg.is_empty()),
            "{:?}",
            reads[0].1
        );
    }
}
