//! Which processes the driver's checkpoint API can freeze and bring back (docs/oversubscription.md,
//! "On a GPU"): on driver 580, `cuCheckpointProcessRestore` of a process that holds its device
//! memory from the virtual memory API (`cuMemCreate` + `cuMemMap`: JAX's default allocator,
//! PyTorch's expandable segments) fails with CUDA error 304 and the process stays frozen until it
//! is killed. So a process whose live `cuMemCreate` bytes are at least half of what its
//! allocations hold is not frozen through the driver; its container takes the limiter's
//! in-process path where that path can move it ([`in_process_covers`]: its slot says it moves at
//! least 90% of its allocations, the memory it maps itself included), and is not frozen at all
//! otherwise.
//!
//! The figures are the process's limiter slot's ([`VmmUse::of`]): the bytes its `cuMemCreate`
//! calls allocated less those its `cuMemRelease` calls freed (the limiter counts a handle's charge
//! in both), against the bytes the slot holds beyond its contexts. They are the tenant's words: a
//! forged figure can only keep its own process (and container) from being frozen. A process
//! without a slot (not under the limiter) is frozen as before: nothing is known of it.

use std::path::Path;

use agent_common::api::ApiId;
use region::reader::{ReadBudget, RegionReader, SlotPhase, SlotSnapshot};

use crate::{collector::processes::ProcessTable, limit};

/// What a process's limiter slot says of its device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmmUse {
    /// Live bytes from `cuMemCreate`: allocated by it less freed by `cuMemRelease`.
    pub created: u64,
    /// What its allocations hold: the slot's held bytes less its contexts' charges.
    pub allocations: u64,
}

/// `cuMemCreate`, whose bytes allocated the limiter counts per handle.
const CREATE: ApiId = ApiId::from_name("cuMemCreate").expect("a traced API");
/// `cuMemRelease`, whose bytes freed are the handles' charges returned.
const RELEASE: ApiId = ApiId::from_name("cuMemRelease").expect("a traced API");

impl VmmUse {
    /// What `slot` says (every device together).
    pub fn of(slot: &SlotSnapshot) -> VmmUse {
        let bytes = |api: ApiId, pick: fn(&region::reader::ApiStats) -> u64| {
            slot.apis
                .iter()
                .filter(|a| a.api == api)
                .fold(0u64, |s, a| s.saturating_add(pick(a)))
        };
        let created = bytes(CREATE, |a| a.bytes_allocated);
        let released = bytes(RELEASE, |a| a.bytes_freed);
        let sum = |v: &[u64]| v.iter().fold(0u64, |s, b| s.saturating_add(*b));
        VmmUse {
            created: created.saturating_sub(released),
            allocations: sum(&slot.held).saturating_sub(sum(&slot.context_bytes)),
        }
    }

    /// Both figures of `self` and `other` (a process with slots in several regions).
    pub fn add(self, other: VmmUse) -> VmmUse {
        VmmUse {
            created: self.created.saturating_add(other.created),
            allocations: self.allocations.saturating_add(other.allocations),
        }
    }

    /// Whether the driver's restore of the process would fail: its live `cuMemCreate` bytes are
    /// at least half of what its allocations hold.
    pub fn unrestorable(&self) -> bool {
        self.created > 0 && self.created.saturating_mul(2) >= self.allocations
    }

    /// Why process `pid` is not frozen, if it is not (see [`VmmUse::unrestorable`]).
    pub fn refusal(&self, pid: u32) -> Option<String> {
        self.unrestorable().then(|| {
            format!(
                "pid {pid} holds {} of its {} of device memory from cuMemCreate (JAX's default \
                 allocator, PyTorch's expandable segments); the driver's restore of such a \
                 process fails (CUDA error 304 on driver 580: the process stays frozen until it \
                 is killed), so it is not frozen: run it under the limiter with \
                 VGPU_FREEZE_IN_PROCESS=1 (its memory then moves in-process), or for JAX set \
                 XLA_PYTHON_CLIENT_ALLOCATOR=platform in its environment",
                crate::units::bytes(self.created),
                crate::units::bytes(self.allocations)
            )
        })
    }
}

/// Why each of `pids` is not frozen, by what `uses` (each process's host pid and what one of its
/// slots says) says of it; a pid with no slot there is not refused.
pub fn refusals(uses: &[(u32, VmmUse)], pids: &[u32]) -> Vec<String> {
    pids.iter()
        .filter_map(|&pid| {
            let mut mine = uses.iter().filter(|(p, _)| *p == pid).map(|(_, u)| *u);
            let first = mine.next()?;
            mine.fold(first, VmmUse::add).refusal(pid)
        })
        .collect()
}

/// The share of its allocations a process's in-process freeze must move for the agent to take
/// that path for a process the driver cannot restore: the limiter's own rule (it refuses below
/// it, `limiter/src/runtime/own_freeze`).
const IN_PROCESS_PERCENT: u64 = 90;

/// Whether process `pid`'s in-process freeze moves enough of it: the bytes its slots say can move
/// (`moves`: host pid, a slot's `own_freeze` bytes) are at least [`IN_PROCESS_PERCENT`] of what
/// its allocations hold (`uses`), as its limiter's rule. A process with no figures is not.
pub fn in_process_covers(uses: &[(u32, VmmUse)], moves: &[(u32, u64)], pid: u32) -> bool {
    let mut mine = uses.iter().filter(|(p, _)| *p == pid).map(|(_, u)| *u);
    let Some(first) = mine.next() else {
        return false;
    };
    let held = mine.fold(first, VmmUse::add).allocations;
    let moved = moves
        .iter()
        .filter(|(p, _)| *p == pid)
        .fold(0u64, |s, (_, b)| s.saturating_add(*b));
    moved.saturating_mul(100) >= held.saturating_mul(IN_PROCESS_PERCENT)
}

/// What the live slots of the process `owner` (its pid namespace, pid there and start time)
/// say in `slots`, if it has one.
pub fn of_owner<'a>(
    slots: impl IntoIterator<Item = &'a SlotSnapshot>,
    owner: (u64, u32, u64),
) -> Option<VmmUse> {
    slots
        .into_iter()
        .filter(|s| s.phase == SlotPhase::Live && (s.pid_ns, s.pid, s.start_time) == owner)
        .map(VmmUse::of)
        .reduce(VmmUse::add)
}

/// What the slots of the process `pid` (under `proc`) say in the regions it maps (each read
/// within the collector's read budget); `None`: it maps no region, or has no slot there.
pub fn of_pid(proc: &Path, pid: u32) -> Option<VmmUse> {
    let mut table = ProcessTable::new(proc);
    let info = table.get(pid)?;
    let (ns, inner) = info.namespace_pid?;
    let owner = (ns, inner, info.facts.start_ticks);
    limit::process_regions(proc, pid)
        .into_iter()
        .filter_map(|r| {
            let reader = RegionReader::from_file(r.open_region().ok()?).ok()?;
            let snap = reader.snapshot_within(&ReadBudget::DEFAULT).ok()?;
            of_owner(&snap.slots, owner)
        })
        .reduce(VmmUse::add)
}

#[cfg(test)]
mod tests {
    use region::{Region, RegionConfig};

    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// The in-process path takes a process the driver cannot restore when its slots say they
    /// move 90% of its allocations or more (every slot of it together), not below, nor without
    /// figures.
    #[test]
    fn the_in_process_path_covers_a_process_moving_nine_tenths_of_its_allocations() {
        let uses = [
            (
                1,
                VmmUse {
                    created: 3 * GIB,
                    allocations: 4 * GIB,
                },
            ),
            (
                1,
                VmmUse {
                    created: 0,
                    allocations: 6 * GIB,
                },
            ),
        ];
        assert!(in_process_covers(&uses, &[(1, 9 * GIB)], 1));
        assert!(in_process_covers(&uses, &[(1, 5 * GIB), (1, 4 * GIB)], 1));
        assert!(!in_process_covers(&uses, &[(1, 9 * GIB - 1)], 1));
        assert!(!in_process_covers(&uses, &[(2, 10 * GIB)], 1), "another's");
        assert!(!in_process_covers(&uses, &[(2, 10 * GIB)], 2), "no figures");
    }

    /// Exactly half of the allocations from `cuMemCreate` is refused, anything less is not;
    /// nothing from it never is, and a figure past the allocations (a forged one) is.
    #[test]
    fn half_of_the_allocations_from_cu_mem_create_or_more_is_refused_less_is_not() {
        let u = |created, allocations| VmmUse {
            created,
            allocations,
        };
        assert!(u(2 * GIB, 4 * GIB).unrestorable(), "exactly half");
        assert!(!u(2 * GIB - 1, 4 * GIB).unrestorable(), "just below half");
        assert!(u(4 * GIB, 4 * GIB).unrestorable(), "all of it (JAX)");
        assert!(
            !u(64 * MIB, 16 * GIB).unrestorable(),
            "NCCL's buffers beside a cuMemAlloc heap"
        );
        assert!(!u(0, 16 * GIB).unrestorable());
        assert!(!u(0, 0).unrestorable(), "nothing held");
        assert!(u(MIB, 0).unrestorable(), "more than it holds");
        assert!(u(u64::MAX, u64::MAX).unrestorable(), "no overflow");
        assert_eq!(u(GIB, 4 * GIB).refusal(7), None);
    }

    /// The refusal names the process, the bytes, why, and what the user can do.
    #[test]
    fn the_refusal_says_what_the_process_holds_why_and_what_to_do() {
        let u = VmmUse {
            created: 3 * GIB,
            allocations: 4 * GIB,
        };
        assert_eq!(
            u.refusal(1234).unwrap(),
            "pid 1234 holds 3.00 GiB of its 4.00 GiB of device memory from cuMemCreate (JAX's \
             default allocator, PyTorch's expandable segments); the driver's restore of such a \
             process fails (CUDA error 304 on driver 580: the process stays frozen until it is \
             killed), so it is not frozen: run it under the limiter with \
             VGPU_FREEZE_IN_PROCESS=1 (its memory then moves in-process), or for JAX set \
             XLA_PYTHON_CLIENT_ALLOCATOR=platform in its environment"
        );
        // A process with slots in two regions counts both; pids without a slot, none.
        let half = VmmUse {
            created: GIB,
            allocations: 3 * GIB,
        };
        let uses = [
            (1, half),
            (
                1,
                VmmUse {
                    created: GIB,
                    allocations: GIB,
                },
            ),
            (2, half),
        ];
        let r = refusals(&uses, &[1, 2, 3]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].starts_with("pid 1 holds 2.00 GiB of its 4.00 GiB of device memory"),
            "{r:?}"
        );
    }

    /// A slot's figures: `cuMemCreate`'s bytes allocated less `cuMemRelease`'s freed, against
    /// what it holds beyond its context on every device; other allocation APIs' bytes are not
    /// `cuMemCreate`'s. Only the live slot of the process named counts.
    #[test]
    fn a_slots_figures_are_its_live_cu_mem_create_bytes_and_its_allocations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.region");
        let (region, _) = Region::open_or_create(&path, &RegionConfig::unlimited(2)).unwrap();
        let (a, b) = (region.claim_slot().unwrap(), region.claim_slot().unwrap());
        region.try_reserve(&a, 0, 512 * MIB + 6 * GIB).unwrap();
        region.set_context_bytes(&a, 0, 512 * MIB);
        region.try_reserve(&a, 1, GIB).unwrap();
        {
            let w = region.shard_writer(&a);
            w.record_alloc(CREATE, 5 * GIB);
            w.record_free(RELEASE, GIB);
            w.record_alloc(ApiId::from_name("cuMemAlloc_v2").unwrap(), 3 * GIB);
            w.record_free(ApiId::from_name("cuMemFree_v2").unwrap(), GIB);
        }
        region.try_reserve(&b, 0, GIB).unwrap();
        let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
        let slot = |s: &region::Slot| {
            snap.slots
                .iter()
                .find(|x| x.index == s.index())
                .unwrap()
                .clone()
        };
        assert_eq!(
            VmmUse::of(&slot(&a)),
            VmmUse {
                created: 4 * GIB,
                allocations: 7 * GIB
            }
        );
        assert_eq!(
            VmmUse::of(&slot(&b)),
            VmmUse {
                created: 0,
                allocations: GIB
            }
        );
        let sa = slot(&a);
        let owner = (sa.pid_ns, sa.pid, sa.start_time);
        // Both slots are this process's (one test process): each owner identity counts its own.
        assert_eq!(
            of_owner(&snap.slots, owner),
            Some(VmmUse {
                created: 4 * GIB,
                allocations: 8 * GIB
            })
        );
        assert_eq!(of_owner(&snap.slots, (owner.0, owner.1, owner.2 + 1)), None);
        assert_eq!(of_owner(&[], owner), None);
    }
}
