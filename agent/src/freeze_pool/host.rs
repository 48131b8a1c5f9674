//! What the host's memory allows the pool. The chunks' pages are charged to the agent's memory
//! cgroup, so: the cgroup must be able to hold the pool at all (its limit, at start); one more
//! chunk is populated only while the host keeps its reserve (`/proc/meminfo`); and pages that
//! ended loans left behind count against the pool's size. A hole punched through a chunk frees
//! its pages unless a borrower still pins them (a driver's registration, a pipe it spliced them
//! into): those pages leave the file but stay charged to the agent until the borrower lets go or
//! exits. The agent's cgroup shows them as memory that no anonymous, file or kernel page
//! accounts for ([`OwnCgroup::kept`]).

use std::path::{Path, PathBuf};

use region::freeze_pool::CHUNK_BYTES;

use super::error::FreezePoolError;

const GIB: u64 = 1 << 30;
/// Memory the agent's cgroup needs besides the pool (its heap, its page cache).
const SPARE: u64 = 256 << 20;
/// Unaccounted bytes of the agent's cgroup below this are noise (small kernel uses no field
/// names), not pages kept by borrowers.
const KEPT_NOISE: u64 = 256 << 20;

/// What the host's memory says now.
pub(super) trait HostMemory: Send + Sync {
    /// `MemAvailable` and `MemTotal` in bytes (`None`: not read).
    fn now(&self) -> Option<(u64, u64)>;
    /// Bytes of ended loans that their borrowers still hold (`None`: not known).
    fn kept(&self) -> Option<u64>;
}

/// The agent's memory cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum OwnCgroup {
    /// Its directory in a cgroup v2 hierarchy.
    V2(PathBuf),
    /// Its directory in a cgroup v1 memory hierarchy.
    V1(PathBuf),
}

/// A file of `key value` lines.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl OwnCgroup {
    /// The memory cgroup that `proc_self_cgroup` (the agent's `/proc/self/cgroup`) names under
    /// `root` (`/sys/fs/cgroup`): v2 where it has `memory.current`, else the v1 `memory`
    /// hierarchy's; `None` (not known: the root cgroup, no memory controller) otherwise.
    pub fn find(proc_self_cgroup: &Path, root: &Path) -> Option<OwnCgroup> {
        let text = std::fs::read_to_string(proc_self_cgroup).ok()?;
        if let Some(path) = tenant_fs::cgroup_v2_path(&text) {
            let dir = root.join(path.trim_start_matches('/'));
            if dir.join("memory.current").is_file() {
                return Some(OwnCgroup::V2(dir));
            }
        }
        let v1 = text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })?;
        let dir = root.join("memory").join(v1.trim_start_matches('/'));
        dir.join("memory.usage_in_bytes")
            .is_file()
            .then_some(OwnCgroup::V1(dir))
    }

    /// Its memory limit (`None`: none, or not read).
    pub fn limit(&self) -> Option<u64> {
        match self {
            OwnCgroup::V2(dir) => read_u64(&dir.join("memory.max")),
            // v1 says "no limit" with a page-rounded i64::MAX.
            OwnCgroup::V1(dir) => {
                read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < 1 << 62)
            }
        }
    }

    /// Memory charged to the cgroup that no anonymous, file or kernel page accounts for: pages
    /// taken out of their files (the chunks of ended loans) that someone still pins.
    pub fn kept(&self) -> Option<u64> {
        match self {
            OwnCgroup::V2(dir) => {
                let current = read_u64(&dir.join("memory.current"))?;
                let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
                let f = |k| field(&stat, k).unwrap_or(0);
                let kernel = field(&stat, "kernel").unwrap_or_else(|| {
                    [
                        "kernel_stack",
                        "pagetables",
                        "sec_pagetables",
                        "percpu",
                        "slab",
                        "vmalloc",
                    ]
                    .into_iter()
                    .map(f)
                    .sum()
                });
                let accounted =
                    field(&stat, "anon")? + field(&stat, "file")? + kernel + f("sock") + f("zswap");
                Some(current.saturating_sub(accounted))
            }
            OwnCgroup::V1(dir) => {
                let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
                let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
                let kmem = read_u64(&dir.join("memory.kmem.usage_in_bytes")).unwrap_or(0);
                let accounted = field(&stat, "total_cache")? + field(&stat, "total_rss")? + kmem;
                Some(usage.saturating_sub(accounted))
            }
        }
    }
}

/// The host's own files: `/proc/meminfo` and the agent's memory cgroup.
pub(super) struct HostFiles {
    pub meminfo: PathBuf,
    pub cgroup: Option<OwnCgroup>,
}

impl HostMemory for HostFiles {
    fn now(&self) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(&self.meminfo).ok()?;
        let kib = |name: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            kib.checked_mul(1024)
        };
        Some((kib("MemAvailable:")?, kib("MemTotal:")?))
    }

    fn kept(&self) -> Option<u64> {
        self.cgroup.as_ref()?.kept()
    }
}

/// What the host keeps for everything else: a sixteenth of its memory, at least 1 GiB. The
/// pool populates a chunk only while the host has that much available besides the chunk.
pub(super) fn reserve(total: u64) -> u64 {
    (total / 16).max(GIB)
}

/// Why one more chunk is not populated now (`None`: it may be): ended loans' pages still held
/// that, with `out` chunks ready, lent and being populated (this one among them), would take the
/// pool past its `target` (`kept`), or the host short of memory (`host`); the kind, and the
/// message. Unreadable figures allow it.
pub(super) fn short_of(
    host: &dyn HostMemory,
    out: usize,
    target: usize,
) -> Option<(&'static str, String)> {
    let kept = kept_bytes(host);
    let kept_chunks = usize::try_from(kept.div_ceil(CHUNK_BYTES)).unwrap_or(usize::MAX);
    if out.saturating_add(kept_chunks) > target {
        return Some((
            "kept",
            format!(
                "{} of ended loans' pages are still held by their borrowers (pinned after their \
                 loans ended; freed when they let go or exit): the pool keeps its size with them",
                crate::units::bytes(kept)
            ),
        ));
    }
    let (available, total) = host.now()?;
    let keep = reserve(total);
    (available < CHUNK_BYTES.saturating_add(keep)).then(|| {
        let message = format!(
            "the host has {} available, less than a chunk ({}) plus its reserve ({}): the pool \
             waits for memory",
            crate::units::bytes(available),
            crate::units::bytes(CHUNK_BYTES),
            crate::units::bytes(keep)
        );
        ("host", message)
    })
}

/// Bytes of ended loans still held, as `host` shows them (noise left out).
pub(super) fn kept_bytes(host: &dyn HostMemory) -> u64 {
    host.kept().filter(|b| *b >= KEPT_NOISE).unwrap_or(0)
}

/// Refuses a pool of `size` bytes that the agent's own memory cgroup cannot hold with 256 MiB
/// to spare. Where it cannot be read, or has no limit, nothing is refused.
pub(super) fn check_own_cgroup(
    size: u64,
    cgroup: Option<&OwnCgroup>,
) -> Result<(), FreezePoolError> {
    let Some(cgroup) = cgroup else {
        return Ok(());
    };
    match cgroup.limit() {
        Some(limit) if limit < size.saturating_add(SPARE) => Err(FreezePoolError::CgroupTooSmall {
            limit,
            file: match cgroup {
                OwnCgroup::V2(dir) => dir.join("memory.max"),
                OwnCgroup::V1(dir) => dir.join("memory.limit_in_bytes"),
            },
            size,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
pub(super) mod testing {
    use std::sync::Mutex;

    use super::HostMemory;

    /// Host memory as a test says it is: available and total, and kept bytes.
    #[derive(Default)]
    pub struct FakeHost(pub Mutex<Option<(u64, u64)>>, pub Mutex<Option<u64>>);

    impl HostMemory for FakeHost {
        fn now(&self) -> Option<(u64, u64)> {
            *self.0.lock().unwrap()
        }

        fn kept(&self) -> Option<u64> {
            *self.1.lock().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_and_a_chunk_waits_for_the_hosts_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meminfo");
        std::fs::write(
            &path,
            "MemTotal:       33554432 kB\nMemFree:  1 kB\nMemAvailable:    4194304 kB\n",
        )
        .unwrap();
        let host = HostFiles {
            meminfo: path,
            cgroup: None,
        };
        assert_eq!(host.now(), Some((4 * GIB, 32 * GIB)));
        assert_eq!(reserve(32 * GIB), 2 * GIB);
        assert_eq!(reserve(4 * GIB), GIB);
        assert_eq!(
            short_of(&host, 1, 2),
            None,
            "4 GiB available: a chunk and 2 GiB kept"
        );
        let short = testing::FakeHost(Some((3 * GIB - 1, 32 * GIB)).into(), None.into());
        assert!(
            short_of(&short, 1, 2)
                .unwrap()
                .1
                .contains("waits for memory")
        );
        let unread = HostFiles {
            meminfo: dir.path().join("none"),
            cgroup: None,
        };
        assert_eq!(short_of(&unread, 1, 2), None);
    }

    /// Pages kept by borrowers count against the pool's size: with 2 GiB kept, a pool of 4
    /// chunks populates 2 at most; noise below 256 MiB is not counted.
    #[test]
    fn pages_kept_after_their_loans_count_against_the_size() {
        let plenty = Some((64 * GIB, 64 * GIB));
        let host = testing::FakeHost(plenty.into(), Some(2 * GIB).into());
        assert_eq!(short_of(&host, 2, 4), None);
        assert!(short_of(&host, 3, 4).unwrap().1.contains("still held"));
        *host.1.lock().unwrap() = Some(KEPT_NOISE - 1);
        assert_eq!(short_of(&host, 4, 4), None);
        assert_eq!(kept_bytes(&host), 0);
    }

    /// The agent's memory cgroup, v2 or v1: found from `/proc/self/cgroup`, its limit read (a
    /// pool it cannot hold refused), and the memory no page accounts for: what borrowers keep.
    #[test]
    fn the_agents_cgroup_is_read_in_v2_and_v1() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("cgroup");
        let root = dir.path().join("fs");
        std::fs::create_dir_all(root.join("agent.slice")).unwrap();
        let v2 = root.join("agent.slice");
        std::fs::write(&own, "0::/agent.slice\n").unwrap();
        std::fs::write(v2.join("memory.max"), format!("{}\n", 8 * GIB)).unwrap();
        std::fs::write(v2.join("memory.current"), format!("{}\n", 3 * GIB + 100)).unwrap();
        std::fs::write(
            v2.join("memory.stat"),
            format!("anon 100\nfile {}\nkernel 0\nsock 0\nshmem {}\n", GIB, GIB),
        )
        .unwrap();
        let cg = OwnCgroup::find(&own, &root).unwrap();
        assert_eq!(cg, OwnCgroup::V2(v2.clone()));
        assert_eq!(cg.kept(), Some(2 * GIB));
        let e = check_own_cgroup(8 * GIB, Some(&cg)).unwrap_err();
        assert!(e.to_string().contains("memory.max"), "{e}");
        check_own_cgroup(4 * GIB, Some(&cg)).unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        check_own_cgroup(64 * GIB, Some(&cg)).unwrap();
        check_own_cgroup(64 * GIB, None).unwrap();

        let v1 = root.join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(&own, "4:memory:/docker/abc\n0::/\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), format!("{}\n", 2 * GIB)).unwrap();
        std::fs::write(v1.join("memory.kmem.usage_in_bytes"), "100\n").unwrap();
        std::fs::write(
            v1.join("memory.stat"),
            format!("cache 1\nrss 1\ntotal_cache {}\ntotal_rss 0\n", GIB - 100),
        )
        .unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let cg = OwnCgroup::find(&own, &root).unwrap();
        assert_eq!(cg, OwnCgroup::V1(v1.clone()));
        assert_eq!(cg.kept(), Some(GIB));
        assert_eq!(cg.limit(), None, "no limit");
        std::fs::write(&own, "0::/\n").unwrap();
        assert_eq!(OwnCgroup::find(&own, &root), None, "the root: not known");
    }
}
