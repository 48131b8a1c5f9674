//! The loans out: one per process at most, each watched until it ends. A loan ends when its
//! process's slot answers the mark it borrowed for, or a later one, with anything but `Frozen`
//! (it thawed, or its freeze failed: either way it copied back from the loan already), when the
//! process is gone, or when its pid names another process (its start time changed). Until then
//! it stays, however long: a process that never answers keeps its loan until it exits (one loan,
//! at most what it held on the GPU plus a chunk), because taking back the memory of a process
//! still frozen would lose its data.

use std::{collections::HashMap, time::Instant};

use region::{OwnFreeze, OwnFreezeState};

use super::{chunk::Chunk, decide::answers_at_least};

/// How often each loan's process is looked at.
pub(super) const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The borrowing process, as a look found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Process {
    /// Gone (or a zombie: its memory and its driver's pins are gone with it).
    Gone,
    /// Running, started at these clock ticks after boot (`/proc/<pid>/stat` field 22).
    Started(u64),
}

/// One look at a borrower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Look {
    pub process: Process,
    /// What its slot answers (`None`: the slot was not read, is not its own any more, or says
    /// nothing a limiter writes).
    pub answer: Option<OwnFreeze>,
}

/// Why a loan ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// The process answered the mark (or a later one) with this state.
    Answered(OwnFreezeState),
    Exited,
    /// The pid names a process started at another time: the borrower exited.
    PidReused,
}

impl End {
    pub fn said(self) -> &'static str {
        match self {
            End::Answered(OwnFreezeState::Running) => "it thawed",
            End::Answered(OwnFreezeState::Failed) => "its freeze failed",
            End::Answered(OwnFreezeState::Frozen) => "it answered",
            End::Exited => "it exited",
            End::PidReused => "it exited (its pid names another process)",
        }
    }
}

/// Whether the loan made to the process started at `start`, for the mark of `generation`, has
/// ended by what `look` found.
pub(super) fn ended(generation: u64, start: u64, look: &Look) -> Option<End> {
    match look.process {
        Process::Gone => return Some(End::Exited),
        Process::Started(s) if s != start => return Some(End::PidReused),
        Process::Started(_) => {}
    }
    let answer = look.answer?;
    (answers_at_least(answer, generation) && answer.state != OwnFreezeState::Frozen)
        .then_some(End::Answered(answer.state))
}

/// Looks at one borrower (its process and its slot), bounded in time by what it reads.
pub(super) trait Watch: Send {
    fn look(&mut self) -> Look;
}

/// A loan out.
pub(super) struct Loan {
    /// Tells this loan from a later one of the same pid.
    pub id: u64,
    pub start: u64,
    pub container: Option<String>,
    /// The control generation of the `InProcess` mark it was lent for.
    pub generation: u64,
    pub chunks: Vec<Chunk>,
    pub since: Instant,
}

/// The loans out, by pid.
#[derive(Default)]
pub(super) struct Book {
    loans: HashMap<u32, Loan>,
    next_id: u64,
}

impl Book {
    pub fn get(&self, pid: u32) -> Option<&Loan> {
        self.loans.get(&pid)
    }

    /// Records a loan to `pid` (which holds none); its id.
    pub fn insert(
        &mut self,
        pid: u32,
        start: u64,
        container: Option<String>,
        generation: u64,
        chunks: Vec<Chunk>,
    ) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.loans.insert(
            pid,
            Loan {
                id,
                start,
                container,
                generation,
                chunks,
                since: Instant::now(),
            },
        );
        id
    }

    /// Takes out `pid`'s loan if it is loan `id` (`None` for a loan that ended already).
    pub fn remove(&mut self, pid: u32, id: u64) -> Option<Loan> {
        if self.loans.get(&pid)?.id != id {
            return None;
        }
        self.loans.remove(&pid)
    }

    /// Loans out, and their chunks.
    pub fn out(&self) -> (usize, usize) {
        (
            self.loans.len(),
            self.loans.values().map(|l| l.chunks.len()).sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(state: OwnFreezeState, generation: u64) -> Look {
        Look {
            process: Process::Started(100),
            answer: Some(OwnFreeze { state, generation }),
        }
    }

    /// A loan for the mark of generation 8 to the process started at tick 100 ends once its
    /// slot answers generation 8 or later with anything but `Frozen`, or the process is gone or
    /// another; while it is frozen, silent or its slot unread it stays.
    #[test]
    fn a_loan_ends_at_a_thaw_or_failure_answered_at_exit_or_pid_reuse_only() {
        use OwnFreezeState::*;
        assert_eq!(
            ended(8, 100, &answered(Running, 8)),
            Some(End::Answered(Running)),
            "thawed at a CUDA call: its mark's generation, running"
        );
        assert_eq!(
            ended(8, 100, &answered(Running, 10)),
            Some(End::Answered(Running)),
            "thawed by the agent's running mark"
        );
        assert_eq!(
            ended(8, 100, &answered(Failed, 8)),
            Some(End::Answered(Failed))
        );
        assert_eq!(
            ended(8, 100, &answered(Frozen, 8)),
            None,
            "frozen in the loan"
        );
        assert_eq!(
            ended(8, 100, &answered(Frozen, 10)),
            None,
            "a later mark answered while still frozen (its data is in the loan)"
        );
        assert_eq!(
            ended(8, 100, &answered(Running, 6)),
            None,
            "an answer of an earlier mark"
        );
        assert_eq!(ended(8, 100, &answered(Failed, 6)), None);
        let silent = Look {
            process: Process::Started(100),
            answer: None,
        };
        assert_eq!(ended(8, 100, &silent), None, "silent, or its slot unread");
        let gone = Look {
            process: Process::Gone,
            answer: None,
        };
        assert_eq!(ended(8, 100, &gone), Some(End::Exited));
        let reused = Look {
            process: Process::Started(101),
            answer: Some(OwnFreeze {
                state: Frozen,
                generation: 8,
            }),
        };
        assert_eq!(ended(8, 100, &reused), Some(End::PidReused));
    }
}
