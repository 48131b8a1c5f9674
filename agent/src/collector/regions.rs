//! Finding and reading limiter regions: files under the configured directories, and region files
//! that GPU processes have mapped (reached through `/proc/<pid>/root`, so regions inside
//! containers are found without configuration). Both this project's format and HAMi-core's v1
//! format are read, lock-free and read-only; a corrupt or hostile file is reported, never trusted.

use std::{
    collections::HashMap,
    fs,
    io::Read,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use region::{
    hami::{HAMI_MAGIC, HamiReader, HamiSnapshot},
    layout::{REGION_MAGIC, RegionHeader},
    reader::{RegionReader, RegionSnapshot},
};

/// Directories searched by default: this project's, and HAMi's per-container directories on the
/// host (`<hostHookPath>/vgpu/containers/<podUID>_<container>/`).
pub const DEFAULT_REGION_DIRS: &[&str] =
    &["/var/lib/vgpu-agent/regions", "/usr/local/vgpu/containers"];

/// How deep below a region directory files are looked for.
const MAX_DEPTH: usize = 3;

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
}

enum Reader {
    Vgpu(RegionReader),
    Hami(HamiReader),
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

fn files_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
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

/// Keeps a reader per region file (reopened when the file is replaced).
#[derive(Default)]
pub struct RegionScanner {
    dirs: Vec<PathBuf>,
    readers: HashMap<PathBuf, ((u64, u64), Reader)>,
}

impl RegionScanner {
    pub fn new(dirs: Vec<PathBuf>) -> RegionScanner {
        RegionScanner {
            dirs,
            readers: HashMap::new(),
        }
    }

    /// Region files in the configured directories plus `mapped` (paths of files that GPU
    /// processes map, as reachable from here), deduplicated by identity.
    pub fn candidates(&self, mapped: impl IntoIterator<Item = PathBuf>) -> Vec<(PathBuf, Format)> {
        let mut files = Vec::new();
        for d in &self.dirs {
            files_under(d, MAX_DEPTH, &mut files);
        }
        files.extend(mapped);
        let mut seen = std::collections::HashSet::new();
        files
            .into_iter()
            .filter(|p| {
                fs::metadata(p).is_ok_and(|m| m.is_file() && seen.insert((m.dev(), m.ino())))
            })
            .filter_map(|p| sniff(&p).map(|f| (p, f)))
            .collect()
    }

    /// Reads every candidate; forgets readers of files no longer present.
    pub fn read(&mut self, candidates: &[(PathBuf, Format)]) -> Vec<(PathBuf, RegionRead)> {
        self.readers
            .retain(|p, _| candidates.iter().any(|(c, _)| c == p));
        let mut out = Vec::with_capacity(candidates.len());
        for (path, format) in candidates {
            let id = fs::metadata(path)
                .map(|m| (m.dev(), m.ino()))
                .unwrap_or_default();
            if self.readers.get(path).is_some_and(|(old, _)| *old != id) {
                self.readers.remove(path);
            }
            if !self.readers.contains_key(path) {
                let opened = match format {
                    Format::Vgpu => RegionReader::open(path)
                        .map(Reader::Vgpu)
                        .map_err(|e| e.to_string()),
                    Format::Hami => HamiReader::open(path)
                        .map(Reader::Hami)
                        .map_err(|e| e.to_string()),
                };
                match opened {
                    Ok(r) => {
                        self.readers.insert(path.clone(), (id, r));
                    }
                    Err(e) => {
                        out.push((path.clone(), RegionRead::Failed(*format, e)));
                        continue;
                    }
                }
            }
            let (_, reader) = &self.readers[path];
            let read = match reader {
                Reader::Vgpu(r) => r
                    .snapshot()
                    .map(|s| RegionRead::Vgpu(Box::new(s)))
                    .unwrap_or_else(|e| RegionRead::Failed(Format::Vgpu, e.to_string())),
                Reader::Hami(r) => r
                    .snapshot()
                    .map(|s| RegionRead::Hami(Box::new(s)))
                    .unwrap_or_else(|e| RegionRead::Failed(Format::Hami, e.to_string())),
            };
            out.push((path.clone(), read));
        }
        out
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
        let mut scanner = RegionScanner::new(vec![dir.path().to_owned()]);
        let c = scanner.candidates(vec![]);
        assert_eq!(c.len(), 1, "{c:?}");
        let reads = scanner.read(&c);
        assert!(
            matches!(&reads[0].1, RegionRead::Failed(Format::Vgpu, msg) if !msg.is_empty()),
            "{:?}",
            reads[0].1
        );
    }
}
