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
//!
//! A container whose processes all run the limiter's in-process path (`VGPU_FREEZE_IN_PROCESS`)
//! is frozen by the processes themselves instead (`in_process`): marked
//! [`FreezeMark::InProcess`], each moves the memory it backs to host memory and answers in its
//! slot; the driver's checkpoint API is not loaded. One that fails, does not answer in time
//! (a wait bounded by what the agent measures, [`in_process::Waits`]) or, with NVML, answers
//! "frozen" while its device memory did not leave the GPU undoes it, and the container is
//! frozen through the driver as above.
//!
//! A process whose limiter slot says it holds at least half of its allocations from
//! `cuMemCreate` (JAX's default allocator) is not frozen at all (`restorable`): the driver's
//! restore of it fails (CUDA error 304 on driver 580, the process frozen until killed), and the
//! in-process path does not move that memory. By container nothing is then marked
//! ([`FreezeError::Refused`]); by pid, that pid is a failure and the others are frozen.

use std::{path::Path, time::Duration};

use region::{FreezeMark, OwnFreezeState};

pub use crate::checkpoint::measure::{GpuUse, Measure, NvmlUse, nvml};
use crate::{
    checkpoint::{self, CheckpointApi, CheckpointError, ProcessState},
    identity::container::ContainerIdentity,
    limit::LimitError,
};

mod in_process;
mod restorable;

pub use in_process::Container;
#[cfg(test)]
pub use in_process::testing;
use in_process::{Answer, Held, Survey, Tracked};
pub use restorable::{VmmUse, of_pid};

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
        /// What was done for the others (and for the container: its lines are no process's).
        done: Vec<String>,
        /// How many processes it succeeded for (none: nothing was frozen or thawed).
        succeeded: usize,
    },
    /// The daemon's worker for it stopped on a panic (a bug).
    #[error("the freeze or thaw stopped on a panic (a bug in the agent)")]
    Panicked,
    /// The container is not frozen at all (nothing marked, no process touched): the driver's
    /// restore of these processes would fail ([`VmmUse::unrestorable`]); `why` says so per
    /// process.
    #[error("container {container}: not frozen: {}", .why.join("; "))]
    Refused { container: String, why: Vec<String> },
    /// The driver's path failed after the in-process path was tried and undone.
    #[error("{error} (after the in-process path: {})", .done.join("; "))]
    After {
        done: Vec<String>,
        error: Box<FreezeError>,
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
            succeeded: done.len(),
            done,
        })
    }
}

impl FreezeError {
    /// Whether the freeze or thaw that failed so still froze or thawed some process (and the
    /// container's mark says so).
    pub fn partly_done(&self) -> bool {
        matches!(self, FreezeError::Failed { succeeded, .. } if *succeeded > 0)
    }

    /// Whether the container was not frozen because the driver could not restore its processes
    /// ([`FreezeError::Refused`]): trying again changes nothing while they hold that memory.
    pub fn refused(&self) -> bool {
        match self {
            FreezeError::Refused { .. } => true,
            FreezeError::After { error, .. } => error.refused(),
            _ => false,
        }
    }
}

/// Freezes the pids given (`freeze --pid`) as [`freeze`] does, but a process whose limiter slot
/// says (`uses`: `None` without a slot) it holds at least half of its allocations from
/// `cuMemCreate` ([`VmmUse::unrestorable`]), which the driver could not restore: that one is not
/// frozen, a failure saying why. The checkpoint API (`api`) is loaded only if a process is to be
/// frozen.
pub fn freeze_pids<A: CheckpointApi>(
    api: impl FnOnce() -> Result<A, CheckpointError>,
    pids: &[u32],
    lock_timeout: Duration,
    uses: impl Fn(u32) -> Option<VmmUse>,
) -> Result<Vec<String>, FreezeError> {
    let (mut refused, mut rest) = (Vec::new(), Vec::new());
    for &pid in pids {
        match uses(pid).and_then(|u| u.refusal(pid)) {
            Some(why) => refused.push(why),
            None => rest.push(pid),
        }
    }
    if refused.is_empty() {
        return freeze(&api()?, pids, lock_timeout);
    }
    let outcome = if rest.is_empty() {
        Ok(Vec::new())
    } else {
        match api() {
            Ok(api) => freeze(&api, &rest, lock_timeout),
            Err(e) => Err(FreezeError::Failed {
                total: rest.len(),
                failed: rest.iter().map(|pid| format!("pid {pid}: {e}")).collect(),
                done: Vec::new(),
                succeeded: 0,
            }),
        }
    };
    let (failed, done, succeeded) = match outcome {
        Ok(done) => (Vec::new(), done.clone(), done.len()),
        Err(FreezeError::Failed {
            failed,
            done,
            succeeded,
            ..
        }) => (failed, done, succeeded),
        Err(e) => return Err(e),
    };
    Err(FreezeError::Failed {
        total: pids.len(),
        failed: refused.into_iter().chain(failed).collect(),
        done,
        succeeded,
    })
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

/// Adds `line` to what was done.
fn note(outcome: &mut Result<Vec<String>, FreezeError>, line: String) {
    match outcome {
        Ok(lines) | Err(FreezeError::Failed { done: lines, .. }) => lines.push(line),
        Err(_) => {}
    }
}

/// `said` (what the in-process path did first) before what `outcome` says.
fn after(
    said: Vec<String>,
    outcome: Result<Vec<String>, FreezeError>,
) -> Result<Vec<String>, FreezeError> {
    if said.is_empty() {
        return outcome;
    }
    match outcome {
        Ok(lines) => Ok(said.into_iter().chain(lines).collect()),
        Err(FreezeError::Failed {
            total,
            failed,
            done,
            succeeded,
        }) => Err(FreezeError::Failed {
            total,
            failed,
            done: said.into_iter().chain(done).collect(),
            succeeded,
        }),
        Err(e) => Err(FreezeError::After {
            done: said,
            error: Box::new(e),
        }),
    }
}

/// Freezes the container `id`'s processes `pids`: in-process when every process of its
/// regions can ([`Container::freeze`]), else through the driver's checkpoint API, which `api`
/// loads (only then). A container whose processes map no limiter region is frozen without a
/// mark: its calls then wait in the driver for a `thaw` by hand, which the last line says.
pub fn freeze_container<A: CheckpointApi>(
    api: impl FnOnce() -> Result<A, CheckpointError>,
    id: &str,
    pids: &[u32],
    lock_timeout: Duration,
) -> Result<Vec<String>, FreezeError> {
    freeze_found(
        Container::find(Path::new("/proc"), id, nvml())?,
        api,
        id,
        pids,
        lock_timeout,
    )
}

/// Freezes a container found (or, `None`, the processes `pids` of the container `id`, which
/// has no limiter region).
pub fn freeze_found<A: CheckpointApi>(
    found: Option<Container>,
    api: impl FnOnce() -> Result<A, CheckpointError>,
    id: &str,
    pids: &[u32],
    lock_timeout: Duration,
) -> Result<Vec<String>, FreezeError> {
    match found {
        Some(mut c) => c.freeze(api, pids, lock_timeout),
        None => {
            let api = api()?;
            let mut outcome = freeze(&api, pids, lock_timeout);
            note(
                &mut outcome,
                format!(
                    "container {id}: no limiter region: the CUDA calls wait in the driver for \
                     `vgpu-agent thaw`"
                ),
            );
            outcome
        }
    }
}

/// Thaws the container `id`: in-process if it is frozen so ([`Container::thaw`]), else its
/// processes (`pids`, listed only then) through the driver's checkpoint API (`api`, loaded
/// only then), and clears its freeze mark.
pub fn thaw_container<A: CheckpointApi>(
    api: impl FnOnce() -> Result<A, CheckpointError>,
    id: &str,
    pids: impl FnOnce() -> Result<Vec<u32>, FreezeError>,
) -> Result<Vec<String>, FreezeError> {
    thaw_found(Container::find(Path::new("/proc"), id, nvml())?, api, pids)
}

/// Thaws a container found (or, `None`, one without a limiter region: its processes only).
pub fn thaw_found<A: CheckpointApi>(
    found: Option<Container>,
    api: impl FnOnce() -> Result<A, CheckpointError>,
    pids: impl FnOnce() -> Result<Vec<u32>, FreezeError>,
) -> Result<Vec<String>, FreezeError> {
    match found {
        Some(mut c) => c.thaw(api, pids),
        None => {
            let pids = pids()?;
            thaw(&api()?, &pids)
        }
    }
}

impl Container {
    /// Freezes the container's processes `pids`. In-process when every live process of its
    /// regions has the path on and every one of `pids` has a slot there: the mark
    /// [`FreezeMark::InProcess`], then the processes' answers (each frozen, or thawed since by
    /// its own call; one that exits is left out). A process that fails, does not answer in time
    /// or, with NVML, says it froze while its device memory did not fall by half of what it
    /// says it moved, undoes it: the mark goes back to running (those that froze thaw) and the
    /// container is frozen through the driver's checkpoint API as without the path, which the
    /// lines say.
    ///
    /// Through the driver: marked first as freezing and, once a process is frozen, as frozen
    /// (none frozen: the mark is cleared).
    ///
    /// When a slot of one of `pids` says it holds at least half of its allocations from
    /// `cuMemCreate` ([`VmmUse::unrestorable`]: the driver's restore of it would fail), only
    /// in-process, and only where every process's slots say they move 90% of its allocations;
    /// otherwise not at all ([`FreezeError::Refused`]: nothing marked, `api` not loaded).
    pub fn freeze<A: CheckpointApi>(
        &mut self,
        api: impl FnOnce() -> Result<A, CheckpointError>,
        pids: &[u32],
        lock_timeout: Duration,
    ) -> Result<Vec<String>, FreezeError> {
        let survey = self.survey();
        let why = restorable::refusals(&survey.vmm, pids);
        if !why.is_empty() {
            return self.freeze_unrestorable(survey, pids, why);
        }
        let said = match Container::ready(survey, pids) {
            Ok(survey) => match self.freeze_in_process(&survey)? {
                Ok(lines) => return Ok(lines),
                Err(said) => said,
            },
            Err(_) => Vec::new(),
        };
        let outcome = api()
            .map_err(FreezeError::from)
            .and_then(|api| self.freeze_by_driver(&api, pids, lock_timeout));
        after(said, outcome)
    }

    /// A container with processes the driver cannot restore (`why` says which): frozen
    /// in-process when that path is ready for every process and each one's slots say they move
    /// at least 90% of its allocations ([`restorable::in_process_covers`]); refused otherwise,
    /// and when the in-process freeze is undone (the driver's path is no fallback for them).
    fn freeze_unrestorable(
        &mut self,
        survey: Survey,
        pids: &[u32],
        why: Vec<String>,
    ) -> Result<Vec<String>, FreezeError> {
        let refused = |container: String, why| Err(FreezeError::Refused { container, why });
        let Ok(survey) = Container::ready(survey, pids) else {
            return refused(self.id.clone(), why);
        };
        let moves: Vec<(u32, u64)> = survey
            .tracked
            .iter()
            .map(|t| (t.pid, t.own.bytes))
            .collect();
        let all: Vec<u32> = survey.tracked.iter().map(|t| t.pid).collect();
        if !all
            .iter()
            .all(|&pid| restorable::in_process_covers(&survey.vmm, &moves, pid))
        {
            return refused(self.id.clone(), why);
        }
        match self.freeze_in_process(&survey)? {
            Ok(lines) => Ok(lines),
            Err(said) => {
                let mut why = why;
                why.extend(said);
                refused(self.id.clone(), why)
            }
        }
    }

    /// The in-process freeze of the processes `survey` found: `Ok` its lines, or `Err` what it
    /// did before it was undone (the mark back to running).
    fn freeze_in_process(
        &mut self,
        survey: &Survey,
    ) -> Result<Result<Vec<String>, Vec<String>>, FreezeError> {
        let id = self.id.clone();
        let tracked = &survey.tracked;
        // Measured before the mark: what bounds the wait, and what the answers are checked
        // against.
        let before = self.measured();
        let timeout = self
            .waits
            .freeze(freeze_bytes(tracked, before.as_deref(), survey.limit));
        let generations = match self.set_mark(FreezeMark::InProcess) {
            Ok(g) => g,
            Err(e) => {
                // The blocks written are cleared again (the one refused says why).
                let _ = self.set_mark(FreezeMark::Running);
                return Err(e.into());
            }
        };
        let answers = self.wait(tracked, &generations, |_| true, timeout);
        let refuted = self.refuted(tracked, &answers, before.as_deref());
        let (mut lines, mut frozen, mut complete, mut any) = (Vec::new(), Vec::new(), true, false);
        for ((t, a), refuted) in tracked.iter().zip(answers).zip(refuted) {
            let pid = t.pid;
            lines.push(match a {
                Answer::Said(OwnFreezeState::Frozen, b) => {
                    frozen.push((t.clone(), b));
                    match refuted {
                        Some(why) => {
                            complete = false;
                            why
                        }
                        None => {
                            any = true;
                            format!(
                                "pid {pid}: frozen in-process: {} moved to host memory by the \
                                 process (the CUDA context stays on the GPU)",
                                crate::units::bytes(b)
                            )
                        }
                    }
                }
                Answer::Said(OwnFreezeState::Running, _) => {
                    any = true;
                    format!(
                        "pid {pid}: frozen in-process, then thawed by its own CUDA call (which \
                         asks for the container's thaw)"
                    )
                }
                Answer::Said(OwnFreezeState::Failed, _) => {
                    complete = false;
                    format!(
                        "pid {pid}: its in-process freeze failed (its memory stayed on the GPU)"
                    )
                }
                Answer::Gone => format!("pid {pid}: exited during the freeze"),
                Answer::Silent => {
                    complete = false;
                    format!(
                        "pid {pid}: no answer to the in-process freeze within {:.1} s",
                        timeout.as_secs_f64()
                    )
                }
            });
        }
        if complete && any {
            lines.push(format!(
                "container {id}: marked frozen in-process: each process's next CUDA call thaws \
                 it and asks a running `vgpu-agent run` to thaw the others"
            ));
            return Ok(Ok(lines));
        }
        let generations = self.set_mark(FreezeMark::Running)?;
        if complete {
            lines.push(format!(
                "container {id}: nothing frozen (its processes exited): the mark is cleared"
            ));
            return Ok(Ok(lines));
        }
        // Those that said they froze thaw at the running mark before the driver's path starts.
        let held = frozen.iter().fold(0u64, |s, (_, b)| s.saturating_add(*b));
        let thawing: Vec<Tracked> = frozen.into_iter().map(|(t, _)| t).collect();
        let pids: Vec<u32> = thawing.iter().map(|t| t.pid).collect();
        let timeout = self
            .waits
            .thaw(thaw_bytes(held, &pids, before.as_deref(), survey.limit));
        let back = self.wait(
            &thawing,
            &generations,
            |s| s == OwnFreezeState::Running,
            timeout,
        );
        for (t, a) in thawing.iter().zip(back) {
            let pid = t.pid;
            lines.push(match a {
                Answer::Said(..) => format!("pid {pid}: thawed in-process again"),
                Answer::Gone => format!("pid {pid}: exited during the thaw"),
                Answer::Silent => format!(
                    "pid {pid}: no answer to the thaw within {:.1} s (its next CUDA call thaws it)",
                    timeout.as_secs_f64()
                ),
            });
        }
        lines.push(format!(
            "container {id}: the in-process freeze did not complete: the mark is back to \
             running; freezing through the driver's checkpoint API"
        ));
        Ok(Err(lines))
    }

    /// The agent's check of each answer "frozen", where NVML listed the process with a figure
    /// before the mark (`before`) and can be read now: a process whose device memory fell by
    /// less than half of what it says it moved did not freeze as it says (a line saying so).
    /// Only once every process answered as a complete freeze does (else it is undone anyway).
    fn refuted(
        &self,
        tracked: &[Tracked],
        answers: &[Answer],
        before: Option<&[GpuUse]>,
    ) -> Vec<Option<String>> {
        let mut out = vec![None; tracked.len()];
        let complete = answers.iter().all(|a| {
            matches!(
                a,
                Answer::Gone | Answer::Said(OwnFreezeState::Frozen | OwnFreezeState::Running, _)
            )
        });
        let Some(before) = before.filter(|_| complete) else {
            return out;
        };
        let Some(after) = self.measured() else {
            return out;
        };
        for ((t, a), out) in tracked.iter().zip(answers).zip(&mut out) {
            let Answer::Said(OwnFreezeState::Frozen, moved) = *a else {
                continue;
            };
            let Held::Bytes(was) = in_process::held(before, t.pid) else {
                continue;
            };
            let now = match in_process::held(&after, t.pid) {
                Held::Bytes(b) => b,
                Held::Nothing => 0,
                Held::Unknown => continue,
            };
            let fell = was.saturating_sub(now);
            if fell.saturating_mul(2) < moved {
                *out = Some(format!(
                    "pid {}: said it moved {} to host memory, but its device memory fell by {} \
                     only (NVML: {} before the freeze, {} after its answer): taken as a failed \
                     freeze",
                    t.pid,
                    crate::units::bytes(moved),
                    crate::units::bytes(fell),
                    crate::units::bytes(was),
                    crate::units::bytes(now)
                ));
            }
        }
        out
    }

    /// The driver's path: the container marked freezing, its processes checkpointed, then
    /// marked frozen (none frozen: the mark cleared).
    fn freeze_by_driver(
        &self,
        api: &impl CheckpointApi,
        pids: &[u32],
        lock_timeout: Duration,
    ) -> Result<Vec<String>, FreezeError> {
        self.set_mark(FreezeMark::Freezing)?;
        std::thread::sleep(MARK_SETTLE);
        let mut outcome = freeze(api, pids, lock_timeout);
        let any_frozen = match &outcome {
            Ok(_) => true,
            Err(FreezeError::Failed { done, .. }) => !done.is_empty(),
            Err(_) => false,
        };
        let note_line = if any_frozen {
            self.set_mark(FreezeMark::Frozen)?;
            "marked frozen: the next CUDA call asks a running `vgpu-agent run` for the thaw"
        } else {
            self.set_mark(FreezeMark::Running)?;
            "nothing frozen: the mark is cleared"
        };
        note(&mut outcome, format!("container {}: {note_line}", self.id));
        outcome
    }

    /// Thaws the container. Frozen in-process ([`FreezeMark::InProcess`], and no block marks
    /// it frozen by the driver): the mark goes back to running and each live process with the
    /// path answers, thawed (one that does not answer in time is an error: its next CUDA call
    /// still thaws it); neither `api` nor `pids` is used. Otherwise its processes `pids` are
    /// thawed through the driver's checkpoint API `api`, then the mark is cleared (kept if a
    /// process could not be thawed: its next call still asks for the thaw).
    pub fn thaw<A: CheckpointApi>(
        &mut self,
        api: impl FnOnce() -> Result<A, CheckpointError>,
        pids: impl FnOnce() -> Result<Vec<u32>, FreezeError>,
    ) -> Result<Vec<String>, FreezeError> {
        if self.marked_in_process() {
            return self.thaw_in_process();
        }
        let pids = pids()?;
        let mut lines = thaw(&api()?, &pids)?;
        self.set_mark(FreezeMark::Running)?;
        lines.push(format!("container {}: the freeze mark is cleared", self.id));
        Ok(lines)
    }

    fn thaw_in_process(&mut self) -> Result<Vec<String>, FreezeError> {
        let Survey { tracked, limit, .. } = self.survey();
        let frozen: Vec<&Tracked> = tracked
            .iter()
            .filter(|t| t.own.state.state == OwnFreezeState::Frozen)
            .collect();
        let held = frozen
            .iter()
            .fold(0u64, |s, t| s.saturating_add(t.own.bytes));
        let pids: Vec<u32> = frozen.iter().map(|t| t.pid).collect();
        let timeout = self
            .waits
            .thaw(thaw_bytes(held, &pids, self.measured().as_deref(), limit));
        let generations = self.set_mark(FreezeMark::Running)?;
        let answers = self.wait(
            &tracked,
            &generations,
            |s| s == OwnFreezeState::Running,
            timeout,
        );
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        for (t, a) in tracked.iter().zip(answers) {
            let pid = t.pid;
            match a {
                Answer::Said(..) => done.push(match t.own.state.state {
                    OwnFreezeState::Frozen => {
                        format!("pid {pid}: thawed in-process (its memory is back on the GPU)")
                    }
                    OwnFreezeState::Running => {
                        format!("pid {pid}: already running (its own CUDA call thawed it)")
                    }
                    OwnFreezeState::Failed => {
                        format!("pid {pid}: running (its in-process freeze had failed)")
                    }
                }),
                Answer::Gone => done.push(format!("pid {pid}: exited")),
                Answer::Silent => failed.push(format!(
                    "pid {pid}: no answer to the thaw within {:.1} s (its next CUDA call still \
                     thaws it)",
                    timeout.as_secs_f64()
                )),
            }
        }
        let succeeded = done.len();
        done.push(format!("container {}: the freeze mark is cleared", self.id));
        if failed.is_empty() {
            Ok(done)
        } else {
            Err(FreezeError::Failed {
                total: tracked.len(),
                failed,
                done,
                succeeded,
            })
        }
    }
}

/// The bytes that bound a freeze's wait: the processes' device memory as NVML measured it
/// (`gpus`), or, for a process NVML gives no figure for (or all of them, without NVML), the
/// bytes it says it backs, these together at most the container's memory limit `limit`.
fn freeze_bytes(tracked: &[Tracked], gpus: Option<&[GpuUse]>, limit: Option<u64>) -> u64 {
    let (mut measured, mut said) = (0u64, 0u64);
    for t in tracked {
        match gpus.map(|g| in_process::held(g, t.pid)) {
            Some(Held::Bytes(b)) => measured = measured.saturating_add(b),
            Some(Held::Nothing) => {}
            Some(Held::Unknown) | None => said = said.saturating_add(t.own.bytes),
        }
    }
    measured.saturating_add(limit.map_or(said, |l| said.min(l)))
}

/// The bytes that bound a thaw's wait: what the processes `pids` say they hold (`said`), at
/// most the container's memory limit and, with NVML (`gpus`), the memory of the GPUs they are
/// on (what can come back to them).
fn thaw_bytes(said: u64, pids: &[u32], gpus: Option<&[GpuUse]>, limit: Option<u64>) -> u64 {
    let capacity = gpus.and_then(|g| in_process::capacity(g, pids));
    [Some(said), limit, capacity]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(said)
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
    use std::cell::{Cell, RefCell};

    use super::in_process::{
        Waits,
        testing::{Acts, GPU_MEMORY, HUGE, Tenant},
    };
    use super::*;

    const GIB: u64 = 1 << 30;

    /// The driver's checkpoint API, faked: every call succeeds (but the locks of the pids in
    /// `unlockable`, which time out) and is recorded.
    #[derive(Default)]
    struct FakeDriver {
        calls: RefCell<Vec<(&'static str, u32)>>,
        loaded: Cell<bool>,
        unlockable: Vec<u32>,
    }

    impl FakeDriver {
        /// Loads it (as `room::open` would).
        fn load(&self) -> Result<&FakeDriver, CheckpointError> {
            self.loaded.set(true);
            Ok(self)
        }

        fn record(&self, call: &'static str, pid: u32) -> Result<(), CheckpointError> {
            self.calls.borrow_mut().push((call, pid));
            Ok(())
        }
    }

    impl CheckpointApi for FakeDriver {
        fn lock(&self, pid: u32, _: Duration) -> Result<(), CheckpointError> {
            self.record("lock", pid)?;
            if self.unlockable.contains(&pid) {
                return Err(CheckpointError::Call {
                    call: "cuCheckpointProcessLock",
                    pid,
                    code: 909,
                });
            }
            Ok(())
        }
        fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
            self.record("checkpoint", pid)
        }
        fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
            self.record("restore", pid)
        }
        fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
            self.record("unlock", pid)
        }
        fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
            self.record("state", pid)?;
            Ok(ProcessState::Checkpointed)
        }
    }

    /// The pids of the processes the container has, listed only by the driver's path.
    fn no_pids() -> Result<Vec<u32>, FreezeError> {
        panic!("the in-process path lists no pids")
    }

    /// Every process of the container has the path and freezes (one exits meanwhile, and is
    /// left out): frozen in-process, the driver's checkpoint API never loaded, each process's
    /// bytes said, the mark left `InProcess` for the next call.
    #[test]
    fn a_container_whose_processes_all_freeze_in_process_never_loads_the_driver() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Freezes, Acts::Exits]);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert_eq!(
            lines,
            [
                "pid 1000: frozen in-process: 1.00 GiB moved to host memory by the process (the CUDA context stays on the GPU)".to_string(),
                "pid 1001: frozen in-process: 2.00 GiB moved to host memory by the process (the CUDA context stays on the GPU)".to_string(),
                "pid 1002: exited during the freeze".to_string(),
                "container c: marked frozen in-process: each process's next CUDA call thaws it and asks a running `vgpu-agent run` to thaw the others".to_string(),
            ]
        );
        assert!(!driver.loaded.get(), "the checkpoint API is not loaded");
        assert!(driver.calls.borrow().is_empty());
        let (mark, generation) = t.mark();
        assert_eq!(mark, FreezeMark::InProcess);
        let own = t.said(0).unwrap();
        assert_eq!(own.state.state, OwnFreezeState::Frozen);
        assert!(own.state.answers(generation));
    }

    /// A process without the path, or a GPU process with no slot, keeps the container on the
    /// driver's path: the mark is never `InProcess`.
    #[test]
    fn a_process_without_the_path_keeps_the_container_on_the_drivers_path() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Off]);
        let mut c = t.container(Duration::from_secs(30));
        assert_eq!(
            c.in_process_ready(&t.pids()).unwrap_err(),
            "pid 1001 does not use it"
        );
        let driver = FakeDriver::default();
        let pids = t.pids();
        t.answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        // Two writes of the control block (its generation goes up by 2 for each).
        assert_eq!(t.mark(), (FreezeMark::Frozen, 4), "freezing, then frozen");
        assert!(!t.marks.lock().unwrap().contains(&FreezeMark::InProcess));
        assert_eq!(driver.calls.borrow().len(), 4);
        // Both with the path on, but a GPU process of the container has no slot.
        let t = Tenant::new(&[Acts::Freezes, Acts::Freezes]);
        let mut c = t.container(Duration::from_secs(30));
        assert!(c.in_process_ready(&t.pids()).is_ok());
        let mut pids = t.pids();
        pids.push(4242);
        assert_eq!(
            c.in_process_ready(&pids).unwrap_err(),
            "pid 4242 has no slot in the container's regions"
        );
    }

    /// One process fails its in-process freeze: the mark goes back to running (the process
    /// that froze thaws, and is waited for), then the container is frozen through the driver's
    /// checkpoint API as without the path; its thaw then restores it through the driver.
    #[test]
    fn a_failed_in_process_freeze_is_undone_and_the_driver_freezes_the_container() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Fails]);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert_eq!(
            lines[1..],
            [
                "pid 1001: its in-process freeze failed (its memory stayed on the GPU)",
                "pid 1000: thawed in-process again",
                "container c: the in-process freeze did not complete: the mark is back to running; freezing through the driver's checkpoint API",
                "pid 1000: frozen (device memory in host memory, CUDA calls wait for the thaw)",
                "pid 1001: frozen (device memory in host memory, CUDA calls wait for the thaw)",
                "container c: marked frozen: the next CUDA call asks a running `vgpu-agent run` for the thaw",
            ]
        );
        assert!(
            lines[0].starts_with("pid 1000: frozen in-process"),
            "{lines:?}"
        );
        // Four writes of the control block (its generation goes up by 2 for each); the
        // processes saw the first two, answering them.
        assert_eq!(
            t.mark(),
            (FreezeMark::Frozen, 8),
            "in-process, running, freezing, frozen"
        );
        assert_eq!(
            t.marks.lock().unwrap()[..2],
            [FreezeMark::InProcess, FreezeMark::Running]
        );
        assert_eq!(
            *driver.calls.borrow(),
            [
                ("lock", 1000),
                ("checkpoint", 1000),
                ("lock", 1001),
                ("checkpoint", 1001)
            ]
        );
        // Frozen by the driver: thawed by it.
        driver.calls.borrow_mut().clear();
        let lines = c.thaw(|| driver.load(), || Ok(pids.clone())).unwrap();
        assert_eq!(
            lines.last().unwrap(),
            "container c: the freeze mark is cleared"
        );
        assert_eq!(
            *driver.calls.borrow(),
            [
                ("state", 1000),
                ("state", 1000),
                ("restore", 1000),
                ("unlock", 1000),
                ("state", 1001),
                ("state", 1001),
                ("restore", 1001),
                ("unlock", 1001)
            ]
        );
        assert_eq!(t.mark().0, FreezeMark::Running);
    }

    /// No process answers: the wait ends at its timeout, the mark goes back to running and the
    /// driver freezes the container.
    #[test]
    fn no_answer_within_the_timeout_falls_back_to_the_driver() {
        let t = Tenant::new(&[Acts::Silent, Acts::Silent]);
        let mut c = t.container(Duration::from_millis(300));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let started = std::time::Instant::now();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            lines[..3],
            [
                "pid 1000: no answer to the in-process freeze within 0.3 s",
                "pid 1001: no answer to the in-process freeze within 0.3 s",
                "container c: the in-process freeze did not complete: the mark is back to running; freezing through the driver's checkpoint API",
            ]
        );
        assert_eq!(t.marks.lock().unwrap()[0], FreezeMark::InProcess);
        assert_eq!(
            t.mark(),
            (FreezeMark::Frozen, 8),
            "in-process, running, freezing, frozen"
        );
        assert_eq!(
            driver.calls.borrow().len(),
            4,
            "both locked and checkpointed"
        );
    }

    /// A container frozen in-process is thawed by the running mark: each process answers it
    /// (the bytes it held said), no checkpoint API and no pid list; one that does not answer
    /// in time is an error line, the others thawed.
    #[test]
    fn a_thaw_in_process_writes_running_and_waits_for_each_answer() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Freezes]);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        t.answering(|| {
            c.freeze(|| driver.load(), &pids, Duration::from_secs(1))
                .unwrap();
            c.thaw(|| driver.load(), no_pids)
        })
        .map(|lines| {
            assert_eq!(
                lines,
                [
                    "pid 1000: thawed in-process (its memory is back on the GPU)",
                    "pid 1001: thawed in-process (its memory is back on the GPU)",
                    "container c: the freeze mark is cleared",
                ]
            )
        })
        .unwrap();
        let (mark, generation) = t.mark();
        assert_eq!(mark, FreezeMark::Running);
        for i in 0..2 {
            let own = t.said(i).unwrap().state;
            assert_eq!(own.state, OwnFreezeState::Running);
            assert!(
                own.answers(generation),
                "process {i} answered the thaw's mark"
            );
        }
        assert!(!driver.loaded.get());

        // One process never answers the running mark.
        let t = Tenant::new(&[Acts::Freezes, Acts::StaysFrozen]);
        let mut c = t.container(Duration::from_millis(300));
        let e = t
            .answering(|| {
                c.freeze(|| driver.load(), &pids, Duration::from_secs(1))
                    .unwrap();
                c.thaw(|| driver.load(), no_pids)
            })
            .unwrap_err();
        let FreezeError::Failed {
            total,
            failed,
            done,
            succeeded,
        } = e
        else {
            panic!("{e}")
        };
        assert_eq!((total, succeeded), (2, 1));
        assert_eq!(
            failed,
            ["pid 1001: no answer to the thaw within 0.3 s (its next CUDA call still thaws it)"]
        );
        assert_eq!(
            done,
            [
                "pid 1000: thawed in-process (its memory is back on the GPU)",
                "container c: the freeze mark is cleared",
            ]
        );
        assert_eq!(t.mark().0, FreezeMark::Running);
        assert!(!driver.loaded.get());
    }

    /// With NVML, a process that answers "frozen" while its device memory did not fall (by at
    /// least half of what it says it moved) is taken as failed: the freeze is undone and the
    /// container frozen through the driver, a line saying why. Without NVML the answer is
    /// trusted (the check needs NVML).
    #[test]
    fn with_nvml_an_answer_frozen_whose_memory_stayed_on_the_gpu_is_taken_as_failed() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Forges]).with_nvml();
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert!(
            lines[0].starts_with("pid 1000: frozen in-process"),
            "{lines:?}"
        );
        assert_eq!(
            lines[1..4],
            [
                "pid 1001: said it moved 2.00 GiB to host memory, but its device memory fell by 0 B only (NVML: 2.50 GiB before the freeze, 2.50 GiB after its answer): taken as a failed freeze",
                "pid 1000: thawed in-process again",
                "pid 1001: thawed in-process again",
            ]
        );
        assert_eq!(
            lines[4],
            "container c: the in-process freeze did not complete: the mark is back to running; freezing through the driver's checkpoint API"
        );
        assert_eq!(t.mark().0, FreezeMark::Frozen, "frozen by the driver");
        assert_eq!(
            driver.calls.borrow().len(),
            4,
            "both locked and checkpointed"
        );

        // The same processes without NVML: the answers are trusted.
        let t = Tenant::new(&[Acts::Freezes, Acts::Forges]);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert!(
            lines[1].starts_with("pid 1001: frozen in-process"),
            "{lines:?}"
        );
        assert_eq!(t.mark().0, FreezeMark::InProcess);
        assert!(!driver.loaded.get());
    }

    /// With NVML, a process that says it moved far more than it held (1 EiB) is taken as
    /// failed, though it froze: what it says is checked against what left the GPU.
    #[test]
    fn with_nvml_an_answer_claiming_huge_bytes_is_taken_as_failed() {
        let t = Tenant::new(&[Acts::Inflates]).with_nvml();
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
            .unwrap();
        assert_eq!(
            lines[0],
            "pid 1000: said it moved 1024.00 PiB to host memory, but its device memory fell by 1.00 GiB only (NVML: 1.50 GiB before the freeze, 512.00 MiB after its answer): taken as a failed freeze"
        );
        assert_eq!(t.mark().0, FreezeMark::Frozen, "frozen by the driver");
        assert!(driver.loaded.get());
    }

    /// Waits of `base`, and `per_gib` for freezes and thaws, at most a minute.
    fn waits(base: u64, per_gib: u64) -> Waits {
        Waits {
            base: Duration::from_millis(base),
            freeze_per_gib: Duration::from_millis(per_gib),
            thaw_per_gib: Duration::from_millis(per_gib),
            cap: Duration::from_secs(60),
            poll: Duration::from_millis(2),
        }
    }

    /// A process that never answers and says it backs 1 EiB keeps the freeze waiting only as
    /// long as what the agent measures allows: with NVML, its device memory (1.5 GiB: 2 GiB
    /// started); without NVML, what it says within the container's memory limit (2 GiB);
    /// neither, the cap.
    #[test]
    fn a_silent_process_claiming_huge_bytes_waits_for_what_the_agent_measures() {
        let pids = [1000];
        let freeze = |t: &Tenant| {
            let mut c = (t.finder_waiting(waits(200, 200)))("c").unwrap().unwrap();
            let driver = FakeDriver::default();
            let started = std::time::Instant::now();
            let lines = t
                .answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
                .unwrap();
            assert!(started.elapsed() < Duration::from_secs(5));
            lines[0].clone()
        };
        let t = Tenant::new(&[Acts::Silent]).with_nvml();
        t.claim(0, HUGE);
        assert_eq!(
            freeze(&t),
            "pid 1000: no answer to the in-process freeze within 0.6 s"
        );
        let t = Tenant::new(&[Acts::Silent]).with_limit(2 * GIB);
        t.claim(0, HUGE);
        assert_eq!(
            freeze(&t),
            "pid 1000: no answer to the in-process freeze within 0.6 s"
        );
        // Neither: what it says, up to the cap (not waited for here).
        let t = Tenant::new(&[Acts::Silent]);
        t.claim(0, HUGE);
        let mut c = t.container(Duration::from_secs(1));
        let survey = c.in_process_ready(&pids).unwrap();
        assert_eq!(survey.limit, None);
        let bytes = freeze_bytes(&survey.tracked, None, survey.limit);
        assert_eq!(bytes, HUGE);
        assert_eq!(Waits::DEFAULT.freeze(bytes), Duration::from_secs(60));
    }

    /// A process frozen in-process that then says it holds 1 EiB and never answers the thaw
    /// keeps the thaw waiting only for what can come back: with NVML, the memory of the GPU it
    /// is on (80 GiB); without, the container's memory limit (1 GiB).
    #[test]
    fn a_silent_thaw_claiming_huge_bytes_waits_for_what_can_come_back() {
        let pids = [1000];
        let thaw = |t: &Tenant| {
            let mut c = (t.finder_waiting(waits(200, 10)))("c").unwrap().unwrap();
            let driver = FakeDriver::default();
            t.answering(|| c.freeze(|| driver.load(), &pids, Duration::from_secs(1)))
                .unwrap();
            assert_eq!(t.mark().0, FreezeMark::InProcess);
            t.claim(0, HUGE);
            let started = std::time::Instant::now();
            let e = t
                .answering(|| c.thaw(|| driver.load(), no_pids))
                .unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(5));
            let FreezeError::Failed { failed, .. } = e else {
                panic!("{e}")
            };
            failed[0].clone()
        };
        assert_eq!(GPU_MEMORY, 80 * GIB);
        let t = Tenant::new(&[Acts::StaysFrozen]).with_nvml();
        assert_eq!(
            thaw(&t),
            "pid 1000: no answer to the thaw within 1.0 s (its next CUDA call still thaws it)"
        );
        let t = Tenant::new(&[Acts::StaysFrozen]).with_limit(GIB);
        assert_eq!(
            thaw(&t),
            "pid 1000: no answer to the thaw within 0.2 s (its next CUDA call still thaws it)"
        );
    }

    /// Through the driver, a freeze where no process could be frozen is a failure that froze
    /// nothing (the mark cleared), not a partial one; one frozen of two is partial (the mark
    /// frozen).
    #[test]
    fn a_driver_freeze_that_froze_no_process_is_no_partial_freeze() {
        let t = Tenant::new(&[Acts::Off, Acts::Off]);
        let mut c = t.container(Duration::from_secs(1));
        let pids = t.pids();
        let driver = FakeDriver {
            unlockable: pids.clone(),
            ..FakeDriver::default()
        };
        let e = c
            .freeze(|| driver.load(), &pids, Duration::from_secs(1))
            .unwrap_err();
        assert!(!e.partly_done(), "{e}");
        let FreezeError::Failed {
            total,
            failed,
            done,
            succeeded,
        } = e
        else {
            panic!("not a per-process failure")
        };
        assert_eq!((total, failed.len(), succeeded), (2, 2, 0));
        assert_eq!(done, ["container c: nothing frozen: the mark is cleared"]);
        assert_eq!(t.mark().0, FreezeMark::Running);

        let driver = FakeDriver {
            unlockable: vec![1001],
            ..FakeDriver::default()
        };
        let e = c
            .freeze(|| driver.load(), &pids, Duration::from_secs(1))
            .unwrap_err();
        assert!(e.partly_done(), "{e}");
        assert_eq!(t.mark().0, FreezeMark::Frozen);

        // Without a limiter region, the same.
        let driver = FakeDriver {
            unlockable: pids.clone(),
            ..FakeDriver::default()
        };
        let e =
            freeze_found(None, || driver.load(), "c", &pids, Duration::from_secs(1)).unwrap_err();
        assert!(!e.partly_done(), "{e}");
    }

    /// A process whose slot says it holds at least half of its allocations from `cuMemCreate`
    /// (JAX's default allocator) keeps its container from being frozen at all: on the driver's
    /// path (its restore would fail with CUDA error 304) and on the in-process path alike,
    /// nothing marked, the checkpoint API not loaded, the refusal saying what to do.
    #[test]
    fn a_container_with_a_process_holding_half_its_memory_from_cu_mem_create_is_not_frozen() {
        // Through the driver: one process holds exactly half from cuMemCreate.
        let t = Tenant::new(&[Acts::Off, Acts::Off]);
        t.holds(0, 4 * GIB, 2 * GIB);
        t.holds(1, GIB, 0);
        assert!(!t.marked());
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let pids = t.pids();
        let e = c
            .freeze(|| driver.load(), &pids, Duration::from_secs(1))
            .unwrap_err();
        assert!(e.refused() && !e.partly_done(), "{e}");
        let FreezeError::Refused { container, why } = &e else {
            panic!("{e}")
        };
        assert_eq!(container, "c");
        assert_eq!(
            why,
            &[
                "pid 1000 holds 2.00 GiB of its 4.00 GiB of device memory from cuMemCreate (JAX's \
                 default allocator, PyTorch's expandable segments); the driver's restore of such \
                 a process fails (CUDA error 304 on driver 580: the process stays frozen until it \
                 is killed), so it is not frozen: run it under the limiter with \
                 VGPU_FREEZE_IN_PROCESS=1 (its memory then moves in-process), or for JAX set \
                 XLA_PYTHON_CLIENT_ALLOCATOR=platform in its environment"
            ]
        );
        assert!(
            e.to_string()
                .starts_with("container c: not frozen: pid 1000 holds 2.00 GiB"),
            "{e}"
        );
        assert!(!driver.loaded.get(), "the checkpoint API is not loaded");
        assert!(!t.marked(), "nothing marked");

        // In-process, where the slot says it moves less than 90% of its allocations (the
        // limiter would refuse): not taken either.
        let t = Tenant::new(&[Acts::Freezes]);
        t.holds(0, GIB, GIB);
        t.claim(0, GIB / 10 * 8);
        let mut c = t.container(Duration::from_secs(30));
        let e = t
            .answering(|| c.freeze(|| driver.load(), &[1000], Duration::from_secs(1)))
            .unwrap_err();
        assert!(e.refused(), "{e}");
        assert!(!t.marked(), "no in-process mark");
        assert!(t.marks.lock().unwrap().is_empty());
        assert!(!driver.loaded.get());
    }

    /// A container whose process holds its memory from `cuMemCreate` (JAX's default allocator)
    /// takes the in-process path when every process has it on and says it moves 90% of its
    /// allocations or more (the memory it maps itself included); one such process that fails
    /// its freeze leaves the container running and refused (the driver's path is no fallback
    /// for it), the checkpoint API never loaded.
    #[test]
    fn a_container_holding_its_memory_from_cu_mem_create_is_frozen_in_process_when_it_moves() {
        let t = Tenant::new(&[Acts::Freezes, Acts::Freezes]);
        t.holds(0, GIB, GIB);
        t.holds(1, 2 * GIB, 0);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let lines = t
            .answering(|| c.freeze(|| driver.load(), &t.pids(), Duration::from_secs(1)))
            .unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("pid 1000: frozen in-process")),
            "{lines:?}"
        );
        assert_eq!(t.mark().0, FreezeMark::InProcess);
        assert!(!driver.loaded.get(), "the checkpoint API is not loaded");

        // A process without the path: refused as before.
        let t = Tenant::new(&[Acts::Freezes, Acts::Off]);
        t.holds(0, GIB, GIB);
        let mut c = t.container(Duration::from_secs(30));
        let e = t
            .answering(|| c.freeze(|| driver.load(), &t.pids(), Duration::from_secs(1)))
            .unwrap_err();
        assert!(e.refused(), "{e}");
        assert!(!t.marked());

        // Its freeze fails: the mark goes back to running, the container is refused.
        let t = Tenant::new(&[Acts::Fails]);
        t.holds(0, GIB, GIB);
        let mut c = t.container(Duration::from_secs(30));
        let e = t
            .answering(|| c.freeze(|| driver.load(), &[1000], Duration::from_secs(1)))
            .unwrap_err();
        assert!(e.refused(), "{e}");
        assert!(
            e.to_string().contains("pid 1000 holds 1.00 GiB"),
            "the reason stays: {e}"
        );
        assert_eq!(t.mark().0, FreezeMark::Running);
        assert!(!driver.loaded.get());
    }

    /// A process holding less than half from `cuMemCreate` (NCCL's buffers beside a large
    /// `cuMemAlloc` heap), or a GPU process of the container with no slot (nothing known), is
    /// frozen as before.
    #[test]
    fn a_process_holding_less_than_half_from_cu_mem_create_is_frozen_as_before() {
        let t = Tenant::new(&[Acts::Off]);
        t.holds(0, 16 * GIB, 64 << 20);
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        let lines = c
            .freeze(|| driver.load(), &[1000, 4242], Duration::from_secs(1))
            .unwrap();
        assert_eq!(
            lines.last().unwrap(),
            "container c: marked frozen: the next CUDA call asks a running `vgpu-agent run` for the thaw"
        );
        assert_eq!(
            *driver.calls.borrow(),
            [
                ("lock", 1000),
                ("checkpoint", 1000),
                ("lock", 4242),
                ("checkpoint", 4242)
            ]
        );
        assert_eq!(t.mark().0, FreezeMark::Frozen);
        // Just below half: frozen too.
        let t = Tenant::new(&[Acts::Off]);
        t.holds(0, 4 * GIB, 2 * GIB - (2 << 20));
        let mut c = t.container(Duration::from_secs(30));
        let driver = FakeDriver::default();
        c.freeze(|| driver.load(), &[1000], Duration::from_secs(1))
            .unwrap();
        assert_eq!(t.mark().0, FreezeMark::Frozen);
    }

    /// `freeze --pid`: a pid whose slot says it holds half or more from `cuMemCreate` is a
    /// failure saying why, the others are frozen (a pid without a slot too); when every pid is
    /// refused the checkpoint API is not loaded.
    #[test]
    fn freeze_by_pid_refuses_a_process_holding_half_from_cu_mem_create_and_freezes_the_others() {
        let uses = |pid| match pid {
            1 => Some(VmmUse {
                created: 3 * GIB,
                allocations: 4 * GIB,
            }),
            2 => Some(VmmUse {
                created: 64 << 20,
                allocations: 8 * GIB,
            }),
            _ => None,
        };
        let driver = FakeDriver::default();
        let e =
            freeze_pids(|| driver.load(), &[1, 2, 3], Duration::from_secs(1), uses).unwrap_err();
        let FreezeError::Failed {
            total,
            failed,
            done,
            succeeded,
        } = e
        else {
            panic!("not a per-process failure")
        };
        assert_eq!((total, succeeded), (3, 2));
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].starts_with(
                "pid 1 holds 3.00 GiB of its 4.00 GiB of device memory from cuMemCreate"
            ),
            "{failed:?}"
        );
        assert!(failed[0].ends_with("XLA_PYTHON_CLIENT_ALLOCATOR=platform in its environment"));
        assert_eq!(
            done,
            [
                "pid 2: frozen (device memory in host memory, CUDA calls wait for the thaw)",
                "pid 3: frozen (device memory in host memory, CUDA calls wait for the thaw)",
            ]
        );
        assert!(driver.calls.borrow().iter().all(|(_, pid)| *pid != 1));

        let driver = FakeDriver::default();
        let e = freeze_pids(|| driver.load(), &[1], Duration::from_secs(1), uses).unwrap_err();
        assert!(!e.partly_done(), "{e}");
        assert!(
            !driver.loaded.get(),
            "nothing to freeze: the API is not loaded"
        );
        // None refused: as `freeze`.
        let driver = FakeDriver::default();
        let lines = freeze_pids(|| driver.load(), &[2, 3], Duration::from_secs(1), uses).unwrap();
        assert_eq!(lines.len(), 2);
    }

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
            succeeded,
        } = r.unwrap_err()
        else {
            panic!("not a per-process failure");
        };
        assert_eq!((total, succeeded), (3, 2));
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
