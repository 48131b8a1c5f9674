//! cgroup v2 ids and paths. `bpf_get_current_cgroup_id()` returns the id of the task's cgroup in
//! the default (v2) hierarchy: the inode number of its directory in the cgroup2 mount, which is
//! `/sys/fs/cgroup` on a pure v2 host and `/sys/fs/cgroup/unified` on a hybrid one.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// The cgroup2 mount point named in a `/proc/self/mountinfo` text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // id parent major:minor root mountpoint options... - fstype source super-options
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        let mount_point = left.split(' ').nth(4)?;
        Some(PathBuf::from(unescape_octal(mount_point)))
    })
}

/// mountinfo escapes spaces and similar as `\040`.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Maps cgroup ids to paths by walking the cgroup2 tree; rebuilt when an id is not found.
#[derive(Debug, Default)]
pub struct CgroupIndex {
    mount: Option<PathBuf>,
    by_id: HashMap<u64, String>,
}

impl CgroupIndex {
    pub fn new() -> CgroupIndex {
        let mount = fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|m| cgroup2_mount(&m));
        CgroupIndex {
            mount,
            by_id: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub fn with_mount(mount: PathBuf) -> CgroupIndex {
        CgroupIndex {
            mount: Some(mount),
            by_id: HashMap::new(),
        }
    }

    pub fn mount(&self) -> Option<&Path> {
        self.mount.as_deref()
    }

    /// The path (relative to the cgroup2 root, starting with `/`) of a cgroup id.
    pub fn path_of(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        self.rebuild();
        self.by_id.get(&id).cloned()
    }

    fn rebuild(&mut self) {
        let Some(mount) = self.mount.clone() else {
            return;
        };
        self.by_id.clear();
        let mut stack = vec![mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            let rel = dir
                .strip_prefix(&mount)
                .map(|r| format!("/{}", r.display()))
                .unwrap_or_default();
            self.by_id
                .insert(meta.ino(), if rel == "/" { "/".into() } else { rel });
            if let Ok(entries) = fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_on_pure_and_hybrid_hosts() {
        let pure = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let hybrid = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:5 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:6 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:7 - cgroup cgroup rw,memory
";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("31 30 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
            None
        );
        let spaced = "31 30 0:27 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn indexes_a_tree_by_inode() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("kubepods/pod1")).unwrap();
        let ino = fs::metadata(tmp.path().join("kubepods/pod1"))
            .unwrap()
            .ino();
        let root_ino = fs::metadata(tmp.path()).unwrap().ino();
        let mut idx = CgroupIndex::with_mount(tmp.path().to_owned());
        assert_eq!(idx.path_of(ino).as_deref(), Some("/kubepods/pod1"));
        assert_eq!(idx.path_of(root_ino).as_deref(), Some("/"));
        assert_eq!(idx.path_of(u64::MAX), None);
        // A directory made later is found by rebuilding on a miss.
        fs::create_dir_all(tmp.path().join("late")).unwrap();
        let late = fs::metadata(tmp.path().join("late")).unwrap().ino();
        assert_eq!(idx.path_of(late).as_deref(), Some("/late"));
    }
}
