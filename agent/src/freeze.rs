//! `vgpu-agent freeze|thaw`: a container's GPU processes (or the pids given) are frozen by the
//! driver's checkpoint API: their device memory moves to host memory and goes back to the GPU
//! while the processes stay alive, their CUDA calls waiting; `thaw` brings the memory back and
//! lets the calls proceed (docs/oversubscription.md).
//!
//! A container's GPU processes are those whose cgroup names the container and that map a
//! `libcuda.so*` (read through `tenant_fs`, bounded). Each process is handled on its own: one
//! that fails is reported and does not keep the others from being frozen or thawed.
//!
//! A container is also marked in its control blocks (`region::FreezeMark`), so that its
//! limiter asks for the thaw at its next CUDA call, before the driver holds the call, and the
//! daemon thaws it (`daemon::thaw`): first "freezing", then, [`MARK_SETTLE`] later, the
//! processes are locked and checkpointed, then "frozen"; a thaw clears the mark after the
//! processes run again.

use std::{path::Path, time::Duration};

use region::FreezeMark;

use crate::{
    checkpoint::{self, CheckpointApi, CheckpointError, ProcessState},
    identity::container::ContainerIdentity,
    limit::{self, LimitError},
};

/// How long a freeze waits between marking the container freezing and locking its processes:
/// more than the period at which a limiter looks at its control block (10 ms), so that every
/// CUDA call starting after the lock either found the mark and waits in the limiter, or follows
/// one that did (whose thaw request lets it go on).
pub const MARK_SETTLE: Duration = Duration::from_millis(25);

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
    #[error("marking the container in its control blocks: {0}")]
    Mark(#[from] LimitError),
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

/// Freezes the container `id`'s processes `pids`, marking it in its control blocks first as
/// freezing and, once a process is frozen, as frozen (none frozen: the mark is cleared). A
/// container whose processes map no limiter region is frozen without a mark: its calls then wait
/// in the driver for a `thaw` by hand, which the last line says.
pub fn freeze_container(
    api: &impl CheckpointApi,
    id: &str,
    pids: &[u32],
    lock_timeout: Duration,
) -> Result<Vec<String>, FreezeError> {
    let target = limit::Target::Container(id.to_owned());
    let marked = match limit::set_mark(&target, FreezeMark::Freezing) {
        Ok(_) => true,
        Err(LimitError::NoRegion(_)) => false,
        Err(e) => return Err(e.into()),
    };
    if marked {
        std::thread::sleep(MARK_SETTLE);
    }
    let mut outcome = freeze(api, pids, lock_timeout);
    let any_frozen = match &outcome {
        Ok(_) => true,
        Err(FreezeError::Failed { done, .. }) => !done.is_empty(),
        Err(_) => false,
    };
    let note = if !marked {
        "no limiter region: the CUDA calls wait in the driver for `vgpu-agent thaw`"
    } else if any_frozen {
        limit::set_mark(&target, FreezeMark::Frozen)?;
        "marked frozen: the next CUDA call asks a running `vgpu-agent run` for the thaw"
    } else {
        limit::set_mark(&target, FreezeMark::Running)?;
        "nothing frozen: the mark is cleared"
    };
    match &mut outcome {
        Ok(lines) | Err(FreezeError::Failed { done: lines, .. }) => {
            lines.push(format!("container {id}: {note}"));
        }
        Err(_) => {}
    }
    outcome
}

/// Thaws the container `id`'s processes `pids`, then clears its freeze mark (kept if a process
/// could not be thawed: its next call still asks for the thaw).
pub fn thaw_container(
    api: &impl CheckpointApi,
    id: &str,
    pids: &[u32],
) -> Result<Vec<String>, FreezeError> {
    let mut lines = thaw(api, pids)?;
    match limit::set_mark(
        &limit::Target::Container(id.to_owned()),
        FreezeMark::Running,
    ) {
        Ok(_) => lines.push(format!("container {id}: the freeze mark is cleared")),
        Err(LimitError::NoRegion(_)) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(lines)
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
