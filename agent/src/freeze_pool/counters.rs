//! What the pool did since the daemon started, for the model (`agent.freeze_pool`) and
//! `/metrics`: loans made, and refusals by reason.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use region::freeze_pool::Status;

/// Why a connection got no loan, besides the reply's refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dropped {
    /// The bytes were not a request (another protocol, a version, garbage, cut short).
    BadRequest,
    /// No whole request within the exchange's time.
    Timeout,
    /// Closed at once: the connection caps were reached.
    Busy,
}

/// The reason's name in the model and the `reason` label.
pub(super) fn reason(status: Status) -> &'static str {
    match status {
        Status::Lent => "lent",
        Status::NotFreezing => "not_freezing",
        Status::AlreadyLent => "already_lent",
        Status::Empty => "empty",
        Status::TooMuch => "too_much",
        Status::Unknown => "unknown",
    }
}

impl Dropped {
    fn name(self) -> &'static str {
        match self {
            Dropped::BadRequest => "bad_request",
            Dropped::Timeout => "timeout",
            Dropped::Busy => "busy",
        }
    }
}

#[derive(Default)]
pub(super) struct Counters {
    loans: AtomicU64,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counters {
    pub fn lent(&self) {
        // Relaxed: a count for the model, read on its own.
        self.loans.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self, status: Status) {
        self.count(reason(status));
    }

    pub fn dropped(&self, why: Dropped) {
        self.count(why.name());
    }

    fn count(&self, reason: &'static str) {
        *self
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(reason)
            .or_default() += 1;
    }

    /// Loans made, and refusals by reason.
    pub fn now(&self) -> (u64, BTreeMap<String, u64>) {
        let refusals = self
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect();
        (self.loans.load(Ordering::Relaxed), refusals)
    }
}
