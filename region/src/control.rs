//! The control block: run-time limit changes, written by the agent (`vgpu-agent limit set`) into
//! a small file *beside* a container's region (`<region>.ctl`, see [`control_path`]) and read by
//! the limiter. The agent never writes into the accounting region itself; the limiter applies
//! what it reads (a memory limit into the region's `DeviceState.memory_limit`, an SM share into
//! its launch controller).
//!
//! Protocol: one seqlocked page of atomics. The writer takes the `generation` word from even to
//! odd by CAS (one writer at a time; a writer that stays odd for [`WRITER_STALL_MS`] is taken over),
//! stores the fields, then stores the next even value with `Release`. Readers load `generation`
//! (`Acquire`), copy the words, `fence(Acquire)`, reload it, and retry a bounded number of times.
//! Generation 0 means "never written" (a zero-filled file, as the limiter creates it): no
//! overrides. Every other copy is validated ([`decode`]) into typed errors; the limiter keeps its
//! last applied settings when a copy does not validate.
//!
//! See `docs/region.md` ("Control block") for the field table.

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use agent_common::MAX_DEVICES;

/// `b"VGPUCTL1"` read as a little-endian `u64`.
pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"VGPUCTL1");
/// Major version: readers reject any other major.
pub const CONTROL_MAJOR: u32 = 1;
/// Minor version: additions inside `spare`; readers accept any minor.
pub const CONTROL_MINOR: u32 = 1;
/// How long a writer may hold the generation odd before another writer takes over.
pub const WRITER_STALL_MS: u64 = 200;
/// Copies a reader attempts before reporting the block as busy.
pub const CONTROL_READ_RETRIES: u32 = 64;

/// The control block's layout (the whole file).
#[repr(C)]
pub struct ControlBlock {
    /// Seqlock word: 0 = never written, odd = a write is in progress, even = a complete
    /// generation. Every write adds 2.
    pub generation: AtomicU64,
    /// [`CONTROL_MAGIC`].
    pub magic: AtomicU64,
    /// `major << 32 | minor`.
    pub version: AtomicU64,
    /// Bytes of the block (`size_of::<ControlBlock>()`).
    pub size: AtomicU64,
    /// Bit `i`: `sm_percent[i]` overrides the environment's SM limit of device `i`.
    pub sm_set: AtomicU64,
    /// Bit `i`: `memory_limit[i]` overrides the environment's memory limit of device `i`.
    pub memory_set: AtomicU64,
    /// `CLOCK_REALTIME` nanoseconds of the last write.
    pub written_at_unix_ns: AtomicU64,
    /// Pid of the last writer (in its pid namespace).
    pub writer_pid: AtomicU64,
    /// SM share per device in percent, `0..=100` (0 and 100: no SM limit).
    pub sm_percent: [AtomicU64; MAX_DEVICES],
    /// Memory limit per device in bytes (0: no memory limit).
    pub memory_limit: [AtomicU64; MAX_DEVICES],
    /// Room for growth (minor versions).
    pub spare: [AtomicU64; 8],
}

/// Bytes of a control block file.
pub const CONTROL_SIZE: usize = size_of::<ControlBlock>();
/// Words of a control block.
pub const CONTROL_WORDS: usize = CONTROL_SIZE / 8;

const _: () = assert!(CONTROL_SIZE == 384);
const _: () = assert!(offset_of!(ControlBlock, generation) == 0);
const _: () = assert!(offset_of!(ControlBlock, magic) == 8);
const _: () = assert!(offset_of!(ControlBlock, version) == 16);
const _: () = assert!(offset_of!(ControlBlock, size) == 24);
const _: () = assert!(offset_of!(ControlBlock, sm_set) == 32);
const _: () = assert!(offset_of!(ControlBlock, memory_set) == 40);
const _: () = assert!(offset_of!(ControlBlock, written_at_unix_ns) == 48);
const _: () = assert!(offset_of!(ControlBlock, writer_pid) == 56);
const _: () = assert!(offset_of!(ControlBlock, sm_percent) == 64);
const _: () = assert!(offset_of!(ControlBlock, memory_limit) == 192);
const _: () = assert!(offset_of!(ControlBlock, spare) == 320);
const _: () = assert!(MAX_DEVICES <= 64, "the *_set masks have one bit per device");

// Word indices, as `decode` sees a copy.
const W_GENERATION: usize = 0;
const W_MAGIC: usize = 1;
const W_VERSION: usize = 2;
const W_SIZE: usize = 3;
const W_SM_SET: usize = 4;
const W_MEMORY_SET: usize = 5;
pub(crate) const W_WRITTEN_AT: usize = 6;
pub(crate) const W_WRITER_PID: usize = 7;
const W_SM: usize = 8;
const W_MEMORY: usize = W_SM + MAX_DEVICES;
pub(crate) const W_SPARE: usize = W_MEMORY + MAX_DEVICES;
const _: () = assert!(W_SPARE * 8 == offset_of!(ControlBlock, spare));
/// The QoS tier override (minor 1): the last spare word. 0: none; else `1 << 63 | tier |
/// guarantee per mille << 8` (tier 0: no tier, 1 latency, 2 guaranteed, 3 best effort).
const W_QOS: usize = W_SPARE + 7;
/// The freeze mark (minor 1): the first spare word, a [`FreezeMark`].
pub(crate) const W_FROZEN: usize = W_SPARE;

/// Where a freeze of the container stands, as the agent marks it in the control block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FreezeMark {
    /// Not frozen (word 0).
    #[default]
    Running,
    /// A freeze is starting (word 1): a CUDA call waits in the limiter, before the driver, for
    /// the freeze and the thaw after it.
    Freezing,
    /// Frozen (word 2): a CUDA call asks the agent for the thaw (the region's `thaw_request`)
    /// and waits for it.
    Frozen,
    /// Frozen by each process itself (word 3), the limiter's in-process path
    /// (`VGPU_FREEZE_IN_PROCESS`): every process moves the device memory it backs to host memory
    /// and answers in its slot ([`OwnFreeze`]); a CUDA call thaws its own process before it goes
    /// on and asks the agent (the region's `thaw_request`) to thaw the container's others. A
    /// process without the path treats it as `Frozen`.
    InProcess,
}

/// A process's in-process freeze, as its limiter publishes it in its slot (`own_freeze`, layout
/// 3.6): whether the path is on, where the process stands, and the control block generation it
/// last answered. Word: bit 0 the path is on, bits 1-2 the [`OwnFreezeState`], bits 8-63 the
/// generation (truncated to 56 bits). Word 0: the path is off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnFreeze {
    pub state: OwnFreezeState,
    /// The generation of the mark answered (56 bits), 0 = none yet.
    pub generation: u64,
}

/// Where a process's in-process freeze stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnFreezeState {
    /// Its memory is on the GPU.
    #[default]
    Running,
    /// The memory it backs is in host memory.
    Frozen,
    /// It could not freeze for the generation answered (its memory stayed on the GPU).
    Failed,
}

const OWN_GENERATION_BITS: u32 = 56;

impl OwnFreeze {
    /// The slot word; never 0 (bit 0: the path is on).
    pub fn encode(self) -> u64 {
        let state = match self.state {
            OwnFreezeState::Running => 0,
            OwnFreezeState::Frozen => 1,
            OwnFreezeState::Failed => 2,
        };
        1 | state << 1 | (self.generation & ((1 << OWN_GENERATION_BITS) - 1)) << 8
    }

    /// The word's meaning; `None` for 0 (the path is off) or a word no limiter writes (a
    /// tenant's: read as off).
    pub fn decode(word: u64) -> Option<OwnFreeze> {
        if word & 1 == 0 || word & 0xF8 != 0 {
            return None;
        }
        let state = match (word >> 1) & 3 {
            0 => OwnFreezeState::Running,
            1 => OwnFreezeState::Frozen,
            2 => OwnFreezeState::Failed,
            _ => return None,
        };
        Some(OwnFreeze {
            state,
            generation: word >> 8,
        })
    }

    /// Whether this answers the mark of control generation `generation`.
    pub fn answers(self, generation: u64) -> bool {
        self.generation == generation & ((1 << OWN_GENERATION_BITS) - 1)
    }
}
/// The spare words a minor version gave a meaning, which `encode` writes (the others are left as
/// they are: a newer writer's).
pub(crate) const ENCODED_SPARE: &[usize] = &[W_FROZEN, W_QOS];
const QOS_SET: u64 = 1 << 63;

/// The control block file of the region at `region`: `<region>.ctl`.
pub fn control_path(region: &Path) -> PathBuf {
    let mut s = region.as_os_str().to_owned();
    s.push(".ctl");
    PathBuf::from(s)
}

/// The overrides a control block holds. `None`: the environment's value applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlSettings {
    /// The container's QoS tier: `(tier, guarantee per mille)`, tier 0 for none, 1 latency, 2
    /// guaranteed (with a guarantee of 1 to 1000), 3 best effort.
    pub qos: Option<(u8, u16)>,
    /// SM share per device, percent `0..=100` (0 and 100: no SM limit).
    pub sm_percent: [Option<u8>; MAX_DEVICES],
    /// Memory limit per device, bytes (0: no memory limit).
    pub memory_limit: [Option<u64>; MAX_DEVICES],
    /// Whether the agent froze the container (its processes' next CUDA call asks for the thaw).
    pub freeze: FreezeMark,
}

impl ControlSettings {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.sm_percent.iter().all(Option::is_none)
            && self.memory_limit.iter().all(Option::is_none)
            && self.qos.is_none()
            && self.freeze == FreezeMark::Running
    }
}

/// A validated copy of a written control block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlSnapshot {
    /// The (even, non-zero) generation the copy belongs to.
    pub generation: u64,
    pub settings: ControlSettings,
    /// `CLOCK_REALTIME` nanoseconds of the write.
    pub written_at_unix_ns: u64,
    /// Pid of the writer.
    pub writer_pid: u64,
}

/// Why a control block (or a request to write one) is not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("control block is {len} bytes, shorter than {CONTROL_SIZE}")]
    TooShort { len: usize },
    #[error("control block magic is {found:#018x}, not {CONTROL_MAGIC:#018x}")]
    BadMagic { found: u64 },
    #[error("control block version {major}.{minor} is not supported (major {CONTROL_MAJOR})")]
    Version { major: u32, minor: u32 },
    #[error("control block says it is {found} bytes, expected {CONTROL_SIZE}")]
    Size { found: u64 },
    #[error("control block overrides devices {mask:#x}, beyond the {MAX_DEVICES} it holds")]
    DeviceMask { mask: u64 },
    #[error("control block sets device {device} to an SM share of {value}%, expected 0 to 100")]
    SmPercent { device: usize, value: u64 },
    #[error(
        "control block sets QoS tier {tier} with a guarantee of {guarantee} per mille: expected no tier (0), latency (1), guaranteed (2, a guarantee of 1 to 1000) or best effort (3)"
    )]
    Qos { tier: u64, guarantee: u64 },
    #[error("control block's freeze mark is {found}, expected 0, 1 or 2")]
    Frozen { found: u64 },
    #[error("control block is being written (generation {generation} stayed odd)")]
    Busy { generation: u64 },
    #[error("device {device} is beyond the {MAX_DEVICES} devices a control block holds")]
    NoSuchDevice { device: usize },
    #[error(
        "control block is {len} bytes, not {CONTROL_SIZE}: the agent writes only into a block of exactly that size"
    )]
    WrongSize { len: u64 },
    #[error("control block has {links} hard links: the agent writes only into a file with one")]
    HardLinked { links: u64 },
    #[error("control block changed size while being written: the write did not reach it")]
    ChangedWhileWriting,
    #[error("{call} on control block `{path}` failed: {message}")]
    Io {
        call: &'static str,
        path: PathBuf,
        message: String,
    },
}

/// Validates a consistent copy of the block's words. `Ok(None)`: never written (generation 0).
/// Never panics, whatever the words hold.
pub fn decode(words: &[u64]) -> Result<Option<ControlSnapshot>, ControlError> {
    if words.len() < CONTROL_WORDS {
        return Err(ControlError::TooShort {
            len: words.len() * 8,
        });
    }
    let generation = words[W_GENERATION];
    if generation == 0 {
        return Ok(None);
    }
    if generation & 1 == 1 {
        return Err(ControlError::Busy { generation });
    }
    if words[W_MAGIC] != CONTROL_MAGIC {
        return Err(ControlError::BadMagic {
            found: words[W_MAGIC],
        });
    }
    let (major, minor) = ((words[W_VERSION] >> 32) as u32, words[W_VERSION] as u32);
    if major != CONTROL_MAJOR {
        return Err(ControlError::Version { major, minor });
    }
    if words[W_SIZE] != CONTROL_SIZE as u64 {
        return Err(ControlError::Size {
            found: words[W_SIZE],
        });
    }
    let all = if MAX_DEVICES == 64 {
        u64::MAX
    } else {
        (1u64 << MAX_DEVICES) - 1
    };
    let (sm_set, memory_set) = (words[W_SM_SET], words[W_MEMORY_SET]);
    if (sm_set | memory_set) & !all != 0 {
        return Err(ControlError::DeviceMask {
            mask: (sm_set | memory_set) & !all,
        });
    }
    let mut settings = ControlSettings::default();
    for d in 0..MAX_DEVICES {
        if sm_set & (1 << d) != 0 {
            let value = words[W_SM + d];
            if value > 100 {
                return Err(ControlError::SmPercent { device: d, value });
            }
            settings.sm_percent[d] = Some(value as u8);
        }
        if memory_set & (1 << d) != 0 {
            settings.memory_limit[d] = Some(words[W_MEMORY + d]);
        }
    }
    let qos = words[W_QOS];
    if qos & QOS_SET != 0 {
        let (tier, guarantee) = (qos & 0xFF, (qos >> 8) & 0xFFFF);
        if !qos_valid(tier, guarantee) || qos & !(QOS_SET | 0xFF_FFFF) != 0 {
            return Err(ControlError::Qos { tier, guarantee });
        }
        settings.qos = Some((tier as u8, guarantee as u16));
    }
    settings.freeze = match words[W_FROZEN] {
        0 => FreezeMark::Running,
        1 => FreezeMark::Freezing,
        2 => FreezeMark::Frozen,
        3 => FreezeMark::InProcess,
        found => return Err(ControlError::Frozen { found }),
    };
    Ok(Some(ControlSnapshot {
        generation,
        settings,
        written_at_unix_ns: words[W_WRITTEN_AT],
        writer_pid: words[W_WRITER_PID],
    }))
}

/// Decodes a block from raw (little-endian) bytes, e.g. a file read with `pread`.
pub fn decode_bytes(bytes: &[u8]) -> Result<Option<ControlSnapshot>, ControlError> {
    if bytes.len() < CONTROL_SIZE {
        return Err(ControlError::TooShort { len: bytes.len() });
    }
    let words: Vec<u64> = bytes[..CONTROL_SIZE]
        .as_chunks::<8>()
        .0
        .iter()
        .map(|c| u64::from_le_bytes(*c))
        .collect();
    decode(&words)
}

/// The words a writer stores for `settings` (all but `generation`, `written_at` and `pid`).
pub(crate) fn encode(settings: &ControlSettings, words: &mut [u64; CONTROL_WORDS]) {
    words[W_MAGIC] = CONTROL_MAGIC;
    words[W_VERSION] = u64::from(CONTROL_MAJOR) << 32 | u64::from(CONTROL_MINOR);
    words[W_SIZE] = CONTROL_SIZE as u64;
    let (mut sm_set, mut memory_set) = (0u64, 0u64);
    for d in 0..MAX_DEVICES {
        if let Some(p) = settings.sm_percent[d] {
            sm_set |= 1 << d;
            words[W_SM + d] = u64::from(p);
        } else {
            words[W_SM + d] = 0;
        }
        if let Some(m) = settings.memory_limit[d] {
            memory_set |= 1 << d;
            words[W_MEMORY + d] = m;
        } else {
            words[W_MEMORY + d] = 0;
        }
    }
    words[W_SM_SET] = sm_set;
    words[W_MEMORY_SET] = memory_set;
    words[W_FROZEN] = match settings.freeze {
        FreezeMark::Running => 0,
        FreezeMark::Freezing => 1,
        FreezeMark::Frozen => 2,
        FreezeMark::InProcess => 3,
    };
    words[W_QOS] = settings.qos.map_or(0, |(tier, guarantee)| {
        QOS_SET | u64::from(tier) | u64::from(guarantee) << 8
    });
}

fn qos_valid(tier: u64, guarantee: u64) -> bool {
    match tier {
        2 => (1..=1000).contains(&guarantee),
        0 | 1 | 3 => guarantee == 0,
        _ => false,
    }
}

/// Checks settings before they are written.
pub fn validate(settings: &ControlSettings) -> Result<(), ControlError> {
    if let Some((tier, guarantee)) = settings.qos
        && !qos_valid(u64::from(tier), u64::from(guarantee))
    {
        return Err(ControlError::Qos {
            tier: u64::from(tier),
            guarantee: u64::from(guarantee),
        });
    }
    for (device, p) in settings.sm_percent.iter().enumerate() {
        if let Some(p) = *p
            && p > 100
        {
            return Err(ControlError::SmPercent {
                device,
                value: u64::from(p),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn written(settings: &ControlSettings, generation: u64) -> [u64; CONTROL_WORDS] {
        let mut w = [0u64; CONTROL_WORDS];
        encode(settings, &mut w);
        w[W_GENERATION] = generation;
        w
    }

    #[test]
    fn round_trip_and_zero_file() {
        assert_eq!(decode(&[0; CONTROL_WORDS]), Ok(None));
        let mut s = ControlSettings::default();
        s.sm_percent[1] = Some(40);
        s.memory_limit[0] = Some(1 << 30);
        s.memory_limit[15] = Some(0);
        let snap = decode(&written(&s, 2)).unwrap().unwrap();
        assert_eq!(snap.settings, s);
        assert_eq!(snap.generation, 2);
        for qos in [(0, 0), (1, 0), (2, 300), (3, 0)] {
            s.qos = Some(qos);
            assert_eq!(validate(&s), Ok(()));
            let snap = decode(&written(&s, 4)).unwrap().unwrap();
            assert_eq!(snap.settings.qos, Some(qos));
        }
        s.qos = None;
        for (mark, word) in [
            (FreezeMark::Freezing, 1),
            (FreezeMark::Frozen, 2),
            (FreezeMark::InProcess, 3),
        ] {
            s.freeze = mark;
            let snap = decode(&written(&s, 6)).unwrap().unwrap();
            assert!(snap.settings.freeze == mark && !snap.settings.is_empty());
            assert_eq!(written(&s, 6)[W_FROZEN], word, "the first spare word");
        }
        let mut w = written(&s, 6);
        w[W_FROZEN] = 4;
        assert_eq!(decode(&w), Err(ControlError::Frozen { found: 4 }));
        s.freeze = FreezeMark::Running;
        assert_eq!(written(&s, 6)[W_FROZEN], 0);
        assert!(ControlSettings::default().is_empty());
        for (tier, guarantee) in [(2, 0), (2, 1001), (1, 5), (4, 0)] {
            s.qos = Some((tier, guarantee));
            assert!(validate(&s).is_err(), "{tier} {guarantee}");
            assert!(
                matches!(decode(&written(&s, 4)), Err(ControlError::Qos { .. })),
                "{tier} {guarantee}"
            );
        }
    }

    #[test]
    fn malformed_blocks_are_typed_errors() {
        let s = ControlSettings::default();
        let mut w = written(&s, 3);
        assert_eq!(decode(&w), Err(ControlError::Busy { generation: 3 }));
        w[W_GENERATION] = 4;
        w[W_MAGIC] = 7;
        assert!(matches!(
            decode(&w),
            Err(ControlError::BadMagic { found: 7 })
        ));
        let mut w = written(&s, 4);
        w[W_VERSION] = 2 << 32;
        assert!(matches!(
            decode(&w),
            Err(ControlError::Version { major: 2, .. })
        ));
        let mut w = written(&s, 4);
        w[W_SIZE] = 8;
        assert!(matches!(decode(&w), Err(ControlError::Size { found: 8 })));
        let mut w = written(&s, 4);
        w[W_SM_SET] = 1 << 20;
        assert!(matches!(decode(&w), Err(ControlError::DeviceMask { .. })));
        let mut w = written(&s, 4);
        w[W_SM_SET] = 1 << 2;
        w[W_SM + 2] = 101;
        assert_eq!(
            decode(&w),
            Err(ControlError::SmPercent {
                device: 2,
                value: 101
            })
        );
        assert_eq!(decode(&w[..3]), Err(ControlError::TooShort { len: 24 }));
        assert_eq!(
            decode_bytes(&[0u8; 17]),
            Err(ControlError::TooShort { len: 17 })
        );
    }

    #[test]
    fn the_own_freeze_word_round_trips_and_zero_is_off() {
        assert_eq!(OwnFreeze::decode(0), None);
        for state in [
            OwnFreezeState::Running,
            OwnFreezeState::Frozen,
            OwnFreezeState::Failed,
        ] {
            for generation in [0, 1, 7, (1 << 56) - 1] {
                let o = OwnFreeze { state, generation };
                assert_ne!(o.encode(), 0);
                assert_eq!(OwnFreeze::decode(o.encode()), Some(o));
                assert!(o.answers(generation));
                assert!(!o.answers(generation ^ 1));
            }
        }
        // The generation is kept to 56 bits, and compared so.
        let o = OwnFreeze {
            state: OwnFreezeState::Frozen,
            generation: 1 << 56 | 5,
        };
        assert!(OwnFreeze::decode(o.encode()).unwrap().answers(1 << 56 | 5));
        // Words no limiter writes read as off.
        assert_eq!(OwnFreeze::decode(0b111), None, "state 3");
        assert_eq!(OwnFreeze::decode(1 | 1 << 4), None, "a reserved bit");
        assert_eq!(OwnFreeze::decode(2), None, "the path bit clear");
    }

    proptest! {
        #[test]
        fn any_own_freeze_word_decodes_or_reads_as_off(w in any::<u64>()) {
            if let Some(o) = OwnFreeze::decode(w) {
                prop_assert_eq!(o.encode(), w);
            }
        }
    }

    proptest! {
        /// Any bytes decode to a snapshot or a typed error, never a panic; a snapshot never holds
        /// an SM share above 100.
        #[test]
        fn hostile_bytes_give_typed_errors(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            match decode_bytes(&bytes) {
                Ok(Some(s)) => {
                    prop_assert!(s.generation % 2 == 0 && s.generation != 0);
                    prop_assert!(s.settings.sm_percent.iter().flatten().all(|&p| p <= 100));
                }
                Ok(None) => prop_assert!(bytes[..8] == [0; 8]),
                Err(_) => {}
            }
        }

        /// A valid block with one word replaced still decodes to a valid snapshot or a typed
        /// error.
        #[test]
        fn mutated_blocks_stay_valid_or_fail_typed(
            index in 0..CONTROL_WORDS,
            value in any::<u64>(),
            sm in 0u8..=100,
        ) {
            let mut s = ControlSettings::default();
            s.sm_percent[0] = Some(sm);
            let mut w = written(&s, 6);
            w[index] = value;
            if let Ok(Some(snap)) = decode(&w) {
                prop_assert!(snap.settings.sm_percent.iter().flatten().all(|&p| p <= 100));
            }
        }
    }
}
