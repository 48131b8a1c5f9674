//! Control block files: the agent's writer ([`ControlWriter`]), the limiter's read-only mapping
//! ([`ControlReader`]) and applying a new limit to a region ([`Region::set_memory_limit`],
//! [`Region::set_sm_limit`]). The protocol is described in `control`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use crate::control::{
    CONTROL_READ_RETRIES, CONTROL_SIZE, CONTROL_WORDS, ControlBlock, ControlError, ControlSettings,
    ControlSnapshot, W_SPARE, W_WRITER_PID, W_WRITTEN_AT, WRITER_STALL_MS, decode, encode,
    validate,
};
use crate::layout_types::RegionPod;
use crate::mapping::Mapping;
use crate::region::Region;

// SAFETY: `#[repr(C)]`, made only of `AtomicU64` fields and arrays of them: valid for every bit
// pattern and only ever accessed atomically.
unsafe impl RegionPod for ControlBlock {}

fn io(call: &'static str, path: &Path, e: std::io::Error) -> ControlError {
    ControlError::Io {
        call,
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn block(map: &Mapping) -> &ControlBlock {
    map.get(0)
        .expect("the mapping holds a whole block: checked at open")
}

/// Copies the block's words under the seqlock (bounded retries) and validates them.
fn read(block: &ControlBlock) -> Result<Option<ControlSnapshot>, ControlError> {
    let words = |b: &ControlBlock| {
        let mut w = [0u64; CONTROL_WORDS];
        let all = [
            &b.generation,
            &b.magic,
            &b.version,
            &b.size,
            &b.sm_set,
            &b.memory_set,
            &b.written_at_unix_ns,
            &b.writer_pid,
        ];
        let rest = b.sm_percent.iter().chain(&b.memory_limit).chain(&b.spare);
        for (dst, src) in w.iter_mut().zip(all.into_iter().chain(rest)) {
            // Relaxed: inside the seqlock read; validated by the generation reload below.
            *dst = src.load(Ordering::Relaxed);
        }
        w
    };
    let mut last = 0;
    for _ in 0..CONTROL_READ_RETRIES {
        // Acquire: pairs with the writer's Release store of the even generation.
        let g1 = block.generation.load(Ordering::Acquire);
        last = g1;
        if g1 & 1 == 1 {
            std::thread::yield_now();
            continue;
        }
        let mut w = words(block);
        // Acquire fence: pairs with the writer's Release fence after its odd store, so a copy
        // that saw any store of a later section sees the odd generation below.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence above.
        if block.generation.load(Ordering::Relaxed) == g1 {
            w[0] = g1;
            return decode(&w);
        }
    }
    Err(ControlError::Busy { generation: last })
}

/// Opens `path` for the given access, creating a zero-filled block if it does not exist, and
/// makes sure it is at least a block long.
fn open_sized(path: &Path, write: bool) -> Result<File, ControlError> {
    // Most openers find the block there already: open it without `O_CREAT` first, which would
    // take the directory's lock exclusively even for an existing file (a container's processes
    // starting together would queue on it).
    match OpenOptions::new().read(true).write(write).open(path) {
        Ok(f) => return sized(f, path, write),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("open", path, e)),
    }
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
    {
        Ok(f) => {
            f.set_len(CONTROL_SIZE as u64)
                .map_err(|e| io("ftruncate", path, e))?;
            // A reader maps it read-only whatever the descriptor allows.
            return Ok(f);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("open", path, e)),
    }
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| io("open", path, e))?;
    sized(f, path, write)
}

/// `f`, once it is at least [`CONTROL_SIZE`] long. A file just created by another process may
/// not have its size yet (creating and sizing are two calls): a writer sizes it, a reader waits
/// for the creator, yielding then sleeping 50 us at a time (a creator is microseconds away from
/// sizing it unless descheduled), at most 100 ms (mapping past the end would fault on access).
fn sized(f: File, path: &Path, write: bool) -> Result<File, ControlError> {
    let t0 = Instant::now();
    let mut round = 0u32;
    loop {
        let len = f.metadata().map_err(|e| io("fstat", path, e))?.len();
        if len >= CONTROL_SIZE as u64 {
            return Ok(f);
        }
        if write {
            f.set_len(CONTROL_SIZE as u64)
                .map_err(|e| io("ftruncate", path, e))?;
            return Ok(f);
        }
        if t0.elapsed() > Duration::from_millis(100) {
            return Err(ControlError::TooShort { len: len as usize });
        }
        if round < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        round += 1;
    }
}

/// The limiter's read-only view of a control block.
pub struct ControlReader {
    map: Mapping,
    path: PathBuf,
}

impl std::fmt::Debug for ControlReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlReader")
            .field("path", &self.path)
            .finish()
    }
}

impl ControlReader {
    /// Maps the block at `path` read-only, creating it zero-filled (no overrides) if absent, so
    /// that there is something to map and the agent finds the file beside the region.
    pub fn open_or_create(path: &Path) -> Result<ControlReader, ControlError> {
        let f = open_sized(path, false)?;
        let map = Mapping::new(&f, CONTROL_SIZE, false).map_err(|e| io("mmap", path, e))?;
        Ok(ControlReader {
            map,
            path: path.to_owned(),
        })
    }

    /// The generation word, for a cheap "has anything changed" check (a relaxed load).
    #[inline(always)]
    pub fn generation_word(&self) -> &AtomicU64 {
        &block(&self.map).generation
    }

    /// A validated copy: `Ok(None)` if never written.
    pub fn snapshot(&self) -> Result<Option<ControlSnapshot>, ControlError> {
        read(block(&self.map))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The agent's writer of a control block.
pub struct ControlWriter {
    map: Mapping,
    path: PathBuf,
}

impl ControlWriter {
    /// Opens (creating if needed) the block at `path` for writing.
    pub fn open(path: &Path) -> Result<ControlWriter, ControlError> {
        let f = open_sized(path, true)?;
        let map = Mapping::new(&f, CONTROL_SIZE, true).map_err(|e| io("mmap", path, e))?;
        Ok(ControlWriter {
            map,
            path: path.to_owned(),
        })
    }

    /// The current contents (no overrides if never written).
    pub fn snapshot(&self) -> Result<Option<ControlSnapshot>, ControlError> {
        read(block(&self.map))
    }

    /// Changes the settings with `update` and publishes them as a new generation, which it
    /// returns. The previous settings are kept where `update` leaves them. A block whose current
    /// contents do not validate is rewritten from `update` applied to no overrides.
    pub fn update(&self, update: impl FnOnce(&mut ControlSettings)) -> Result<u64, ControlError> {
        let b = block(&self.map);
        let odd = self.begin(b)?;
        // Read the fields as the last complete writer left them (we hold the write section).
        let mut settings = {
            let mut w = [0u64; CONTROL_WORDS];
            w[0] = odd + 1;
            for (i, dst) in w.iter_mut().enumerate().skip(1) {
                // Relaxed: we are the only writer now.
                *dst = word(b, i).load(Ordering::Relaxed);
            }
            match decode(&w) {
                Ok(Some(s)) => s.settings,
                _ => ControlSettings::default(),
            }
        };
        update(&mut settings);
        if let Err(e) = validate(&settings) {
            // Give the section back unchanged: the same contents, one generation later.
            b.generation.store(odd + 1, Ordering::Release);
            return Err(e);
        }
        let mut w = [0u64; CONTROL_WORDS];
        encode(&settings, &mut w);
        w[W_WRITTEN_AT] = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        w[W_WRITER_PID] = u64::from(std::process::id());
        // Every word but the generation and the spare words.
        for (i, v) in w.iter().enumerate().take(W_SPARE).skip(1) {
            // Relaxed: inside the write section; published by the Release store below.
            word(b, i).store(*v, Ordering::Relaxed);
        }
        let generation = odd + 1;
        // Release: publishes the fields; pairs with the readers' Acquire load.
        b.generation.store(generation, Ordering::Release);
        Ok(generation)
    }

    /// Takes the write section: generation even -> odd by CAS; a section left odd longer than
    /// [`WRITER_STALL_MS`] (a writer that died) is taken over.
    fn begin(&self, b: &ControlBlock) -> Result<u64, ControlError> {
        let t0 = Instant::now();
        loop {
            // Relaxed: the CAS below decides.
            let g = b.generation.load(Ordering::Relaxed);
            let stale = t0.elapsed() > Duration::from_millis(WRITER_STALL_MS);
            if g & 1 == 0 || stale {
                let odd = (g | 1).wrapping_add(if g & 1 == 1 { 2 } else { 0 });
                // Acquire: pairs with the previous writer's Release end store (its fields are
                // visible to our read of them).
                if b.generation
                    .compare_exchange(g, odd, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // Release fence: later field stores cannot move above the odd value (pairs
                    // with the readers' Acquire fence).
                    fence(Ordering::Release);
                    return Ok(odd);
                }
                continue;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The `i`-th word of a block (`i < CONTROL_WORDS`).
fn word(b: &ControlBlock, i: usize) -> &AtomicU64 {
    let fixed = [
        &b.generation,
        &b.magic,
        &b.version,
        &b.size,
        &b.sm_set,
        &b.memory_set,
        &b.written_at_unix_ns,
        &b.writer_pid,
    ];
    match i {
        0..8 => fixed[i],
        _ => b
            .sm_percent
            .iter()
            .chain(&b.memory_limit)
            .chain(&b.spare)
            .nth(i - 8)
            .unwrap_or(&b.spare[7]),
    }
}

impl Region {
    /// Sets the memory limit of `device` (0 = unlimited) at run time, from a control block.
    /// Reservations compare against the new limit from their next attempt: lowering it below
    /// what is reserved denies further allocations until enough is freed; nothing is revoked.
    pub fn set_memory_limit(&self, device: u32, bytes: u64) -> bool {
        match self.device(device) {
            // Relaxed: reservations load the limit Relaxed; the reserve CAS on `reserved` is what
            // keeps the total exact, and a limit is a momentary value either way.
            Some(d) => {
                d.memory_limit.store(bytes, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Sets the SM limit of `device` (percent, 0 or 100 = unlimited) shown to readers, at run time.
    pub fn set_sm_limit(&self, device: u32, percent: u8) -> bool {
        match self.device(device) {
            Some(d) => {
                // Relaxed: a display value for readers.
                d.sm_limit
                    .store(u64::from(percent.min(100)), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::control_path;

    #[test]
    fn reader_creates_a_zero_block_and_sees_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = control_path(&dir.path().join("r.region"));
        assert!(path.to_str().unwrap().ends_with("r.region.ctl"));
        let r = ControlReader::open_or_create(&path).unwrap();
        assert_eq!(r.snapshot(), Ok(None));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), CONTROL_SIZE as u64);
        let w = ControlWriter::open(&path).unwrap();
        let g = w.update(|s| s.sm_percent[0] = Some(40)).unwrap();
        assert_eq!(g, 2);
        assert_eq!(r.generation_word().load(Ordering::Relaxed), 2);
        let g = w.update(|s| s.memory_limit[3] = Some(1 << 30)).unwrap();
        assert_eq!(g, 4);
        let snap = r.snapshot().unwrap().unwrap();
        assert_eq!(snap.settings.sm_percent[0], Some(40));
        assert_eq!(snap.settings.memory_limit[3], Some(1 << 30));
        assert_eq!(snap.writer_pid, u64::from(std::process::id()));
        // An invalid request changes nothing but the generation.
        assert!(matches!(
            w.update(|s| s.sm_percent[1] = Some(101)),
            Err(ControlError::SmPercent { device: 1, .. })
        ));
        let again = r.snapshot().unwrap().unwrap();
        assert_eq!(again.settings, snap.settings);
    }

    #[test]
    fn a_dead_writer_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ctl");
        let w = ControlWriter::open(&path).unwrap();
        w.update(|s| s.sm_percent[0] = Some(10)).unwrap();
        // A writer that died inside its section.
        block(&w.map).generation.store(3, Ordering::Relaxed);
        let r = ControlReader::open_or_create(&path).unwrap();
        assert_eq!(r.snapshot(), Err(ControlError::Busy { generation: 3 }));
        let g = w.update(|s| s.sm_percent[0] = Some(20)).unwrap();
        assert_eq!(g, 6);
        assert_eq!(
            r.snapshot().unwrap().unwrap().settings.sm_percent[0],
            Some(20)
        );
    }

    /// A reader that opens a block another process has created but not sized yet waits for the
    /// size (briefly) instead of failing or mapping past the end.
    #[test]
    fn a_reader_waits_for_a_block_being_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.ctl");
        let f = std::fs::File::create(&path).unwrap();
        let sizer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            f.set_len(CONTROL_SIZE as u64).unwrap();
        });
        let r = ControlReader::open_or_create(&path).unwrap();
        sizer.join().unwrap();
        assert_eq!(r.snapshot().unwrap(), None, "zero-filled: never written");
    }

    #[test]
    fn short_files_are_not_mapped_by_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.ctl");
        std::fs::write(&path, [0u8; 10]).unwrap();
        assert!(matches!(
            ControlReader::open_or_create(&path),
            Err(ControlError::TooShort { len: 10 })
        ));
    }
}
