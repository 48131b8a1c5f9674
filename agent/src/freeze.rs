//! `vgpu-agent freeze|thaw`: a container's GPU processes (or the pids given) are frozen by the
//! driver's checkpoint API: their device memory moves to host memory and goes back to the GPU
//! while the processes stay alive, their CUDA calls waiting; `thaw` brings the memory back and
//! lets the calls proceed (docs/oversubscription.md).
//!
//! A container's GPU processes are those whose cgroup names the container and that map a
//! `libcuda.so*` (read through `tenant_fs`, bounded). Each process is handled on its own: one
//! that fails is reported and does not keep the others from being frozen or thawed.

use std::{path::Path, time::Duration};

use crate::{
    checkpoint::{self, CheckpointApi, CheckpointError, ProcessState},
    identity::container::ContainerIdentity,
};

/// Bytes of `/proc/<pid>/cgroup` read (a few hundred in practice).
const MAX_CGROUP_BYTES: usize = 64 << 10;

/// What a freeze or thaw applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pids(Vec<u32>),
    /// A container id or id prefix.
    Container(String),
}

/// What `freeze` and `thaw` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("no GPU process of container {0:?} found (none maps libcuda)")]
    NoProcess(String),
    #[error(transparent)]
    Driver(#[from] CheckpointError),
    #[error("{} of {total} processes failed:\n{}", .failed.len(), .failed.join("\n"))]
    Failed {
        total: usize,
        failed: Vec<String>,
        /// What was done for the others.
        done: Vec<String>,
    },
}

/// The pids `target` names: the ones given, or the container's GPU processes under `proc`.
pub fn pids(target: &Target, proc: &Path) -> Result<Vec<u32>, FreezeError> {
    let id = match target {
        Target::Pids(p) => return Ok(p.clone()),
        Target::Container(id) => id,
    };
    let mut out: Vec<u32> = std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let path = proc.join(pid.to_string()).join("cgroup");
            tenant_fs::read_proc(&path, MAX_CGROUP_BYTES).is_ok_and(|(cg, _)| {
                ContainerIdentity::from_proc_cgroup(&String::from_utf8_lossy(&cg))
                    .and_then(|i| i.container_id)
                    .is_some_and(|c| !id.is_empty() && c.as_str().starts_with(id.as_str()))
            })
        })
        .filter(|pid| {
            tenant_fs::maps::read(proc, *pid).is_ok_and(|(maps, _)| {
                maps.iter().any(|m| {
                    m.path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("libcuda.so"))
                })
            })
        })
        .collect();
    out.sort_unstable();
    if out.is_empty() {
        return Err(FreezeError::NoProcess(id.clone()));
    }
    Ok(out)
}

/// Runs `each` on every pid; the lines of those that succeeded, or all failures after them.
fn for_each(
    pids: &[u32],
    mut each: impl FnMut(u32) -> Result<String, CheckpointError>,
) -> Result<Vec<String>, FreezeError> {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for &pid in pids {
        match each(pid) {
            Ok(line) => done.push(line),
            Err(e) => failed.push(format!("pid {pid}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(done)
    } else {
        Err(FreezeError::Failed {
            total: pids.len(),
            failed,
            done,
        })
    }
}

/// Freezes every pid (see [`checkpoint::freeze`]).
pub fn freeze(
    api: &impl CheckpointApi,
    pids: &[u32],
    lock_timeout: Duration,
) -> Result<Vec<String>, FreezeError> {
    for_each(pids, |pid| {
        checkpoint::freeze(api, pid, lock_timeout)?;
        Ok(format!(
            "pid {pid}: frozen (device memory in host memory, CUDA calls wait for the thaw)"
        ))
    })
}

/// Thaws every pid (see [`checkpoint::thaw`]).
pub fn thaw(api: &impl CheckpointApi, pids: &[u32]) -> Result<Vec<String>, FreezeError> {
    for_each(pids, |pid| {
        let was = api.state(pid)?;
        checkpoint::thaw(api, pid)?;
        Ok(match was {
            ProcessState::Running => format!("pid {pid}: already running"),
            _ => format!("pid {pid}: thawed"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_pids_are_taken_as_they_are_and_an_unknown_container_is_named() {
        let proc = Path::new("/nonexistent-proc");
        assert_eq!(pids(&Target::Pids(vec![3, 1]), proc).unwrap(), vec![3, 1]);
        let e = pids(&Target::Container("abc".into()), proc).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no GPU process of container \"abc\" found (none maps libcuda)"
        );
    }

    #[test]
    fn one_failing_process_does_not_keep_the_others_from_being_handled() {
        let mut seen = Vec::new();
        let r = for_each(&[1, 2, 3], |pid| {
            seen.push(pid);
            if pid == 2 {
                Err(CheckpointError::Call {
                    call: "cuCheckpointProcessLock",
                    pid,
                    code: 909,
                })
            } else {
                Ok(format!("pid {pid}: ok"))
            }
        });
        assert_eq!(seen, [1, 2, 3]);
        let FreezeError::Failed {
            total,
            failed,
            done,
        } = r.unwrap_err()
        else {
            panic!("not a per-process failure");
        };
        assert_eq!(total, 3);
        assert_eq!(done, ["pid 1: ok", "pid 3: ok"]);
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].starts_with(
                "pid 2: cuCheckpointProcessLock on pid 2 failed with CUDA error 909 (timeout)"
            ),
            "{failed:?}"
        );
    }
}
