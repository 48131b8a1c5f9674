//! Opening a region file and the compare-and-swap initialisation state machine.
//!
//! `init_state` (header offset 0) encodes `phase << 62 | pid << 40 | boottime_ms` (40 bits):
//! - `UNINIT` (0): a zero-filled file.
//! - `INITIALISING(pid, started_ms)`: one process won the CAS from 0 and writes the header.
//! - `READY(pid)`: published last, with `Release`; everything else in the header is final.
//!
//! Late arrivals take the fast path (an `Acquire` load that sees `READY`). Losers wait with
//! spins, yields and sleeps of at most 200 µs. An `INITIALISING` owner whose pid is gone (checked
//! only when it is in our pid namespace) or that has not finished within [`INIT_STALL_MS`] is
//! taken over by a CAS from the exact observed word, so exactly one process takes over; the
//! taken-over initialiser's own publishing CAS then fails and it becomes a waiter.

use agent_common::MAX_DEVICES;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agent_common::api::API_SLOTS;
use agent_common::hist::HIST_BUCKETS;

use crate::config::{ConfigMismatch, InitOutcome, RegionConfig};
use crate::error::RegionError;
use crate::handle::Region;
use crate::layout::{
    HEADER_SIZE, LAYOUT_MAJOR, LAYOUT_MINOR, REGION_MAGIC, RegionHeader, SHARD_SIZE,
    SHARDS_PER_SLOT, SLOT_SIZE, SlotRecord, region_size,
};
use crate::mapping::Mapping;
use crate::procfs::{self, Liveness};
use crate::words::{
    INIT_MS_MASK, PHASE_INITIALISING, PHASE_READY, PHASE_UNINIT, init_ms, init_phase, init_pid,
    init_word,
};

/// An initialiser that has not published `READY` after this long is taken over.
pub const INIT_STALL_MS: u64 = 1000;
/// A process gives up waiting for initialisation after this long.
pub const INIT_WAIT_LIMIT: Duration = Duration::from_secs(10);

fn io<'p>(call: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> RegionError + 'p {
    move |source| RegionError::Io {
        call,
        path: path.to_path_buf(),
        source,
    }
}

fn file_len(file: &File, path: &Path) -> Result<u64, RegionError> {
    Ok(file.metadata().map_err(io("fstat", path))?.len())
}

/// Grows the file to `size` if it is smaller. Never shrinks: `ftruncate` to a larger size is
/// idempotent among racing processes, while shrinking could cut pages others have mapped.
fn grow_to(file: &File, path: &Path, size: u64) -> Result<(), RegionError> {
    if file_len(file, path)? < size {
        file.set_len(size).map_err(io("ftruncate", path))?;
    }
    Ok(())
}

/// The mode of a region the limiter creates: read-write for its owner only. Another uid can
/// neither read nor change a container's accounting. A deployment that runs a container's GPU
/// processes under several uids creates the file beforehand with the mode it needs (an existing
/// file's mode is never changed); the agent flags such a region as writable by other uids.
pub const REGION_MODE: u32 = 0o600;

/// Creates the region file with [`REGION_MODE`], or opens it if another process created it first.
fn create(path: &Path) -> Result<File, RegionError> {
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(REGION_MODE)
        .custom_flags(libc::O_CLOEXEC)
        .open(path);
    let file = match created {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map_err(io("open", path));
        }
        Err(e) => return Err(io("open", path)(e)),
    };
    // The umask may have cleared bits of the mode: set it exactly on the file we just created,
    // without touching the process-wide umask.
    let meta = file.metadata().map_err(io("fstat", path))?;
    if meta.mode() & 0o777 != REGION_MODE {
        // SAFETY: a valid open fd; fchmod does not touch memory.
        if unsafe { libc::fchmod(file.as_raw_fd(), REGION_MODE) } != 0 {
            return Err(io("fchmod", path)(std::io::Error::last_os_error()));
        }
    }
    Ok(file)
}

pub(crate) fn open_or_create(
    path: &Path,
    config: &RegionConfig,
) -> Result<(Region, InitOutcome), RegionError> {
    config.validate()?;
    // Every process of a container but the first finds the file: open it without `O_CREAT`
    // first, which would take the directory's lock exclusively even for an existing file (64
    // processes starting together would queue on it).
    let existing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path);
    let file = match existing {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path)?,
        Err(e) => return Err(io("open", path)(e)),
    };
    let wanted = region_size(config.slots);
    grow_to(&file, path, wanted)?;
    let map = Mapping::new(&file, wanted as usize, true).map_err(io("mmap", path))?;
    let outcome = initialise(path, &map, config)?;
    let header: &RegionHeader = map.get(0).expect("the mapping is at least one header long");

    // READY: validate what the initialiser (maybe another process, maybe hostile) wrote, and map
    // exactly the size the header says.
    let total = header.total_size.load(Ordering::Relaxed);
    grow_to(&file, path, total)?;
    let invalid = |source| RegionError::Invalid {
        path: path.to_path_buf(),
        source,
    };
    let geometry =
        crate::reader::validate_header(header, file_len(&file, path)?).map_err(invalid)?;
    // Readers decode older majors; a writer speaks only its own protocol.
    if geometry.major != LAYOUT_MAJOR {
        return Err(invalid(crate::reader::ReadError::UnsupportedVersion {
            major: geometry.major,
            minor: geometry.minor,
            supported: LAYOUT_MAJOR,
        }));
    }
    let map = if map.len() as u64 == geometry.total_size {
        map
    } else {
        drop(map);
        Mapping::new(&file, geometry.total_size as usize, true).map_err(io("mmap", path))?
    };
    let region = Region {
        map,
        path: path.to_path_buf(),
        slot_count: geometry.slot_count,
        device_count: geometry.device_count,
        _file: file,
    };
    let outcome = match outcome {
        InitOutcome::Joined => {
            let effective = region.config();
            if effective.same_effect(config) {
                InitOutcome::Joined
            } else {
                InitOutcome::ConfigMismatch(Box::new(ConfigMismatch {
                    requested: config.clone(),
                    effective,
                }))
            }
        }
        other => other,
    };
    Ok((region, outcome))
}

/// Runs the state machine until the header is `READY`.
fn initialise(
    path: &Path,
    map: &Mapping,
    config: &RegionConfig,
) -> Result<InitOutcome, RegionError> {
    let header: &RegionHeader = map.get(0).expect("the mapping is at least one header long");
    let pid = std::process::id();
    // Read from `/proc` only when the region is not ready yet (a process joining a ready region,
    // the common case, needs none of it).
    let mut my_ns = None;
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        // Acquire: pairs with the initialiser's Release CAS to READY, making the header final.
        let word = header.init_state.load(Ordering::Acquire);
        match init_phase(word) {
            PHASE_READY => return Ok(InitOutcome::Joined),
            PHASE_UNINIT | PHASE_INITIALISING => {
                let my_ns =
                    *my_ns.get_or_insert_with(|| tenant_fs::own_pid_namespace().unwrap_or(0));
                let stale_pid = init_pid(word);
                let take = word == 0 || initialiser_is_stale(header, word, my_ns);
                if take {
                    let mine = init_word(PHASE_INITIALISING, pid, procfs::boottime_ms());
                    // Acquire on success: a takeover must see the dead initialiser's partial
                    // writes before overwriting them; pairs with nothing stronger than its
                    // Relaxed stores, which the CAS on the same word orders for us.
                    if header
                        .init_state
                        .compare_exchange(word, mine, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        // Relaxed: read by losers only as a hint for the liveness check.
                        header.init_owner_pid_ns.store(my_ns, Ordering::Relaxed);
                        write_header(map, config, pid, my_ns, word != 0);
                        // AcqRel/Release: publishes every header store above; pairs with the
                        // Acquire load at the top of this loop in every other process. Fails if
                        // we were taken over meanwhile: then we simply wait like a loser.
                        if header
                            .init_state
                            .compare_exchange(
                                mine,
                                init_word(PHASE_READY, pid, 0),
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            return Ok(if word == 0 {
                                InitOutcome::Created
                            } else {
                                InitOutcome::TookOver { stale_pid }
                            });
                        }
                    }
                    continue;
                }
                if started.elapsed() > INIT_WAIT_LIMIT {
                    return Err(RegionError::InitTimeout {
                        path: path.to_path_buf(),
                        waited_ms: started.elapsed().as_millis() as u64,
                        owner_pid: stale_pid,
                    });
                }
                wait_a_little(&mut spins);
            }
            // An unknown phase (garbage in a hostile or corrupted file): nobody will publish
            // READY, so treat it like a stale initialiser once the stall time has passed.
            _ => {
                if started.elapsed() > Duration::from_millis(INIT_STALL_MS) {
                    // Back to UNINIT by CAS from the exact word, so at most one process resets
                    // it; the next iteration races for the initialiser role as usual.
                    let _ = header.init_state.compare_exchange(
                        word,
                        PHASE_UNINIT,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
                wait_a_little(&mut spins);
            }
        }
    }
}

/// An initialiser is stale when its pid is gone (only judged when it runs in our pid namespace)
/// or when it has held the state for longer than [`INIT_STALL_MS`] (or the clock says it started
/// in the future: a file left over from a previous boot).
fn initialiser_is_stale(header: &RegionHeader, word: u64, my_ns: u64) -> bool {
    let now = procfs::boottime_ms() & INIT_MS_MASK;
    let since = init_ms(word);
    if now < since || now - since > INIT_STALL_MS {
        return true;
    }
    // Relaxed: a hint written right after the owner's CAS; 0 (not yet written) skips the check.
    let owner_ns = header.init_owner_pid_ns.load(Ordering::Relaxed);
    owner_ns != 0 && owner_ns == my_ns && procfs::liveness(init_pid(word), 0) == Liveness::Dead
}

fn wait_a_little(spins: &mut u32) {
    *spins += 1;
    match *spins {
        0..=64 => std::hint::spin_loop(),
        65..=256 => std::thread::yield_now(),
        n => std::thread::sleep(Duration::from_micros(u64::from((n - 256).min(20)) * 10)),
    }
}

/// Writes every header field (a takeover may find garbage anywhere) and resets slot states.
/// Relaxed stores: all are published by the Release CAS to READY.
fn write_header(map: &Mapping, config: &RegionConfig, pid: u32, pid_ns: u64, maybe_dirty: bool) {
    let header: &RegionHeader = map.get(0).expect("the mapping is at least one header long");
    let r = Ordering::Relaxed;
    header.magic.store(REGION_MAGIC, r);
    header
        .layout_version
        .store(u64::from(LAYOUT_MAJOR) << 32 | u64::from(LAYOUT_MINOR), r);
    header.total_size.store(region_size(config.slots), r);
    header.slot_count.store(config.slots, r);
    header.shards_per_slot.store(SHARDS_PER_SLOT as u32, r);
    header.api_slots.store(API_SLOTS as u32, r);
    header.hist_buckets.store(HIST_BUCKETS as u32, r);
    header.max_devices.store(MAX_DEVICES as u32, r);
    header.device_count.store(config.devices, r);
    header.slot_stride.store(SLOT_SIZE as u64, r);
    header.slots_offset.store(HEADER_SIZE as u64, r);
    header.shard_stride.store(SHARD_SIZE as u64, r);
    header.creator_pid.store(u64::from(pid), r);
    header.creator_pid_ns.store(pid_ns, r);
    header.created_at_unix_ns.store(procfs::unix_ns(), r);
    if maybe_dirty {
        header.init_takeovers.fetch_add(1, r);
    }
    header.last_sweep_ms.store(0, r);
    header.thaw_request.store(0, r);
    header.freeze_after_ms.store(0, r);
    header
        .spare
        .iter()
        .chain(header.sm_align.iter())
        .chain(header.tail.iter())
        .for_each(|w| w.store(0, r));
    header.sm.iter().for_each(|s| s.reset());
    for (i, dev) in header.devices.iter().enumerate() {
        let used = i < config.devices as usize;
        dev.memory_limit
            .store(if used { config.memory_limit[i] } else { 0 }, r);
        dev.sm_limit.store(
            if used {
                u64::from(config.sm_limit[i])
            } else {
                0
            },
            r,
        );
        for w in [
            &dev.reserved,
            &dev.peak_reserved,
            &dev.denied,
            &dev.reclaimed_bytes,
        ] {
            w.store(0, r);
        }
        dev.spare.iter().for_each(|w| w.store(0, r));
    }
    if maybe_dirty {
        // Nobody claims slots before READY, so resetting their states here races with no one.
        // A fresh (zero-filled) file skips this and touches no slot page.
        for i in 0..config.slots as usize {
            let Some(slot) = map.get::<SlotRecord>(HEADER_SIZE + i * SLOT_SIZE) else {
                break;
            };
            // The reservation words restart with the container words (tickets included: a
            // ticket left over could match a reset container word's tag).
            let h = &slot.header;
            for w in [&h.state, &h.intent, &h.intent_bytes]
                .into_iter()
                .chain(h.held.iter())
            {
                if w.load(r) != 0 {
                    w.store(0, r);
                }
            }
        }
    }
}

/// The configuration a `READY` header holds.
pub(crate) fn effective_config(header: &RegionHeader) -> RegionConfig {
    let r = Ordering::Relaxed;
    let mut config = RegionConfig::unlimited(header.device_count.load(r).min(MAX_DEVICES as u32));
    config.slots = header.slot_count.load(r);
    for (i, dev) in header
        .devices
        .iter()
        .enumerate()
        .take(config.devices as usize)
    {
        config.memory_limit[i] = dev.memory_limit.load(r);
        config.sm_limit[i] = dev.sm_limit.load(r).min(100) as u8;
    }
    config
}
