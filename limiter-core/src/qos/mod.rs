//! QoS tiers between containers on one GPU: who gets how much of the device when several want
//! it (pure: the limiter feeds it what the containers published on the node's QoS board, and
//! the tests drive it directly).
//!
//! Tiers (`VGPU_QOS_TIER`, or HAMi's `CUDA_TASK_PRIORITY`: 0 is `latency`, 1 `best-effort`):
//! - **guaranteed** with a share `g` (`VGPU_QOS_GUARANTEE`): whenever it wants `g`, it gets `g`;
//!   above `g` it bursts into what nobody else with a higher claim wants, in proportion to `g`.
//! - **latency**: served after the guarantees and before everything else; best-effort launches
//!   are also held back while a latency tenant's work is in flight (the launch path's gate).
//! - **best-effort**: what is left, split evenly.
//!
//! [`allocate`] is a weighted water-filling, level by level: (1) each active guaranteed
//! container gets `min(g, demand)` (scaled down in proportion when the guarantees of the active
//! containers add up to more than the device: an operator's error that is reported, see
//! docs/qos.md); (2) latency containers get their demand; (3) guaranteed containers get more, up
//! to their demand, in proportion to `g`; (4) best-effort containers share the rest evenly. A
//! container's *demand* is its cap (`CUDA_DEVICE_SM_LIMIT`, else the whole device) when it was
//! held back by its allocation, else what it used plus [`HEADROOM_PM`]: one that wants more is
//! held back within a tick and asks for all of its cap at the next. Work-conserving: a
//! container alone gets its cap, and what an idle neighbour leaves goes to the others.
//!
//! Every figure is in per mille of the device. [`backlog`] bounds a best-effort thread's work
//! in flight while a latency neighbour is on its GPU.

pub mod backlog;

/// The device, per mille.
pub const DEVICE_PM: u16 = 1000;
/// Above what a container used, what it may grow into before it counts as held back.
pub const HEADROOM_PM: u16 = 100;
/// A latency-tier container's work counts as in flight this long after its latest launch (the
/// kernels it queued run after the launch returns): best-effort launches wait that long.
pub const LATENCY_HOLD_NS: u64 = 5_000_000;

/// A container's tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Served before everything but guarantees; best-effort work waits while its work runs.
    Latency,
    /// Always given its guaranteed share (per mille) under contention.
    Guaranteed(u16),
    /// What is left.
    BestEffort,
}

impl Tier {
    /// The tier as one byte and the guarantee, for the board and the region (0: none).
    pub fn encode(self) -> (u8, u16) {
        match self {
            Tier::Latency => (1, 0),
            Tier::Guaranteed(g) => (2, g.min(DEVICE_PM)),
            Tier::BestEffort => (3, 0),
        }
    }

    /// The inverse of [`Tier::encode`]; `None` for anything else (a board is tenants' bytes).
    pub fn decode(tier: u8, guarantee: u16) -> Option<Tier> {
        match tier {
            1 => Some(Tier::Latency),
            2 if (1..=DEVICE_PM).contains(&guarantee) => Some(Tier::Guaranteed(guarantee)),
            3 => Some(Tier::BestEffort),
            _ => None,
        }
    }

    /// The name used in the environment, the views and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Latency => "latency",
            Tier::Guaranteed(_) => "guaranteed",
            Tier::BestEffort => "best-effort",
        }
    }
}

/// One active container on the device, as it published itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Contender {
    pub tier: Tier,
    /// Its ceiling (`CUDA_DEVICE_SM_LIMIT`), per mille; [`DEVICE_PM`] without one.
    pub cap_pm: u16,
    /// What it used over the last span, per mille (its sampled GPU time).
    pub used_pm: u16,
    /// Whether its allocation held it back since its last publication (it wants more).
    pub held: bool,
}

impl Contender {
    /// What it asks for, per mille: its cap when held back, else what it used plus
    /// [`HEADROOM_PM`].
    pub fn demand_pm(&self) -> u16 {
        self.demand().round() as u16
    }

    fn demand(&self) -> f64 {
        let cap = f64::from(self.cap_pm.min(DEVICE_PM));
        if self.held {
            cap
        } else {
            (f64::from(self.used_pm) + f64::from(HEADROOM_PM)).min(cap)
        }
    }
}

/// Each contender's allocation, per mille, in the order given.
pub fn allocate(contenders: &[Contender]) -> Vec<u16> {
    let demand: Vec<f64> = contenders.iter().map(Contender::demand).collect();
    let mut got = vec![0.0f64; contenders.len()];
    let mut left = f64::from(DEVICE_PM);
    let guarantee = |c: &Contender| match c.tier {
        Tier::Guaranteed(g) => f64::from(g.min(DEVICE_PM)),
        _ => 0.0,
    };
    // (1) Guarantees, up to the demand, scaled down together when they do not fit.
    let wanted: f64 = contenders
        .iter()
        .zip(&demand)
        .map(|(c, d)| guarantee(c).min(*d))
        .sum();
    let scale = if wanted > left { left / wanted } else { 1.0 };
    for (i, c) in contenders.iter().enumerate() {
        got[i] = guarantee(c).min(demand[i]) * scale;
    }
    left -= got.iter().sum::<f64>();
    // (2) Latency, (3) guaranteed bursts by weight, (4) best effort evenly.
    let levels: [(Member, Weight); 3] = [
        (|c| c.tier == Tier::Latency, |_| 1.0),
        (
            |c| matches!(c.tier, Tier::Guaranteed(_)),
            |c| match c.tier {
                Tier::Guaranteed(g) => f64::from(g.max(1)),
                _ => 1.0,
            },
        ),
        (|c| c.tier == Tier::BestEffort, |_| 1.0),
    ];
    for (member, weight) in levels {
        let members: Vec<usize> = (0..contenders.len())
            .filter(|&i| member(&contenders[i]))
            .collect();
        left -= fill(&members, contenders, &demand, &mut got, left, weight);
        if left <= 0.0 {
            break;
        }
    }
    got.iter()
        .map(|g| g.round().clamp(0.0, f64::from(DEVICE_PM)) as u16)
        .collect()
}

/// Who is in a level.
type Member = fn(&Contender) -> bool;
/// A member's weight within its level.
type Weight = fn(&Contender) -> f64;

/// The contender that runs at its ceiling instead of its allocation (`keys` tell contenders apart
/// the same way in every container; `None` for none).
///
/// Each container holds its allocation with its own duty cycle, and duty cycles of different
/// containers do not line up: where they overlap the device time-slices, each gets less than its
/// duty, and corrections that raise every duty to make up for it end with the containers
/// splitting the device evenly. So one container, the first by tier (latency, guaranteed,
/// best effort), then the largest allocation, then the smallest key, is not held back at all: it
/// takes what the others' held allocations leave, which is its own allocation once they hold
/// theirs, and the others' corrections (docs/sm-limit.md) make up for the overlap with it.
pub fn runs_free(contenders: &[Contender], allocations: &[u16], keys: &[u64]) -> Option<usize> {
    let rank = |t: Tier| match t {
        Tier::Latency => 0u8,
        Tier::Guaranteed(_) => 1,
        Tier::BestEffort => 2,
    };
    (0..contenders.len().min(allocations.len()).min(keys.len())).min_by_key(|&i| {
        (
            rank(contenders[i].tier),
            std::cmp::Reverse(allocations[i]),
            keys[i],
        )
    })
}

/// Water-fills `left` among `members` by `weight` up to each one's demand; returns what it gave.
fn fill(
    members: &[usize],
    contenders: &[Contender],
    demand: &[f64],
    got: &mut [f64],
    left: f64,
    weight: Weight,
) -> f64 {
    let mut open: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&i| demand[i] > got[i] + 1e-9)
        .collect();
    let mut remaining = left.max(0.0);
    while !open.is_empty() && remaining > 1e-9 {
        let total: f64 = open.iter().map(|&i| weight(&contenders[i])).sum();
        // The step at which the first open member reaches its demand, or the end of what is left.
        let step = open
            .iter()
            .map(|&i| (demand[i] - got[i]) / weight(&contenders[i]))
            .fold(remaining / total, f64::min);
        for &i in &open {
            got[i] += step * weight(&contenders[i]);
        }
        remaining -= step * total;
        open.retain(|&i| demand[i] > got[i] + 1e-9);
    }
    left.max(0.0) - remaining
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saturating(tier: Tier) -> Contender {
        Contender {
            tier,
            cap_pm: DEVICE_PM,
            used_pm: 500,
            held: true,
        }
    }

    fn light(tier: Tier, used_pm: u16) -> Contender {
        Contender {
            tier,
            cap_pm: DEVICE_PM,
            used_pm,
            held: false,
        }
    }

    #[test]
    fn guarantees_split_a_saturated_device_in_their_proportion() {
        let a = saturating(Tier::Guaranteed(300));
        let b = saturating(Tier::Guaranteed(700));
        assert_eq!(allocate(&[a, b]), [300, 700]);
        // Guarantees that leave room share it by weight.
        let a = saturating(Tier::Guaranteed(200));
        let b = saturating(Tier::Guaranteed(400));
        assert_eq!(allocate(&[a, b]), [333, 667]);
    }

    #[test]
    fn a_container_alone_or_beside_an_idle_one_gets_its_cap() {
        assert_eq!(allocate(&[saturating(Tier::Guaranteed(300))]), [1000]);
        let mut capped = saturating(Tier::BestEffort);
        capped.cap_pm = 600;
        assert_eq!(allocate(&[capped]), [600]);
        // The neighbour uses 5%: it keeps that and some headroom, the rest is lent.
        let idle = light(Tier::Guaranteed(700), 50);
        assert_eq!(
            allocate(&[saturating(Tier::Guaranteed(300)), idle]),
            [850, 150]
        );
    }

    #[test]
    fn a_guarantee_is_kept_whoever_else_asks() {
        let g = saturating(Tier::Guaranteed(300));
        let allocs = allocate(&[
            g,
            saturating(Tier::Latency),
            saturating(Tier::BestEffort),
            saturating(Tier::Guaranteed(200)),
        ]);
        assert_eq!(allocs[0], 300);
        assert_eq!(allocs[3], 200);
        assert_eq!(allocs[1], 500, "latency takes what it demands of the rest");
        assert_eq!(allocs[2], 0, "nothing left for best effort");
    }

    #[test]
    fn latency_comes_before_best_effort_which_gets_what_is_left() {
        let lat = light(Tier::Latency, 200);
        let be = saturating(Tier::BestEffort);
        assert_eq!(allocate(&[lat, be]), [300, 700]);
        let be2 = saturating(Tier::BestEffort);
        assert_eq!(allocate(&[lat, be, be2]), [300, 350, 350]);
    }

    #[test]
    fn guarantees_that_do_not_fit_are_scaled_down_together() {
        let a = saturating(Tier::Guaranteed(600));
        let b = saturating(Tier::Guaranteed(900));
        assert_eq!(allocate(&[a, b]), [400, 600]);
    }

    #[test]
    fn the_allocations_never_exceed_the_device_or_a_cap() {
        let tiers = [
            Tier::Latency,
            Tier::Guaranteed(1),
            Tier::Guaranteed(250),
            Tier::Guaranteed(1000),
            Tier::BestEffort,
        ];
        let mut seed = 7u64;
        // Miri interprets each allocation: fewer mixes there.
        for _ in 0..if cfg!(miri) { 50 } else { 2000 } {
            let n = (seed % 5) as usize + 1;
            let cs: Vec<Contender> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    Contender {
                        tier: tiers[(seed >> 33) as usize % tiers.len()],
                        cap_pm: 100 + ((seed >> 20) % 901) as u16,
                        used_pm: ((seed >> 40) % 1001) as u16,
                        held: seed & 1 == 1,
                    }
                })
                .collect();
            let a = allocate(&cs);
            let total: u32 = a.iter().map(|&x| u32::from(x)).sum();
            assert!(total <= 1000 + n as u32, "{cs:?} -> {a:?}");
            for (c, x) in cs.iter().zip(&a) {
                assert!(*x <= c.cap_pm, "{c:?} -> {x}");
            }
            // Work-conserving: if someone is held back, the device is handed out in full (up
            // to every demand).
            let demand: f64 = cs.iter().map(Contender::demand).sum();
            if demand >= 1000.0 {
                assert!(total + n as u32 >= 1000, "{cs:?} -> {a:?}");
            }
        }
    }

    #[test]
    fn one_contender_runs_free_the_first_by_tier_then_allocation() {
        let g30 = saturating(Tier::Guaranteed(300));
        let g70 = saturating(Tier::Guaranteed(700));
        let a = allocate(&[g30, g70]);
        assert_eq!(runs_free(&[g30, g70], &a, &[1, 2]), Some(1), "the 70%");
        let lat = light(Tier::Latency, 200);
        let be = saturating(Tier::BestEffort);
        let a = allocate(&[be, lat]);
        assert_eq!(a, [700, 300]);
        assert_eq!(runs_free(&[be, lat], &a, &[1, 2]), Some(1), "latency first");
        // Equal allocations: the smaller key, whichever container computes it.
        let a = allocate(&[g30, g30]);
        assert_eq!(runs_free(&[g30, g30], &a, &[9, 4]), Some(1));
        assert_eq!(runs_free(&[g30, g30], &a, &[4, 9]), Some(0));
        assert_eq!(runs_free(&[], &[], &[]), None);
    }

    #[test]
    fn tiers_round_trip_and_hostile_bytes_decode_to_none() {
        for t in [Tier::Latency, Tier::Guaranteed(300), Tier::BestEffort] {
            let (b, g) = t.encode();
            assert_eq!(Tier::decode(b, g), Some(t));
        }
        assert_eq!(Tier::decode(0, 0), None);
        assert_eq!(Tier::decode(2, 0), None);
        assert_eq!(Tier::decode(2, 1001), None);
        assert_eq!(Tier::decode(9, 5), None);
    }
}
