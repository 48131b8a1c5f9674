//! Freezing idle containers: the decisions, apart from how a freeze is carried out.
//!
//! A container whose processes made no CUDA call and kept the GPU idle for a TTL is frozen: its device memory is saved to host memory and given back to
//! the GPU while its processes stay alive; its next CUDA call thaws it. [`Freezer`] holds each
//! container's phase and the host memory that frozen containers hold, in the caller's
//! nanoseconds (tests drive it with virtual time), and says what to do next; the caller carries
//! it out (the driver's checkpoint API, per process) and reports back.
//!
//! Host memory is bounded and accounted: a freeze is admitted only if the container's device
//! bytes fit in what is left of the host budget, and they are reserved from it before the freeze
//! starts. They stay reserved while the container is frozen and until a thaw has completed, so a
//! thaw never needs host memory it does not already hold; a container whose processes are gone
//! (killed while frozen) gives its reservation back at once.
//!
//! On demand ([`Freezer::on_demand`]): while a tenant's allocation waits for device memory the
//! GPU has no room for (`VGPU_OOM_WAIT`), other containers idle for the demand's idle time are
//! frozen, largest first, until what they give back covers the bytes it waits for. What the
//! waiting tenant claims is trusted for nothing else: it can only get containers frozen that
//! are idle for that time, which the operator chose to freeze on demand.
//!
//! ```text
//!   Running --(idle for the TTL, or on demand, or by hand; bytes fit the budget)--> Freezing
//!   Freezing --(done)--> Frozen        Freezing --(failed)--> Running (reservation returned)
//!   Frozen --(a CUDA call, or by hand)--> Thawing
//!   Thawing --(done)--> Running (reservation returned)
//!   Thawing --(failed)--> Frozen (reservation kept: the saved memory is still there; retried)
//!   any --(processes gone)--> removed (reservation returned)
//! ```

use std::{collections::HashMap, hash::Hash};

/// A container's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its memory is on the GPU.
    Running,
    /// A freeze was started and has not been reported yet.
    Freezing,
    /// Its memory is in host memory, reserved from the budget.
    Frozen,
    /// A thaw was started and has not been reported yet.
    Thawing,
}

/// What a container did since the last look: the CUDA calls its processes have made in all
/// (a counter that only grows while a process lives) and whether its GPU work was still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    pub calls: u64,
    pub gpu_busy: bool,
}

/// One container's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub phase: Phase,
    /// Device bytes it holds (Running), or that its freeze saved (reserved from the budget while
    /// Freezing, Frozen or Thawing).
    pub bytes: u64,
    /// Since when it has been idle (ns); `None` while active.
    idle_since: Option<u64>,
    /// The idle time after which the container itself asks to be frozen (ns; its limiter's
    /// `VGPU_FREEZE_AFTER`), `None`: the freezer's own TTL alone.
    own_ttl_ns: Option<u64>,
    /// The call counter last seen.
    calls: u64,
    /// Freezes and thaws completed.
    pub freezes: u64,
    pub thaws: u64,
}

/// Why a freeze was not started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreezeRefused {
    #[error("not known (no GPU process of it has been seen)")]
    Unknown,
    #[error("already {0:?}")]
    NotRunning(Phase),
    #[error("its {bytes} bytes do not fit in the {left} bytes left of the host budget")]
    OverBudget { bytes: u64, left: u64 },
}

/// What the caller should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<K> {
    /// Freeze this container (its bytes are reserved already).
    Freeze(K),
    /// Thaw this container.
    Thaw(K),
}

/// An allocation waiting for device memory (a tenant's claim, from its slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand<K> {
    /// The container it is in: never frozen for it (nor for another demand).
    pub waiter: K,
    /// Which wait it is (the caller's number for the process's wait): what was frozen for it is
    /// counted per wait.
    pub wait: u64,
    /// Bytes it waits for (any value: `u64::MAX` is never covered).
    pub bytes: u64,
    /// The containers whose freeze gives back memory on the GPU it waits on (those holding
    /// memory there); `None`: not known (no per-GPU figures), any container may.
    pub near: Option<Vec<K>>,
}

/// Every container's freeze state and the host budget: see the module documentation.
#[derive(Debug)]
pub struct Freezer<K> {
    /// Idle time after which a container is frozen (`None`: only by hand).
    ttl_ns: Option<u64>,
    /// Idle time after which a container may be frozen for a waiting allocation (`None`: never).
    demand_idle_ns: Option<u64>,
    /// The containers frozen for each wait still seen (its waiter and number).
    answered: HashMap<(K, u64), Vec<K>>,
    /// Host bytes frozen containers may hold together.
    budget: u64,
    /// Host bytes reserved now (the sum of the bytes of containers not Running).
    held: u64,
    containers: HashMap<K, Container>,
}

impl<K: Eq + Hash + Clone> Freezer<K> {
    pub fn new(ttl_ns: Option<u64>, budget: u64) -> Freezer<K> {
        Freezer {
            ttl_ns,
            demand_idle_ns: None,
            answered: HashMap::new(),
            budget,
            held: 0,
            containers: HashMap::new(),
        }
    }

    /// Also freezes containers idle for `idle_ns` when an allocation waits for memory
    /// ([`Freezer::on_demand`]).
    pub fn with_on_demand(mut self, idle_ns: Option<u64>) -> Freezer<K> {
        self.demand_idle_ns = idle_ns;
        self
    }

    /// Host bytes held by frozen (or freezing, or thawing) containers.
    pub fn held(&self) -> u64 {
        self.held
    }

    pub fn container(&self, key: &K) -> Option<&Container> {
        self.containers.get(key)
    }

    /// A look at a container at `now`: its activity and the device bytes it holds. Returns a
    /// thaw when a frozen container made a CUDA call (its processes asked for the GPU).
    pub fn observe(&mut self, key: K, activity: Activity, bytes: u64, now: u64) -> Option<Step<K>> {
        let c = self.containers.entry(key.clone()).or_insert(Container {
            phase: Phase::Running,
            bytes,
            idle_since: None,
            own_ttl_ns: None,
            calls: activity.calls,
            freezes: 0,
            thaws: 0,
        });
        let called = activity.calls != c.calls;
        c.calls = activity.calls;
        match c.phase {
            Phase::Running => {
                c.bytes = bytes;
                c.idle_since = if called || activity.gpu_busy {
                    None
                } else {
                    c.idle_since.or(Some(now))
                };
                None
            }
            Phase::Frozen if called => {
                c.phase = Phase::Thawing;
                Some(Step::Thaw(key))
            }
            Phase::Frozen | Phase::Freezing | Phase::Thawing => None,
        }
    }

    /// Sets the idle time after which `key` asks to be frozen itself (`None`: none); a container
    /// not seen yet is ignored. The shorter of it and the freezer's TTL applies: a container can
    /// ask to be frozen sooner, never later than the operator's TTL.
    pub fn set_own_ttl(&mut self, key: &K, ttl_ns: Option<u64>) {
        if let Some(c) = self.containers.get_mut(key) {
            c.own_ttl_ns = ttl_ns;
        }
    }

    /// The idle time after which `c` is frozen: the shorter of the freezer's TTL and its own.
    fn ttl_of(&self, c: &Container) -> Option<u64> {
        match (self.ttl_ns, c.own_ttl_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The freezes due at `now`: running containers idle for their TTL whose bytes fit the
    /// budget (reserved now, in the order given by `order`, so that the result does not depend
    /// on the map's). A container that does not fit waits for room.
    pub fn due(&mut self, now: u64, order: impl Fn(&K, &K) -> std::cmp::Ordering) -> Vec<Step<K>> {
        let mut idle: Vec<K> = self
            .containers
            .iter()
            .filter(|(_, c)| {
                c.phase == Phase::Running
                    && c.bytes > 0
                    && self.ttl_of(c).is_some_and(|ttl| {
                        c.idle_since.is_some_and(|t| now.saturating_sub(t) >= ttl)
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        idle.sort_by(&order);
        idle.into_iter()
            .filter(|k| self.begin_freeze(k).is_ok())
            .map(Step::Freeze)
            .collect()
    }

    /// The freezes that make room at `now` for the allocations waiting in `demands` (every wait
    /// seen now: a wait not in it has ended). For each wait, in the order of its waiter by
    /// `order` then its number: running containers holding device memory on its GPU (where
    /// known, [`Demand::near`]), idle for the demand's idle time, none of them a waiter, largest
    /// first (then by `order`), until the bytes of
    /// those frozen for the wait (this time and before, still frozen or freezing) cover what it
    /// waits for, or none is left. Each freeze is admitted and reserved as [`Freezer::due`]'s
    /// are (a container that does not fit the budget is passed over). Nothing without
    /// [`Freezer::with_on_demand`].
    pub fn on_demand(
        &mut self,
        demands: &[Demand<K>],
        now: u64,
        order: impl Fn(&K, &K) -> std::cmp::Ordering,
    ) -> Vec<Step<K>> {
        let Some(idle_ns) = self.demand_idle_ns else {
            return Vec::new();
        };
        self.answered.retain(|(waiter, wait), _| {
            demands
                .iter()
                .any(|d| d.waiter == *waiter && d.wait == *wait)
        });
        let mut waits: Vec<&Demand<K>> = demands.iter().collect();
        waits.sort_by(|a, b| order(&a.waiter, &b.waiter).then(a.wait.cmp(&b.wait)));
        let mut steps = Vec::new();
        for d in waits {
            let key = (d.waiter.clone(), d.wait);
            let mut frozen_for = self.answered.remove(&key).unwrap_or_default();
            // What still gives room: freezes under way or done, not those that failed or thawed.
            frozen_for.retain(|k| {
                self.containers
                    .get(k)
                    .is_some_and(|c| matches!(c.phase, Phase::Freezing | Phase::Frozen))
            });
            let mut given = frozen_for
                .iter()
                .filter_map(|k| self.containers.get(k))
                .fold(0u64, |sum, c| sum.saturating_add(c.bytes));
            let mut idle: Vec<(K, u64)> = self
                .containers
                .iter()
                .filter(|(k, c)| {
                    c.phase == Phase::Running
                        && c.bytes > 0
                        && c.idle_since
                            .is_some_and(|t| now.saturating_sub(t) >= idle_ns)
                        && !demands.iter().any(|d| d.waiter == **k)
                        && d.near.as_ref().is_none_or(|near| near.contains(k))
                })
                .map(|(k, c)| (k.clone(), c.bytes))
                .collect();
            idle.sort_by(|(a, ab), (b, bb)| bb.cmp(ab).then_with(|| order(a, b)));
            for (k, bytes) in idle {
                if given >= d.bytes {
                    break;
                }
                if self.begin_freeze(&k).is_ok() {
                    given = given.saturating_add(bytes);
                    frozen_for.push(k.clone());
                    steps.push(Step::Freeze(k));
                }
            }
            self.answered.insert(key, frozen_for);
        }
        steps
    }

    /// Starts a freeze (by hand, or from [`Freezer::due`]): reserves the container's bytes.
    pub fn begin_freeze(&mut self, key: &K) -> Result<(), FreezeRefused> {
        let left = self.budget.saturating_sub(self.held);
        let c = self.containers.get_mut(key).ok_or(FreezeRefused::Unknown)?;
        if c.phase != Phase::Running {
            return Err(FreezeRefused::NotRunning(c.phase));
        }
        if c.bytes > left {
            return Err(FreezeRefused::OverBudget {
                bytes: c.bytes,
                left,
            });
        }
        c.phase = Phase::Freezing;
        self.held += c.bytes;
        Ok(())
    }

    /// A freeze's outcome: `Ok(saved)` the bytes it saved (at most those reserved: the rest goes
    /// back to the budget), or failed (the container runs on, its reservation returned).
    pub fn freeze_done(&mut self, key: &K, saved: Option<u64>) {
        let Some(c) = self.containers.get_mut(key) else {
            return;
        };
        if c.phase != Phase::Freezing {
            return;
        }
        match saved {
            Some(saved) => {
                let kept = saved.min(c.bytes);
                self.held -= c.bytes - kept;
                c.bytes = kept;
                c.phase = Phase::Frozen;
                c.freezes += 1;
            }
            None => {
                self.held -= c.bytes;
                c.phase = Phase::Running;
                c.idle_since = None;
            }
        }
    }

    /// Starts a thaw by hand.
    pub fn begin_thaw(&mut self, key: &K) -> Option<Step<K>> {
        let c = self.containers.get_mut(key)?;
        (c.phase == Phase::Frozen).then(|| {
            c.phase = Phase::Thawing;
            Step::Thaw(key.clone())
        })
    }

    /// A thaw's outcome. Done: the container runs, its reservation returned. Failed (the GPU has
    /// no room for it yet): it stays frozen with its reservation, and the next call or
    /// [`Freezer::begin_thaw`] tries again.
    pub fn thaw_done(&mut self, key: &K, ok: bool) {
        let Some(c) = self.containers.get_mut(key) else {
            return;
        };
        if c.phase != Phase::Thawing {
            return;
        }
        if ok {
            self.held -= c.bytes;
            c.phase = Phase::Running;
            c.idle_since = None;
            c.thaws += 1;
        } else {
            c.phase = Phase::Frozen;
        }
    }

    /// The container's processes are gone (exited or killed, frozen or not): whatever it held is
    /// returned.
    pub fn gone(&mut self, key: &K) {
        if let Some(c) = self.containers.remove(key)
            && c.phase != Phase::Running
        {
            self.held -= c.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const GIB: u64 = 1 << 30;

    fn quiet(calls: u64) -> Activity {
        Activity {
            calls,
            gpu_busy: false,
        }
    }

    fn by_name(a: &&'static str, b: &&'static str) -> std::cmp::Ordering {
        a.cmp(b)
    }

    #[test]
    fn an_idle_container_is_frozen_after_the_ttl_and_thawed_by_its_next_call() {
        let mut f = Freezer::new(Some(60 * S), 64 * GIB);
        assert_eq!(f.observe("a", quiet(10), 4 * GIB, 0), None);
        assert!(f.due(59 * S, by_name).is_empty(), "idle for 59 s only");
        assert_eq!(f.due(60 * S, by_name), [Step::Freeze("a")]);
        assert_eq!(f.container(&"a").unwrap().phase, Phase::Freezing);
        assert_eq!(f.held(), 4 * GIB, "reserved before the freeze runs");
        assert!(f.due(61 * S, by_name).is_empty(), "not twice");
        f.freeze_done(&"a", Some(4 * GIB));
        assert_eq!(f.container(&"a").unwrap().phase, Phase::Frozen);
        // Nothing happens while no call comes.
        assert_eq!(f.observe("a", quiet(10), 0, 70 * S), None);
        assert_eq!(f.observe("a", quiet(11), 0, 80 * S), Some(Step::Thaw("a")));
        assert_eq!(f.held(), 4 * GIB, "held until the thaw is done");
        f.thaw_done(&"a", true);
        let c = f.container(&"a").unwrap();
        assert_eq!((c.phase, c.freezes, c.thaws), (Phase::Running, 1, 1));
        assert_eq!(f.held(), 0);
        // Idle again counts from the next look.
        f.observe("a", quiet(11), 4 * GIB, 81 * S);
        assert!(f.due(81 * S + 59 * S, by_name).is_empty());
        assert_eq!(f.due(81 * S + 60 * S, by_name), [Step::Freeze("a")]);
    }

    #[test]
    fn calls_or_gpu_work_keep_a_container_running() {
        let mut f = Freezer::new(Some(10 * S), 64 * GIB);
        for t in 0..30 {
            f.observe("calls", quiet(t), GIB, t * S);
            f.observe(
                "kernel",
                Activity {
                    calls: 5,
                    gpu_busy: true,
                },
                GIB,
                t * S,
            );
        }
        assert!(f.due(30 * S, by_name).is_empty());
        // A container holding no device memory has nothing to give back.
        f.observe("empty", quiet(0), 0, 0);
        assert!(
            f.due(100 * S, by_name)
                .iter()
                .all(|s| *s != Step::Freeze("empty"))
        );
    }

    #[test]
    fn a_container_may_ask_to_be_frozen_sooner_never_later() {
        const S: u64 = 1_000_000_000;
        // No operator TTL: only the container that asks is frozen, after its own TTL.
        let mut f = Freezer::new(None, 64 * GIB);
        for k in ["asks", "silent"] {
            f.observe(k, quiet(1), GIB, 0);
        }
        f.set_own_ttl(&"asks", Some(60 * S));
        assert!(f.due(59 * S, by_name).is_empty());
        assert_eq!(f.due(60 * S, by_name), vec![Step::Freeze("asks")]);
        assert!(f.due(3600 * S, by_name).is_empty(), "the silent one stays");
        // With an operator TTL of 10 minutes, a container asking for an hour is frozen at 10
        // minutes, one asking for 1 minute at 1 minute.
        let mut f = Freezer::new(Some(600 * S), 64 * GIB);
        for k in ["hour", "minute"] {
            f.observe(k, quiet(1), GIB, 0);
        }
        f.set_own_ttl(&"hour", Some(3600 * S));
        f.set_own_ttl(&"minute", Some(60 * S));
        assert_eq!(f.due(60 * S, by_name), vec![Step::Freeze("minute")]);
        assert_eq!(f.due(600 * S, by_name), vec![Step::Freeze("hour")]);
        // Unknown containers are ignored.
        f.set_own_ttl(&"unknown", Some(S));
        assert!(f.container(&"unknown").is_none());
    }

    #[test]
    fn without_a_ttl_only_a_freeze_by_hand_happens() {
        let mut f = Freezer::new(None, 64 * GIB);
        f.observe("a", quiet(0), GIB, 0);
        assert!(f.due(1_000_000 * S, by_name).is_empty());
        assert_eq!(f.begin_freeze(&"a"), Ok(()));
        assert_eq!(
            f.begin_freeze(&"a"),
            Err(FreezeRefused::NotRunning(Phase::Freezing))
        );
        assert_eq!(f.begin_freeze(&"b"), Err(FreezeRefused::Unknown));
        f.freeze_done(&"a", Some(GIB));
        assert_eq!(f.begin_thaw(&"a"), Some(Step::Thaw("a")));
        assert_eq!(f.begin_thaw(&"a"), None, "already thawing");
    }

    #[test]
    fn the_host_budget_bounds_what_frozen_containers_hold() {
        let mut f = Freezer::new(Some(S), 10 * GIB);
        for (k, bytes) in [("a", 6 * GIB), ("b", 5 * GIB), ("c", 4 * GIB)] {
            f.observe(k, quiet(0), bytes, 0);
        }
        // a (6) fits, b (5) does not fit in the 4 left, c (4) does.
        assert_eq!(f.due(S, by_name), [Step::Freeze("a"), Step::Freeze("c")]);
        assert_eq!(f.held(), 10 * GIB);
        assert_eq!(
            f.begin_freeze(&"b"),
            Err(FreezeRefused::OverBudget {
                bytes: 5 * GIB,
                left: 0
            })
        );
        // A freeze that failed returns its reservation; b fits then.
        f.freeze_done(&"a", None);
        assert_eq!(f.container(&"a").unwrap().phase, Phase::Running);
        assert_eq!(f.held(), 4 * GIB);
        assert_eq!(f.due(2 * S, by_name), [Step::Freeze("b")]);
        // A freeze that saved less than reserved gives the rest back.
        f.freeze_done(&"c", Some(3 * GIB));
        assert_eq!(f.held(), 8 * GIB);
    }

    #[test]
    fn a_thaw_that_fails_keeps_the_memory_it_needs() {
        let mut f = Freezer::new(Some(S), 10 * GIB);
        f.observe("a", quiet(0), 6 * GIB, 0);
        f.due(S, by_name);
        f.freeze_done(&"a", Some(6 * GIB));
        assert_eq!(f.observe("a", quiet(1), 0, 2 * S), Some(Step::Thaw("a")));
        f.thaw_done(&"a", false);
        assert_eq!(f.container(&"a").unwrap().phase, Phase::Frozen);
        assert_eq!(f.held(), 6 * GIB, "the saved memory is still held");
        // The next call asks again.
        assert_eq!(f.observe("a", quiet(2), 0, 3 * S), Some(Step::Thaw("a")));
        f.thaw_done(&"a", true);
        assert_eq!(f.held(), 0);
        // Outcomes of steps never started are ignored.
        f.thaw_done(&"a", true);
        f.freeze_done(&"a", Some(GIB));
        assert_eq!(f.container(&"a").unwrap().phase, Phase::Running);
        assert_eq!(f.held(), 0);
    }

    fn wants(waiter: &'static str, wait: u64, bytes: u64) -> Demand<&'static str> {
        Demand {
            waiter,
            wait,
            bytes,
            near: None,
        }
    }

    #[test]
    fn only_containers_on_the_waiters_gpu_are_frozen_for_it() {
        let mut f = idle_three(64 * GIB);
        // b (4 GiB, the largest) is on another GPU: a and c, on the waiter's, are frozen.
        let on_its_gpu = Demand {
            near: Some(vec!["a", "c"]),
            ..wants("w", 1, 5 * GIB)
        };
        assert_eq!(
            f.on_demand(std::slice::from_ref(&on_its_gpu), 10 * S, by_name),
            [Step::Freeze("c"), Step::Freeze("a")]
        );
        // Nothing on its GPU is left: b is still not frozen for it.
        f.freeze_done(&"c", Some(2 * GIB));
        f.freeze_done(&"a", Some(GIB));
        assert!(f.on_demand(&[on_its_gpu], 11 * S, by_name).is_empty());
        assert_eq!(f.container(&"b").unwrap().phase, Phase::Running);
    }

    /// Containers a 1 (1 GiB), b (4 GiB), c (2 GiB), all idle since 0, and the waiter w (which
    /// looks idle too: its waiting allocation is recorded only when it returns).
    fn idle_three(budget: u64) -> Freezer<&'static str> {
        let mut f = Freezer::new(None, budget).with_on_demand(Some(10 * S));
        for (k, bytes) in [("a", GIB), ("b", 4 * GIB), ("c", 2 * GIB), ("w", GIB)] {
            f.observe(k, quiet(0), bytes, 0);
        }
        f
    }

    #[test]
    fn a_waiting_allocation_gets_the_largest_idle_containers_frozen_until_it_is_covered() {
        let mut f = idle_three(64 * GIB);
        assert!(f.on_demand(&[], 10 * S, by_name).is_empty(), "no one waits");
        assert!(
            f.on_demand(&[wants("w", 1, 5 * GIB)], 9 * S, by_name)
                .is_empty(),
            "idle for 9 s only"
        );
        // b (4) then c (2) cover 5; a is left alone.
        assert_eq!(
            f.on_demand(&[wants("w", 1, 5 * GIB)], 10 * S, by_name),
            [Step::Freeze("b"), Step::Freeze("c")]
        );
        assert_eq!(f.held(), 6 * GIB);
        f.freeze_done(&"b", Some(4 * GIB));
        f.freeze_done(&"c", Some(2 * GIB));
        // The same wait seen again is covered already: nothing more.
        assert!(
            f.on_demand(&[wants("w", 1, 5 * GIB)], 11 * S, by_name)
                .is_empty()
        );
        // b thawed by its own call: its memory is back on the GPU, so the wait needs more.
        assert_eq!(f.observe("b", quiet(1), 0, 12 * S), Some(Step::Thaw("b")));
        f.thaw_done(&"b", true);
        assert_eq!(
            f.on_demand(&[wants("w", 1, 5 * GIB)], 12 * S, by_name),
            [Step::Freeze("a")]
        );
        // Nothing is frozen without the setting.
        let mut off = Freezer::new(Some(S), 64 * GIB);
        off.observe("a", quiet(0), GIB, 0);
        assert!(
            off.on_demand(&[wants("w", 1, GIB)], 100 * S, by_name)
                .is_empty()
        );
    }

    #[test]
    fn busy_containers_and_waiters_are_never_frozen_on_demand() {
        let mut f = Freezer::new(None, 64 * GIB).with_on_demand(Some(10 * S));
        for t in 0..=20 {
            f.observe("busy", quiet(t), 8 * GIB, t * S);
            f.observe(
                "kernel",
                Activity {
                    calls: 0,
                    gpu_busy: true,
                },
                8 * GIB,
                t * S,
            );
            f.observe("w", quiet(0), 8 * GIB, t * S);
            f.observe("v", quiet(0), 8 * GIB, t * S);
        }
        f.observe("empty", quiet(0), 0, 0);
        let demands = [wants("w", 1, 4 * GIB), wants("v", 7, u64::MAX)];
        assert!(f.on_demand(&demands, 20 * S, by_name).is_empty());
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn a_demand_respects_the_host_budget_and_a_hostile_claim_is_bounded() {
        // a (1), c (2) fit in 3 GiB; b (4) does not.
        let mut f = idle_three(3 * GIB);
        assert_eq!(
            f.on_demand(&[wants("w", 1, 5 * GIB)], 10 * S, by_name),
            [Step::Freeze("c"), Step::Freeze("a")]
        );
        assert_eq!(f.held(), 3 * GIB);
        // A claim of every byte there is freezes only what is idle and fits, once, and ends.
        let mut f = idle_three(64 * GIB);
        let steps = f.on_demand(&[wants("w", u64::MAX, u64::MAX)], 10 * S, by_name);
        assert_eq!(
            steps,
            [Step::Freeze("b"), Step::Freeze("c"), Step::Freeze("a")]
        );
        for k in ["a", "b", "c"] {
            f.freeze_done(&k, Some(u64::MAX));
        }
        assert!(
            f.on_demand(&[wants("w", u64::MAX, u64::MAX)], 11 * S, by_name)
                .is_empty()
        );
        assert_eq!(f.held(), 7 * GIB);
        // A waiter the freezer never saw (a device index out of range is the caller's to
        // ignore: it is not part of the decision) gets only idle containers frozen.
        let mut f = idle_three(64 * GIB);
        f.observe("a", quiet(5), GIB, 9 * S);
        assert_eq!(
            f.on_demand(&[wants("nobody", 0, 3 * GIB)], 10 * S, by_name),
            [Step::Freeze("b")]
        );
    }

    #[test]
    fn a_wait_that_ends_is_forgotten() {
        let mut f = idle_three(64 * GIB);
        assert_eq!(
            f.on_demand(&[wants("w", 1, GIB)], 10 * S, by_name),
            [Step::Freeze("b")]
        );
        f.freeze_done(&"b", Some(4 * GIB));
        assert!(f.on_demand(&[], 11 * S, by_name).is_empty());
        // The process's next wait is a new one: what b gave back was the last wait's.
        assert_eq!(
            f.on_demand(&[wants("w", 2, GIB)], 12 * S, by_name),
            [Step::Freeze("c")]
        );
        // A failed freeze gave nothing: the wait asks for the next one.
        f.freeze_done(&"c", None);
        assert_eq!(
            f.on_demand(&[wants("w", 2, GIB)], 13 * S, by_name),
            [Step::Freeze("a")]
        );
    }

    #[test]
    fn a_killed_frozen_container_leaves_nothing_held() {
        let mut f = Freezer::new(Some(S), 10 * GIB);
        f.observe("a", quiet(0), 3 * GIB, 0);
        f.observe("b", quiet(0), 2 * GIB, 0);
        f.due(S, by_name);
        f.freeze_done(&"a", Some(3 * GIB));
        assert_eq!(f.held(), 5 * GIB, "a frozen, b freezing");
        f.gone(&"a");
        f.gone(&"b");
        assert_eq!(f.held(), 0);
        assert_eq!(f.container(&"a"), None);
        // A running container that goes held nothing.
        f.observe("c", quiet(0), GIB, 0);
        f.gone(&"c");
        assert_eq!(f.held(), 0);
        // A late report about a container that is gone changes nothing.
        f.freeze_done(&"b", Some(2 * GIB));
        assert_eq!(f.held(), 0);
    }
}
