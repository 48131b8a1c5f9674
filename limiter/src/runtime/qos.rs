//! QoS tiers between containers on one GPU: the `vgpu-qos` thread.
//!
//! Started in a process whose container has a tier (`VGPU_QOS_TIER` / `VGPU_QOS_GUARANTEE`, or
//! HAMi's `CUDA_TASK_PRIORITY`). Every [`TICK`], on each device the process can name (its UUID):
//! - the process holding the container's lease (`region::SmShare::hold_lease`, shared with the SM
//!   feedback) measures what the container used (the GPU time its limiters sample, as the SM
//!   feedback does), whether it launched within [`ACTIVE_NS`] and whether its allocation held it
//!   back, publishes that with its tier in its entry on the node's QoS board
//!   (`VGPU_QOS_BOARD`, `region::qos_board`), reads the other containers' entries for the same
//!   GPU, computes its allocation (`limiter_core::qos::allocate`) and writes it into the region's
//!   `qos` word;
//! - every process of the container applies the region's allocation to its launch controller
//!   (launches run at the smaller of it and `CUDA_DEVICE_SM_LIMIT`), and a best-effort container
//!   finds its latency-tier neighbours.
//!
//! Latency work is followed faster: while the container is latency tier, or best effort beside
//! a latency tenant, the thread wakes every [`FAST_TICK`]: the latency container's lease holder
//! publishes until when its work is in flight (its latest launch plus
//! [`limiter_core::qos::LATENCY_HOLD_NS`]), and a best-effort process copies its neighbours'
//! figure into [`Qos::gates`], which its launches wait on (`limiter_core::sm`).
//!
//! Without a board (unset, or it cannot be opened: logged once) the container has no neighbours:
//! it is allocated its cap, as without a tier. A killed container's entry goes stale within
//! `region::qos_board::STALE_MS` and its share returns to the others. The thread never touches
//! the launch path; launches read the controller's words and [`Qos::gates`].

use agent_common::MAX_DEVICES;
use std::{
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::atomic::{AtomicI32, AtomicU64, Ordering},
    time::Duration,
};

use limiter_core::{
    qos::{Contender, DEVICE_PM, LATENCY_HOLD_NS, Tier, allocate, runs_free},
    sm::gpu_share::GpuShare,
};
use region::{
    Region,
    qos_board::{Board, BoardEntry, slot_for},
    sm_share::{QosState, decode_qos, qos_word},
};

use super::sm_feedback::{Plant, container_gpu_time};
use crate::platform::{
    clock::Clock,
    driver::LatencyWords,
    guard::Reentry,
    log::{self, Level},
    os,
};

/// How often allocations are recomputed.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// How often a latency container's thread looks for new work to publish (see the module
/// documentation); a launch after its published horizon has passed wakes it at once.
const FAST_TICK: Duration = Duration::from_millis(1);
/// How often a best-effort container beside a latency one reads its neighbours' work in flight:
/// what a request shares the GPU with before the gate closes.
const GATE_TICK: Duration = Duration::from_micros(200);
/// A container that launched within this long is active (wants its share).
const ACTIVE_NS: u64 = 300_000_000;
/// An allocation moves only by this many points or more (or to or from the whole device): the
/// windows' feedback restarts at every change of target.
const HYSTERESIS_PCT: u8 = 2;

/// The process's QoS tier and what its launches read.
#[derive(Debug)]
pub(crate) struct Qos {
    /// The environment's tier.
    base: Option<Tier>,
    /// The tier now: the control block's override, else `base` ([`encode_tier`]; 0: none).
    tier: AtomicU64,
    board: Option<PathBuf>,
    /// The pid whose process runs the thread (0: none): a forked child starts its own.
    started: AtomicI32,
    /// What the thread and the launches tell each other: a latency neighbour's work in flight
    /// (best effort), our own published horizon and the thread's wake-up (latency).
    pub(crate) latency: LatencyWords,
}

impl Qos {
    pub(crate) fn new(tier: Option<Tier>, board: Option<PathBuf>) -> Qos {
        Qos {
            base: tier,
            tier: AtomicU64::new(encode_tier(tier)),
            board,
            started: AtomicI32::new(0),
            latency: LatencyWords::new(),
        }
    }

    /// The tier now.
    pub(crate) fn tier(&self) -> Option<Tier> {
        // Relaxed: a configuration value; the thread reads it every tick.
        decode_tier(self.tier.load(Ordering::Relaxed))
    }

    /// Applies the control block's override (`None`: the environment's tier again; `(0, _)`: no
    /// tier; else `(tier, guarantee per mille)` as `Tier::encode` makes them).
    pub(crate) fn set_override(&self, over: Option<(u8, u16)>) {
        let tier = match over {
            None => self.base,
            Some((t, g)) => Tier::decode(t, g),
        };
        // Relaxed: see `tier`.
        self.tier.store(encode_tier(tier), Ordering::Relaxed);
    }

    /// Marks the devices' launches as tiered and starts the thread, if the container has a tier
    /// and this process has none.
    pub(crate) fn ensure_started(&'static self, plant: Plant) {
        let Some(tier) = self.tier() else { return };
        for d in 0..MAX_DEVICES {
            plant.sm.set_tiered(d, true);
        }
        let pid = os::pid();
        // Relaxed: only elects the one caller that spawns; nothing else is published through it.
        if self.started.swap(pid, Ordering::Relaxed) == pid {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("vgpu-qos".into())
            .spawn(move || {
                plant.panics.shield(|| run(plant, self));
            });
        if let Err(e) = spawned {
            log::write(
                plant.log,
                Level::Warn,
                format_args!(
                    "cannot start the QoS thread ({e}); the {} tier is not applied",
                    tier.name()
                ),
            );
        }
    }
}

/// Per device: what the thread follows.
#[derive(Default)]
struct Device {
    /// A hash of the GPU's UUID: how containers name the GPU they share.
    id: u64,
    gpu: GpuShare,
    slot: Option<usize>,
    closes: u64,
    /// The allocation applied to the controller, percent (0: none yet).
    applied: u8,
    /// The allocation published, per mille.
    allocated: u16,
    /// Board entries of latency-tier neighbours (a best-effort container's gate).
    latency_slots: Vec<usize>,
    /// The latency-until figure last published.
    published_until: u64,
    /// The entry last written (the fast tick rewrites it with a new latency figure).
    entry: BoardEntry,
}

fn encode_tier(tier: Option<Tier>) -> u64 {
    tier.map_or(0, |t| {
        let (b, g) = t.encode();
        u64::from(b) | u64::from(g) << 8
    })
}

fn decode_tier(word: u64) -> Option<Tier> {
    Tier::decode(word as u8, (word >> 8) as u16)
}

fn run(plant: Plant, qos: &'static Qos) {
    // Anything this thread reaches through a hook passes straight to the driver.
    let _inside = Reentry::enter(plant.tls.words());
    let name = qos.tier().map_or("none", Tier::name);
    let board = qos
        .board
        .as_deref()
        .and_then(|path| match Board::open(path) {
            Ok(b) => Some(b),
            Err(e) => {
                log::write(
                    plant.log,
                    Level::Warn,
                    format_args!(
                        "{e}; the {name} tier has no neighbours to share with (VGPU_QOS_BOARD)"
                    ),
                );
                None
            }
        });
    if qos.board.is_none() {
        log::write(
            plant.log,
            Level::Info,
            format_args!("QoS tier {name} without VGPU_QOS_BOARD: no neighbours to share with"),
        );
    }
    let owner = owner_key(plant.region);
    qos.latency.thread.register_current();
    // Learnt once the driver is initialised (the thread may start before `cuInit`).
    let mut devices: Vec<Device> = Vec::new();
    let mut last_full = 0u64;
    let mut logged_error = false;
    let mut untiered = false;
    loop {
        let Some(tier) = qos.tier() else {
            // The control block took the tier away: launches run at the user's share alone.
            if !untiered {
                untiered = true;
                for (d, dev) in devices.iter_mut().enumerate() {
                    plant.sm.set_qos(d, None);
                    plant.sm.set_gate(d, false);
                    plant.windows[d].set_qos(0);
                    dev.applied = 0;
                    dev.latency_slots.clear();
                }
                for d in 0..MAX_DEVICES {
                    plant.sm.set_tiered(d, false);
                }
            }
            std::thread::sleep(TICK);
            continue;
        };
        if std::mem::take(&mut untiered) {
            for d in 0..MAX_DEVICES {
                plant.sm.set_tiered(d, true);
            }
        }
        // Every millisecond in a latency container, and woken by its first launch after a pause
        // (a sporadic request is over before a slower tick would publish it): about 1,000
        // wake-ups a second, each a clock read and at most one 64-byte pwrite. Every 200 us in
        // a best-effort one beside a latency one (each a clock read and a 64-byte pread per
        // neighbour): what a request shares the GPU with before the gate closes.
        let tick = if tier == Tier::Latency {
            FAST_TICK
        } else if devices.iter().any(|d| !d.latency_slots.is_empty()) {
            GATE_TICK
        } else {
            TICK
        };
        // A wake-up (or a spurious return) only makes the tick early.
        std::thread::park_timeout(tick);
        let now_ns = Clock::MONOTONIC.now();
        let full = now_ns.saturating_sub(last_full) >= TICK.as_nanos() as u64 - 500_000;
        if full {
            last_full = now_ns;
        }
        let now_ms = now_ns / 1_000_000;
        // The lease's clock, as the SM feedback's (the same lease): CLOCK_MONOTONIC.
        let lease_ms = now_ms;
        let pid = os::pid() as u32;
        // Learnt at a full tick (a latency container's thread wakes every millisecond).
        if devices.is_empty() && full {
            let n = (plant.driver.device_count() as usize).min(MAX_DEVICES);
            devices = (0..n)
                .map(|d| Device {
                    id: plant.driver.uuid(d).map_or(0, |u| uuid_key(&u)),
                    // Unheld until it is measured.
                    allocated: DEVICE_PM,
                    ..Device::default()
                })
                .collect();
        }
        plant.panics.shield(|| {
            let entries = match (&board, full) {
                (Some(b), true) => match b.entries() {
                    Ok(e) => Some(e),
                    Err(e) => {
                        if !logged_error {
                            logged_error = true;
                            log::write(
                                plant.log,
                                Level::Info,
                                format_args!("{e}; QoS allocations hold meanwhile"),
                            );
                        }
                        None
                    }
                },
                _ => None,
            };
            for (d, dev) in devices.iter_mut().enumerate() {
                let share = &plant.windows[d];
                let leader = share.hold_lease(pid, lease_ms);
                if full {
                    if leader {
                        lead(
                            plant,
                            tier,
                            owner,
                            d,
                            dev,
                            entries.as_deref(),
                            &board,
                            now_ns,
                        );
                    }
                    follow(plant, qos, tier, d, dev, entries.as_deref(), now_ms);
                }
                if let Some(b) = &board {
                    fast_tick(plant, qos, tier, d, dev, b, leader, now_ns);
                }
            }
        });
    }
}

/// The lease holder's tick on device `d`: measure, publish, allocate.
#[allow(clippy::too_many_arguments)]
fn lead(
    plant: Plant,
    tier: Tier,
    owner: u64,
    d: usize,
    dev: &mut Device,
    entries: Option<&[(usize, BoardEntry)]>,
    board: &Option<Board>,
    now_ns: u64,
) {
    let share = &plant.windows[d];
    if let Some(region) = plant.region.filter(|_| plant.gpu_time) {
        dev.gpu.observe(now_ns, &container_gpu_time(region, d));
    }
    let last = share.view().last;
    let active = last != 0 && now_ns.saturating_sub(last) < ACTIVE_NS;
    let closes = share.closes();
    let held = closes != dev.closes;
    dev.closes = closes;
    let cap_pm = match plant.sm.percent(d) {
        0 => DEVICE_PM,
        p => u16::from(p) * 10,
    };
    // What it used: its sampled GPU time; without a reading, what it was allocated (it grows
    // by the headroom each tick until it is held back or reaches its cap).
    let used_pm = dev
        .gpu
        .share()
        .map_or(dev.allocated, |s| (s * 10.0).round() as u16);
    let (tier_byte, guarantee_pm) = tier.encode();
    let me = Contender {
        tier,
        cap_pm,
        used_pm,
        held,
    };
    let mut contenders = vec![me];
    let mut keys = vec![owner];
    let now_ms = now_ns / 1_000_000;
    if let Some(entries) = entries.filter(|_| dev.id != 0) {
        for (_, e) in entries
            .iter()
            .filter(|(_, e)| e.owner != owner && e.device == dev.id && e.active && e.fresh(now_ms))
        {
            let Some(tier) = Tier::decode(e.tier, e.guarantee_pm) else {
                continue;
            };
            contenders.push(Contender {
                tier,
                cap_pm: e.cap_pm.clamp(1, DEVICE_PM),
                used_pm: e.used_pm.min(DEVICE_PM),
                held: e.held,
            });
            keys.push(e.owner);
        }
    }
    let (mut allocated, free) = if active {
        let all = allocate(&contenders);
        (all[0], runs_free(&contenders, &all, &keys) == Some(0))
    } else {
        // Idle: nothing to hold back; it asks again when it launches.
        (cap_pm, true)
    };
    let mut short = false;
    if let Tier::Guaranteed(g) = tier {
        let floor = g.min(cap_pm);
        // It wants its guarantee and is short of it by more than a point (the allocation's
        // rounding): guarantees that do not fit.
        short = active && me.demand_pm() >= floor && allocated + 10 < floor;
        // Whatever the board says, a guarantee is kept (guarantees that do not fit are the
        // operator's to fix; the region says so).
        allocated = allocated.max(floor);
    }
    dev.allocated = allocated;
    share.set_qos(qos_word(QosState {
        tier: tier_byte,
        guarantee_pm,
        allocated_pm: allocated,
        held,
        short,
        free,
    }));
    let (Some(board), Some(entries)) = (board, entries) else {
        return;
    };
    if dev.id == 0 {
        return;
    }
    // Its own entry, else a free or stale one; a slot another container took since is given up.
    let slot = dev
        .slot
        .filter(|&s| {
            entries
                .iter()
                .find(|(i, _)| *i == s)
                .is_none_or(|(_, e)| e.owner == owner || !e.fresh(now_ms))
        })
        .or_else(|| slot_for(entries, owner, dev.id, now_ms));
    dev.slot = slot;
    let Some(slot) = slot else { return };
    dev.entry = BoardEntry {
        owner,
        device: dev.id,
        heartbeat_ms: now_ms,
        tier: tier_byte,
        guarantee_pm,
        cap_pm,
        active,
        held,
        used_pm,
        allocated_pm: allocated,
        latency_until_ns: dev.published_until,
        pid: os::pid() as u32,
    };
    let _ = board.write(slot, &dev.entry);
}

/// Every process's tick on device `d`: apply the container's allocation; find latency
/// neighbours (best effort).
#[allow(clippy::too_many_arguments)]
fn follow(
    plant: Plant,
    qos: &Qos,
    tier: Tier,
    d: usize,
    dev: &mut Device,
    entries: Option<&[(usize, BoardEntry)]>,
    now_ms: u64,
) {
    if let Some(q) = decode_qos(plant.windows[d].qos()) {
        // The container that runs free holds nothing back below its ceiling.
        let pct = if q.free {
            100
        } else {
            q.allocated_pm.div_ceil(10).min(100) as u8
        };
        let moved = pct.abs_diff(dev.applied) >= HYSTERESIS_PCT
            || (pct == 100) != (dev.applied == 100)
            || dev.applied == 0;
        if moved && pct != 0 {
            dev.applied = pct;
            plant.sm.set_qos(d, Some(pct));
        }
    }
    if tier != Tier::BestEffort {
        return;
    }
    if let Some(entries) = entries {
        dev.latency_slots = entries
            .iter()
            .filter(|(_, e)| {
                e.device == dev.id
                    && dev.id != 0
                    && e.fresh(now_ms)
                    && Tier::decode(e.tier, e.guarantee_pm) == Some(Tier::Latency)
            })
            .map(|(i, _)| *i)
            .collect();
        plant.sm.set_gate(d, !dev.latency_slots.is_empty());
        if dev.latency_slots.is_empty() {
            // Relaxed: a value best-effort launches compare with the clock.
            qos.latency.gates[d].store(0, Ordering::Relaxed);
        }
    }
}

/// Following latency work: publish our own (latency tier, lease holder), or copy the
/// neighbours' into the gate (best effort).
#[allow(clippy::too_many_arguments)]
fn fast_tick(
    plant: Plant,
    qos: &Qos,
    tier: Tier,
    d: usize,
    dev: &mut Device,
    board: &Board,
    leader: bool,
    now_ns: u64,
) {
    match tier {
        Tier::Latency if leader => {
            let last = plant.windows[d].view().last;
            let until = if last == 0 { 0 } else { last + LATENCY_HOLD_NS };
            if until != dev.published_until && until > now_ns {
                dev.published_until = until;
                if let Some(slot) = dev.slot.filter(|_| dev.entry.owner != 0) {
                    dev.entry.latency_until_ns = until;
                    if board.write(slot, &dev.entry).is_ok() {
                        // Relaxed: a time the launches compare with the clock (a launch past it
                        // wakes this thread).
                        qos.latency.published[d].store(until, Ordering::Relaxed);
                    }
                }
            }
        }
        Tier::BestEffort if !dev.latency_slots.is_empty() => {
            let until = dev
                .latency_slots
                .iter()
                .filter_map(|&s| board.entry(s).ok().flatten())
                .filter(|e| e.device == dev.id)
                .map(|e| e.latency_until_ns)
                // A figure further ahead than a gate wait is not believed.
                .filter(|&u| u <= now_ns + limiter_core::sm::MAX_GATE_WAIT_NS)
                .max()
                .unwrap_or(0);
            // Relaxed: a value best-effort launches compare with the clock.
            qos.latency.gates[d].store(until, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// The container's key on the board: its region file (every process of the container maps the
/// same one), else this process.
fn owner_key(region: Option<&Region>) -> u64 {
    let id = region
        .and_then(|r| std::fs::metadata(r.path()).ok())
        .map_or_else(
            || (u64::from(os::pid() as u32), 0x7072_6f63),
            |m| (m.dev(), m.ino()),
        );
    mix(mix(0x5155_4f53, id.0), id.1).max(1)
}

/// A GPU's key on the board (never 0).
fn uuid_key(uuid: &[u8; 16]) -> u64 {
    let (a, b) = uuid.split_at(8);
    let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
    mix(mix(0x4750_5531, word(a)), word(b)).max(1)
}

fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(31)
}
