//! The read budget of one snapshot (see the parent module's documentation).

use std::time::{Duration, Instant};

use super::snapshot::BudgetLimit;

/// What one snapshot of a region may cost before the rest is reported unread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBudget {
    /// Wall time for the whole region.
    pub time: Duration,
    /// Copies of a shard or record beyond its first (seqlock retries), for the whole region.
    pub retries: u64,
}

impl ReadBudget {
    /// The default: 100 ms and 16,384 retries. A healthy region of 128 slots with every shard
    /// used reads in a few milliseconds with a handful of retries (`snapshot_bench`); a record
    /// costs about 1 us to copy again, so the retries end a region of stuck records in tens of
    /// milliseconds, and the time bounds a slow file.
    pub const DEFAULT: ReadBudget = ReadBudget {
        time: Duration::from_millis(100),
        retries: 16_384,
    };
}

impl Default for ReadBudget {
    fn default() -> ReadBudget {
        ReadBudget::DEFAULT
    }
}

/// What is left of a [`ReadBudget`] during one snapshot.
pub(crate) struct Spend {
    deadline: Instant,
    retries_left: u64,
    pub(crate) out: Option<BudgetLimit>,
}

impl Spend {
    pub(crate) fn new(budget: &ReadBudget) -> Spend {
        Spend {
            deadline: Instant::now() + budget.time,
            retries_left: budget.retries,
            out: None,
        }
    }

    /// Takes `n` retries; false (from then on) once the retries or the time ran out.
    pub(crate) fn retry(&mut self, n: u64) -> bool {
        if self.out.is_none() {
            match self.retries_left.checked_sub(n) {
                Some(left) => self.retries_left = left,
                None => {
                    self.retries_left = 0;
                    self.out = Some(BudgetLimit::Retries);
                }
            }
        }
        self.in_time()
    }

    /// False (from then on) once the time or the retries ran out.
    pub(crate) fn in_time(&mut self) -> bool {
        if self.out.is_none() && Instant::now() >= self.deadline {
            self.out = Some(BudgetLimit::Time);
        }
        self.out.is_none()
    }
}
