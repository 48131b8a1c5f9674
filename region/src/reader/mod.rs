//! The agent's read-only view of a region.
//!
//! The file is opened `O_RDONLY` and read with `pread(2)` into private copies: it is never
//! mapped, so the agent cannot write into it, and a container that truncates its file while the
//! agent reads it causes a short read (a typed [`ReadError::Truncated`]), never a `SIGBUS`. A
//! container can write anything into its own region, so nothing read from it is trusted: magic,
//! version, sizes and every count are validated against this crate's constants and the file's
//! size before use; indices come from those constants; arithmetic on values read from the file
//! saturates or wraps instead of panicking. The reader never reclaims anything.
//!
//! A snapshot has a [`ReadBudget`]: wall time and seqlock retries for the whole region. A region
//! whose records stay odd (a stuck writer, or a tenant that writes odd sequences on purpose)
//! would otherwise cost every record its full [`crate::seqlock::READ_RETRIES`] copies: 1,024
//! slots of such records took 190 s to read. When the budget runs out the read stops, and what
//! was not read is named in [`RegionSnapshot::unread`], never waited for. A slot is in a
//! snapshot whole or not at all: one the budget ran out in is left out with the slots after it
//! (its figures would be short of its counters' and go back; a reader keeps the last whole ones).

use agent_common::MAX_DEVICES;
use std::mem::offset_of;
use std::path::Path;
use std::sync::atomic::{Ordering, fence};

use crate::layout::{
    CONTEXT_REFUSED, HEADER_SIZE, RegionHeader, SHARDS_PER_SLOT, SlotHeader, SlotRecord,
    shard_stride_for, slot_stride_for,
};
use crate::layout_v2::{SlotHeaderV2, SlotRecordV2};
use crate::pread;
use crate::procfs::{self, Liveness};
use crate::words::init_pid;
use crate::words::{
    PHASE_CLAIMING, PHASE_FREE, PHASE_LIVE, PHASE_RECLAIMING, slot_phase, slot_pid,
};
use tenant_fs::{Access, TenantFile};

mod budget;
mod file;
mod shards;
mod snapshot;
mod validate;
pub use budget::ReadBudget;
use budget::Spend;
pub use file::{Geometry, ReadError, RegionReader};
pub use snapshot::{
    ApiStats, BudgetLimit, DeviceSnapshot, GpuTimeStats, KernelStats, OomWait, OwnFreezeSlot,
    ReadCounters, RegionSnapshot, ShardProblem, ShardProblemKind, SlotPhase, SlotSnapshot, Unread,
};
pub(crate) use validate::validate_header;

impl RegionReader {
    /// Opens and validates a region read-only, by a path the operator gave
    /// ([`tenant_fs::open_no_links`]: no symbolic link anywhere in it, only a regular file).
    pub fn open(path: &Path) -> Result<RegionReader, ReadError> {
        RegionReader::from_file(tenant_fs::open_no_links(path, Access::Read)?)
    }

    /// Validates a region opened through [`tenant_fs`] (read-only).
    pub fn from_file(file: TenantFile) -> Result<RegionReader, ReadError> {
        let path = file.path().to_path_buf();
        let len = file.current_len()?;
        let file = file.into_file();
        if len < HEADER_SIZE as u64 {
            return Err(ReadError::Truncated {
                len,
                needed: HEADER_SIZE as u64,
            });
        }
        let mut reader = RegionReader {
            file,
            path,
            geometry: Geometry {
                slot_count: 0,
                device_count: 0,
                total_size: 0,
                major: 0,
                minor: 0,
            },
        };
        let mut header = pread::boxed_zeroed::<RegionHeader>();
        reader.read_pod(0, &mut *header)?;
        reader.geometry = validate_header(&header, len)?;
        Ok(reader)
    }

    /// The validated geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The region's thaw request (`RegionHeader::thaw_request`): the generation of the control
    /// block that marked the container frozen, as a limiter stored it; 0 = none. One `pread`.
    pub fn thaw_request(&self) -> Result<u64, ReadError> {
        let offset = offset_of!(RegionHeader, thaw_request) as u64;
        pread::read_u64(&self.file, offset).map_err(|e| self.pread_error(e))
    }

    /// Reads the region within [`ReadBudget::DEFAULT`] (see [`RegionReader::snapshot_within`]).
    pub fn snapshot(&self) -> Result<RegionSnapshot, ReadError> {
        self.snapshot_within(&ReadBudget::DEFAULT)
    }

    /// Reads the whole region, or as much of it as `budget` allows (the rest is named in
    /// [`RegionSnapshot::unread`]). Each shard is read consistently or reported; a dead writer
    /// never makes this spin, and a file truncated or rewritten meanwhile gives a typed error.
    pub fn snapshot_within(&self, budget: &ReadBudget) -> Result<RegionSnapshot, ReadError> {
        let mut spend = Spend::new(budget);
        let len = self
            .file
            .metadata()
            .map_err(|source| ReadError::Io {
                call: "fstat",
                path: self.path.clone(),
                source,
            })?
            .len();
        let mut header = pread::boxed_zeroed::<RegionHeader>();
        self.read_pod(0, &mut *header)?;
        let geometry = validate_header(&header, len)?;
        if geometry != self.geometry {
            return Err(ReadError::BadField {
                field: "slot_count",
                offset: 32,
                found: geometry.slot_count.into(),
                expected: self.geometry.slot_count.to_string(),
            });
        }
        // Relaxed loads from here on read private copies: nothing else touches them.
        let r = Ordering::Relaxed;
        let creator_pid_ns = header.creator_pid_ns.load(r);
        let my_ns = tenant_fs::own_pid_namespace().unwrap_or(0);
        let bytes = byte_decoder(geometry.major);
        let devices = header.devices[..geometry.device_count as usize]
            .iter()
            .zip(&header.sm)
            .map(|(d, sm)| DeviceSnapshot {
                memory_limit: d.memory_limit.load(r),
                sm_limit: d.sm_limit.load(r).min(100) as u8,
                reserved: bytes(d.reserved.load(r)),
                peak_reserved: d.peak_reserved.load(r),
                denied: d.denied.load(r),
                reclaimed_bytes: d.reclaimed_bytes.load(r),
                // A tenant's word: only a state that makes sense is believed.
                qos: crate::sm_share::decode_qos(sm.qos.load(r)).filter(|q| {
                    (1..=3).contains(&q.tier)
                        && q.guarantee_pm <= 1000
                        && q.allocated_pm <= 1000
                        && (q.tier == 2) == (q.guarantee_pm > 0)
                }),
            })
            .collect();
        let mut counters = ReadCounters::default();
        let mut slots = Vec::new();
        let words = shards::SHARD_WORDS.max(shards::SHARD_WORDS_V2);
        let mut scratch = Scratch {
            header: pread::boxed_zeroed(),
            header_v2: pread::boxed_zeroed(),
            shard: vec![0u64; words].into_boxed_slice(),
            shard_b: vec![0u64; words].into_boxed_slice(),
        };
        let stride = slot_stride_for(geometry.major) as u64;
        let at = |index: u32| HEADER_SIZE as u64 + u64::from(index) * stride;
        let mut unread = None;
        for index in 0..geometry.slot_count {
            if !spend.in_time() {
                unread = Some(index);
                break;
            }
            let ctx = SlotContext {
                offset: at(index),
                index,
                geometry,
                my_ns,
            };
            let read = self.read_slot(&ctx, &mut scratch, &mut counters, &mut spend)?;
            if !read.whole {
                unread = Some(index);
                break;
            }
            slots.extend(read.slot);
        }
        let unread = match unread {
            Some(first_slot) => Some(Unread {
                limit: spend.out.unwrap_or(BudgetLimit::Time),
                first_slot,
                slots: self.count_claimed(first_slot, &at)?,
            }),
            None => None,
        };
        Ok(RegionSnapshot {
            geometry,
            creator_pid: init_pid(header.init_state.load(r)),
            creator_pid_ns,
            same_pid_namespace: my_ns != 0 && my_ns == creator_pid_ns,
            created_at_unix_ns: header.created_at_unix_ns.load(r),
            init_takeovers: header.init_takeovers.load(r),
            freeze_after_ms: header.freeze_after_ms.load(r),
            devices,
            slots,
            counters,
            unread,
        })
    }

    /// Non-free slots from `first` on, by their state words alone (one 8-byte read each).
    fn count_claimed(&self, first: u32, at: &dyn Fn(u32) -> u64) -> Result<u32, ReadError> {
        let mut claimed = 0;
        for index in first..self.geometry.slot_count {
            if slot_phase(self.read_u64(at(index))?) != PHASE_FREE {
                claimed += 1;
            }
        }
        Ok(claimed)
    }

    /// Reads slot `ctx.index` (at `ctx.offset`): its state word, its header, each shard it has
    /// used (`used_shards`) under the shard's seqlock or its records' (layout 3), then the state
    /// word again; a slot whose word changed meanwhile (recycled) is re-read, at most
    /// [`SLOT_READ_ATTEMPTS`] times. A slot `spend` runs out in is left out ([`SlotRead::CUT`]).
    fn read_slot(
        &self,
        ctx: &SlotContext,
        scratch: &mut Scratch,
        counters: &mut ReadCounters,
        spend: &mut Spend,
    ) -> Result<SlotRead, ReadError> {
        let SlotContext {
            offset,
            index,
            geometry,
            my_ns,
        } = *ctx;
        let v3 = geometry.major >= 3;
        let shards_at = offset
            + if v3 {
                offset_of!(SlotRecord, shards)
            } else {
                offset_of!(SlotRecordV2, shards)
            } as u64;
        let shard_stride = shard_stride_for(geometry.major) as u64;
        for attempt in 0..SLOT_READ_ATTEMPTS {
            let word = self.read_u64(offset)?;
            // Keeps the header copy's loads after the state word's (the claimer publishes LIVE
            // with Release after the identity): see `seqlock::read_copied`.
            fence(Ordering::Acquire);
            let phase = match slot_phase(word) {
                PHASE_FREE => return Ok(SlotRead::whole(None)),
                PHASE_CLAIMING => SlotPhase::Claiming,
                PHASE_LIVE => SlotPhase::Live,
                PHASE_RECLAIMING => SlotPhase::Reclaiming,
                // Garbage phase in a hostile file: show nothing rather than guess.
                _ => return Ok(SlotRead::whole(None)),
            };
            let h = if v3 {
                self.read_pod(offset, &mut *scratch.header)?;
                HeaderFields::of(&scratch.header)
            } else {
                self.read_pod(offset, &mut *scratch.header_v2)?;
                HeaderFields::of_v2(&scratch.header_v2)
            };
            let pid = slot_pid(word);
            let name_len = h.name.iter().position(|&b| b == 0).unwrap_or(16);
            let devices = geometry.device_count as usize;
            let bytes = byte_decoder(geometry.major);
            // Shards never written since the slot was claimed hold zeroes (the claimer reset
            // them): skipping them saves most of the copying. A writer that clears bits only
            // hides its own statistics.
            let mut totals = shards::Totals::new();
            for shard_index in (0..SHARDS_PER_SLOT).filter(|i| h.used_shards & (1 << i) != 0) {
                if !spend.in_time() {
                    return Ok(SlotRead::CUT);
                }
                let at = shards_at + shard_index as u64 * shard_stride;
                if v3 {
                    let copies = (&mut scratch.shard[..], &mut scratch.shard_b[..]);
                    let shard = (shard_index, pid, h.shard_owner[shard_index]);
                    self.read_shard_v3(at, shard, copies, &mut totals, (counters, spend))?;
                } else {
                    let buf = &mut scratch.shard[..];
                    let before = counters.seqlock_retries;
                    self.read_shard_v2(at, (shard_index, pid), buf, &mut totals, counters)?;
                    // A layout 1/2 shard has at most READ_RETRIES attempts of its own.
                    spend.retry(counters.seqlock_retries - before);
                }
            }
            // The budget ran out in the last shard: records may have been left out for it.
            if !spend.in_time() {
                return Ok(SlotRead::CUT);
            }
            fence(Ordering::Acquire);
            // The owner may have changed while we copied (a new owner must first move the word
            // through RECLAIMING and FREE): then the copies may mix two owners; read again.
            if h.state != word || self.read_u64(offset)? != word {
                counters.slot_rereads += 1;
                if attempt + 1 == SLOT_READ_ATTEMPTS {
                    counters.slots_skipped += 1;
                }
                if !spend.in_time() {
                    return Ok(SlotRead::CUT);
                }
                continue;
            }
            let alive = (my_ns != 0 && h.pid_ns == my_ns && phase == SlotPhase::Live)
                .then(|| procfs::liveness(pid, h.start_time) == Liveness::Alive);
            let slot = SlotSnapshot {
                index,
                phase,
                pid,
                start_time: h.start_time,
                pid_ns: h.pid_ns,
                alive,
                name: String::from_utf8_lossy(&h.name[..name_len]).into_owned(),
                held: h.held[..devices].iter().map(|&w| bytes(w)).collect(),
                context_bytes: h.context_bytes[..devices]
                    .iter()
                    .map(|&w| if w & CONTEXT_REFUSED == 0 { w } else { 0 })
                    .collect(),
                context_refused: h.context_bytes[..devices]
                    .iter()
                    .map(|&w| {
                        if w & CONTEXT_REFUSED == 0 {
                            0
                        } else {
                            w & !CONTEXT_REFUSED
                        }
                    })
                    .collect(),
                dropped_records: h.dropped_records,
                oom_wait: (h.oom_wait_bytes != 0).then_some(OomWait {
                    device: h.oom_wait_device,
                    bytes: h.oom_wait_bytes,
                    seq: h.oom_wait_seq,
                }),
                own_freeze: crate::OwnFreeze::decode(h.own_freeze).map(|state| OwnFreezeSlot {
                    state,
                    bytes: h.own_freeze_bytes,
                }),
                throttled_ns: totals.throttled_ns,
                apis: totals.merged.into_iter().flatten().collect(),
                shard_problems: totals.problems,
                gpu_time: totals.gpu_time[..devices].to_vec(),
                sample_errors: totals.sample_errors,
                samples_skipped: totals.samples_skipped,
                kernels: {
                    let mut k = totals.kernels;
                    k.sort_by_key(|a| std::cmp::Reverse(a.time.estimated_ns));
                    k
                },
            };
            return Ok(SlotRead::whole(Some(slot)));
        }
        Ok(SlotRead::whole(None))
    }
}

/// Where a slot is and what the reader needs to know about the region to read it.
struct SlotContext {
    offset: u64,
    index: u32,
    geometry: Geometry,
    my_ns: u64,
}

/// A slot as read: `None` if free (or left out); `whole` false if the budget ran out during it
/// (then `slot` is `None`: the slot is left out).
struct SlotRead {
    slot: Option<SlotSnapshot>,
    whole: bool,
}

impl SlotRead {
    const CUT: SlotRead = SlotRead {
        slot: None,
        whole: false,
    };

    fn whole(slot: Option<SlotSnapshot>) -> SlotRead {
        SlotRead { slot, whole: true }
    }
}

/// Private buffers for one snapshot's copies. A shard is copied as plain words (it is private,
/// so the merge can use plain, vectorisable loads); the indices come from the layout.
struct Scratch {
    header: Box<SlotHeader>,
    header_v2: Box<SlotHeaderV2>,
    /// Shard copies (layout 3 compares two).
    shard: Box<[u64]>,
    shard_b: Box<[u64]>,
}

/// The slot header fields a snapshot shows, from a private copy of either layout.
struct HeaderFields {
    state: u64,
    start_time: u64,
    pid_ns: u64,
    name: [u8; 16],
    held: [u64; MAX_DEVICES],
    context_bytes: [u64; MAX_DEVICES],
    dropped_records: u64,
    /// The wait for device memory (layout 3.5; zero in layouts 1 and 2).
    oom_wait_bytes: u64,
    oom_wait_device: u64,
    oom_wait_seq: u64,
    /// The in-process freeze (layout 3.6; zero before).
    own_freeze: u64,
    own_freeze_bytes: u64,
    used_shards: u64,
    /// Owning thread of each shard (layout 3; layouts 1 and 2 keep it in the shard).
    shard_owner: [u64; SHARDS_PER_SLOT],
}

macro_rules! header_fields {
    ($h:expr, $owner:expr, $oom_wait:expr, $own_freeze:expr) => {{
        let h = $h;
        // Relaxed: loads from a private copy.
        let r = Ordering::Relaxed;
        let mut name = [0u8; 16];
        name[..8].copy_from_slice(&h.name[0].load(r).to_le_bytes());
        name[8..].copy_from_slice(&h.name[1].load(r).to_le_bytes());
        HeaderFields {
            state: h.state.load(r),
            start_time: h.start_time.load(r),
            pid_ns: h.pid_ns.load(r),
            name,
            held: std::array::from_fn(|d| h.held[d].load(r)),
            context_bytes: std::array::from_fn(|d| h.context_bytes[d].load(r)),
            dropped_records: h.dropped_records.load(r),
            oom_wait_bytes: $oom_wait[0],
            oom_wait_device: $oom_wait[1],
            oom_wait_seq: $oom_wait[2],
            own_freeze: $own_freeze[0],
            own_freeze_bytes: $own_freeze[1],
            used_shards: h.used_shards.load(r),
            shard_owner: $owner,
        }
    }};
}

impl HeaderFields {
    fn of(h: &SlotHeader) -> HeaderFields {
        // Relaxed: loads from a private copy.
        let r = Ordering::Relaxed;
        header_fields!(
            h,
            std::array::from_fn(|i| h.shard_owner[i].load(r)),
            [
                h.oom_wait_bytes.load(r),
                h.oom_wait_device.load(r),
                h.oom_wait_seq.load(r)
            ],
            [h.own_freeze.load(r), h.own_freeze_bytes.load(r)]
        )
    }

    fn of_v2(h: &SlotHeaderV2) -> HeaderFields {
        header_fields!(h, [0; SHARDS_PER_SLOT], [0; 3], [0; 2])
    }
}

const SLOT_READ_ATTEMPTS: u32 = 3;

/// How `reserved` and `held` words hold bytes: major 1 plain, majors 2 and 3 in bits 0..48 under a tag
/// (whatever the tag holds, the bytes are at most 2^48 - 1).
fn byte_decoder(major: u32) -> fn(u64) -> u64 {
    if major == 1 {
        |w| w
    } else {
        crate::reserve::word_bytes
    }
}
