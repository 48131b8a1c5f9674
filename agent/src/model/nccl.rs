//! NCCL communicators across processes: the ranks of one communicator live in different
//! processes (one per GPU under torchrun), each with its own `ncclComm_t`; NCCL's communicator
//! id ([`super::Communicator::comm_id`]) is what they share. Views group them with
//! [`Snapshot::communicator_groups`].

use std::collections::BTreeMap;

use super::{Communicator, ProcessKey, Snapshot};

/// One rank of a communicator: the process that holds it and what it did.
#[derive(Clone, Debug, PartialEq)]
pub struct Rank<'a> {
    pub process: ProcessKey,
    pub communicator: &'a Communicator,
}

/// The ranks of one communicator that these processes hold, in rank order.
#[derive(Clone, Debug, PartialEq)]
pub struct CommunicatorGroup<'a> {
    /// NCCL's communicator id; `None` for a communicator whose id was not seen (it is a group
    /// of its own).
    pub comm_id: Option<&'a str>,
    /// The communicator's size, as its ranks said at creation.
    pub nranks: Option<u32>,
    pub ranks: Vec<Rank<'a>>,
}

impl CommunicatorGroup<'_> {
    pub fn calls(&self) -> u64 {
        self.ranks.iter().map(|r| r.communicator.calls).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.ranks.iter().map(|r| r.communicator.bytes).sum()
    }
}

impl Snapshot {
    /// The communicators of these processes, grouped by NCCL's communicator id: groups with an
    /// id first (by id), then the others (by process, then `ncclComm_t`). Destroyed ones are
    /// left out.
    pub fn communicator_groups(&self, keys: &[ProcessKey]) -> Vec<CommunicatorGroup<'_>> {
        let mut by_id: BTreeMap<&str, CommunicatorGroup<'_>> = BTreeMap::new();
        let mut alone = Vec::new();
        for p in keys.iter().filter_map(|k| self.process(*k)) {
            for c in p.communicators.iter().filter(|c| !c.destroyed) {
                let rank = Rank {
                    process: p.key,
                    communicator: c,
                };
                match c.comm_id.as_deref() {
                    Some(id) => {
                        let g = by_id.entry(id).or_insert(CommunicatorGroup {
                            comm_id: Some(id),
                            nranks: None,
                            ranks: vec![],
                        });
                        g.nranks = g.nranks.max(c.nranks);
                        g.ranks.push(rank);
                    }
                    None => alone.push(CommunicatorGroup {
                        comm_id: None,
                        nranks: c.nranks,
                        ranks: vec![rank],
                    }),
                }
            }
        }
        let mut out: Vec<CommunicatorGroup<'_>> = by_id.into_values().collect();
        for g in &mut out {
            g.ranks
                .sort_by_key(|r| (r.communicator.rank.unwrap_or(u32::MAX), r.process));
        }
        out.extend(alone);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Process;

    fn comm(addr: &str, id: Option<&str>, rank: u32, calls: u64) -> Communicator {
        Communicator {
            comm: addr.into(),
            comm_id: id.map(Into::into),
            rank: Some(rank),
            nranks: Some(2),
            created_by: Some("ncclCommInitRankConfig".into()),
            destroyed: false,
            calls,
            errors: 0,
            bytes: calls * 4096,
            probed_calls: None,
        }
    }

    fn snapshot(procs: Vec<(u32, Vec<Communicator>)>) -> Snapshot {
        let mut s = crate::tui::fixture::empty();
        for (pid, communicators) in procs {
            let mut p = Process::with_apis(vec![]);
            p.key.pid = pid;
            p.communicators = communicators;
            s.processes.push(p);
        }
        s
    }

    #[test]
    fn two_ranks_in_two_processes_are_one_communicator() {
        let s = snapshot(vec![
            (11, vec![comm("0x55aa00", Some("0xfeed"), 1, 30)]),
            (10, vec![comm("0x7f0100", Some("0xfeed"), 0, 30)]),
        ]);
        let keys: Vec<ProcessKey> = s.processes.iter().map(|p| p.key).collect();
        let g = s.communicator_groups(&keys);
        assert_eq!(g.len(), 1, "{g:#?}");
        assert_eq!(g[0].comm_id, Some("0xfeed"));
        assert_eq!(g[0].nranks, Some(2));
        let ranks: Vec<(Option<u32>, u32, &str)> = g[0]
            .ranks
            .iter()
            .map(|r| {
                (
                    r.communicator.rank,
                    r.process.pid,
                    r.communicator.comm.as_str(),
                )
            })
            .collect();
        assert_eq!(
            ranks,
            [(Some(0), 10, "0x7f0100"), (Some(1), 11, "0x55aa00")]
        );
        assert_eq!((g[0].calls(), g[0].bytes()), (60, 60 * 4096));
    }

    #[test]
    fn equal_addresses_in_two_processes_are_not_merged_and_unknown_ids_stand_alone() {
        // The same ncclComm_t address in two processes is a coincidence, not one communicator.
        let s = snapshot(vec![
            (10, vec![comm("0x10000", Some("0xa"), 0, 1)]),
            (11, vec![comm("0x10000", Some("0xb"), 0, 1)]),
            (
                12,
                vec![comm("0x10000", None, 0, 1), {
                    let mut c = comm("0x20000", Some("0xa"), 1, 1);
                    c.destroyed = true;
                    c
                }],
            ),
        ]);
        let keys: Vec<ProcessKey> = s.processes.iter().map(|p| p.key).collect();
        let g = s.communicator_groups(&keys);
        let shape: Vec<(Option<&str>, usize)> =
            g.iter().map(|g| (g.comm_id, g.ranks.len())).collect();
        assert_eq!(shape, [(Some("0xa"), 1), (Some("0xb"), 1), (None, 1)]);
        // Only the processes asked for.
        assert!(s.communicator_groups(&keys[..1]).len() == 1);
    }
}
