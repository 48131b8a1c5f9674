//! What a command reports: the calls it made, counted per entry point and result, printed as one
//! line of JSON.

use std::collections::{BTreeMap, BTreeSet};

use agent_common::api::ApiId;
use serde::Serialize;

use crate::driver::CUresult;

/// Calls of one entry point.
#[derive(Default, Serialize)]
pub(crate) struct Stat {
    calls: u64,
    /// Calls whose result was not CUDA_SUCCESS.
    errors: u64,
    /// Sum of the size argument (APIs whose spec in agent_common::api has a size_arg).
    bytes: u64,
    /// Calls per result code.
    codes: BTreeMap<String, u64>,
}

#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) calls: BTreeMap<String, Stat>,
    pub(crate) missing: BTreeSet<String>,
}

impl Recorder {
    /// Records one call of `name` that passed `size` as its size argument (`None`: not exported).
    pub(crate) fn record(&mut self, name: &str, r: Option<CUresult>, size: u64) {
        let sized = ApiId::from_name(name)
            .and_then(|id| id.spec())
            .is_some_and(|sp| sp.size_arg.is_some());
        self.record_bytes(name, r, if sized { size } else { 0 });
    }

    /// Records one call of `name` that moved `bytes` (`None`: not exported).
    pub(crate) fn record_bytes(&mut self, name: &str, r: Option<CUresult>, bytes: u64) {
        let Some(rc) = r else {
            self.missing.insert(name.to_string());
            return;
        };
        let s = self.calls.entry(name.to_string()).or_default();
        s.calls += 1;
        s.errors += u64::from(rc != 0);
        s.bytes += bytes;
        *s.codes.entry(rc.to_string()).or_default() += 1;
    }
}

/// Prints a command's result: one line of JSON.
pub(crate) fn print(v: serde_json::Value) {
    println!("{v}");
}
