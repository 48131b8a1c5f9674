//! Facts, identity and pid-namespace coordinates of host processes, cached per (pid, start time).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::identity::{
    ProcessFacts,
    container::ContainerIdentity,
    process::{MAX_CGROUP_BYTES, read_proc_text},
};

/// Bytes of `/proc/<pid>/status` read (about 1.5 KiB; its `Name:` is the process's own bytes).
const MAX_STATUS_BYTES: usize = 16 << 10;

/// A process as the collector knows it.
#[derive(Clone, Debug)]
pub struct ProcessInfo {
    pub facts: ProcessFacts,
    pub identity: ContainerIdentity,
    /// Inode of the process's pid namespace, and its pid there (the innermost `NSpid`).
    pub namespace_pid: Option<(u64, u32)>,
}

pub struct ProcessTable {
    proc: PathBuf,
    cache: HashMap<u32, ProcessInfo>,
}

impl ProcessTable {
    pub fn new(proc: &Path) -> ProcessTable {
        ProcessTable {
            proc: proc.to_owned(),
            cache: HashMap::new(),
        }
    }

    /// The running process `pid`, read afresh when it is new or its pid was reused.
    pub fn get(&mut self, pid: u32) -> Option<&ProcessInfo> {
        let facts = ProcessFacts::read(&self.proc, pid);
        let Some(facts) = facts else {
            self.cache.remove(&pid);
            return None;
        };
        let stale = self
            .cache
            .get(&pid)
            .is_none_or(|c| c.facts.start_ticks != facts.start_ticks);
        if stale {
            let dir = self.proc.join(pid.to_string());
            let identity = read_proc_text(&dir.join("cgroup"), MAX_CGROUP_BYTES)
                .and_then(|t| ContainerIdentity::from_proc_cgroup(&t))
                .unwrap_or_else(|| {
                    ContainerIdentity::from_path(facts.cgroup_path.as_deref().unwrap_or("/"))
                });
            let ns = tenant_fs::pid_namespace(&dir);
            let inner = tenant_fs::read_proc(&dir.join("status"), MAX_STATUS_BYTES)
                .ok()
                .and_then(|(s, _)| tenant_fs::innermost_pid(&s));
            let namespace_pid = ns.zip(inner);
            self.cache.insert(
                pid,
                ProcessInfo {
                    facts,
                    identity,
                    namespace_pid,
                },
            );
        }
        self.cache.get(&pid)
    }

    /// Drops cached processes not in `keep`.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.cache.retain(|pid, _| keep(*pid));
    }

    /// Host pid of the process that is `ns_pid` in pid namespace `ns` and started at `start`.
    pub fn find_by_namespace(&self, ns: u64, ns_pid: u32, start: u64) -> Option<u32> {
        self.cache
            .iter()
            .find(|(_, i)| i.namespace_pid == Some((ns, ns_pid)) && i.facts.start_ticks == start)
            .map(|(pid, _)| *pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_by_its_namespace_pid() {
        let mut t = ProcessTable::new(Path::new("/proc"));
        let me = std::process::id();
        let info = t.get(me).unwrap().clone();
        let (ns, inner) = info.namespace_pid.unwrap();
        assert_eq!(inner, me, "the test runs in its own namespace");
        assert_eq!(
            t.find_by_namespace(ns, inner, info.facts.start_ticks),
            Some(me)
        );
        assert_eq!(
            t.find_by_namespace(ns, inner, info.facts.start_ticks + 1),
            None,
            "a reused pid is another process"
        );
    }

    /// A process whose name is not UTF-8 (a comm is any bytes its process writes) is read as
    /// running, with its name escaped, its identity and its namespace coordinates.
    #[test]
    fn a_process_named_with_bytes_that_are_not_utf8_is_alive_and_named() {
        // The shell writes its own comm (a process can write only its own), then waits; the
        // trailing `:` keeps it from exec'ing `sleep` (which would rename it).
        let mut child = std::process::Command::new("sh")
            .args(["-c", "printf 'gpu\\377\\376x' > /proc/$$/comm; sleep 30; :"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut t = ProcessTable::new(Path::new("/proc"));
        let started = std::time::Instant::now();
        let mut seen = None;
        while started.elapsed() < std::time::Duration::from_secs(10) {
            // A fresh table each time: the first read may predate the rename.
            t.retain(|_| false);
            let info = t.get(pid).cloned();
            if info.as_ref().is_some_and(|i| i.facts.comm != "sh") {
                seen = info;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let info = seen.expect("the process was read as running, renamed");
        assert_eq!(info.facts.comm, "gpu\\xff\\xfex");
        assert!(info.facts.start_ticks > 0);
        assert!(info.namespace_pid.is_some(), "its status was read too");
        assert!(info.facts.cgroup_path.is_some(), "its cgroup was read too");
    }
}
