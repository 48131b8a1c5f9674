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
    ControlSnapshot, ENCODED_SPARE, W_SPARE, W_WRITER_PID, W_WRITTEN_AT, WRITER_STALL_MS, decode,
    encode, validate,
};
use crate::handle::Region;
use crate::layout_types::RegionPod;
use crate::mapping::Mapping;
use crate::sigbus;
use tenant_fs::TenantFile;

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

/// Opens the block at `path` read-only (the limiter's side), creating it zero-filled and sized if
/// it does not exist. An existing file is never resized: a reader waits for its creator to size it.
fn open_or_create_sized(path: &Path) -> Result<File, ControlError> {
    // Most openers find the block there already: open it without `O_CREAT` first, which would
    // take the directory's lock exclusively even for an existing file (a container's processes
    // starting together would queue on it).
    match OpenOptions::new().read(true).open(path) {
        Ok(f) => return sized(f, path),
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
            // Ours and empty: sizing it is the creation's second step.
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
        .open(path)
        .map_err(|e| io("open", path, e))?;
    sized(f, path)
}

/// `f`, once it is at least [`CONTROL_SIZE`] long. A file just created by another process may
/// not have its size yet (creating and sizing are two calls): wait for the creator, yielding then
/// sleeping 50 us at a time (a creator is microseconds away from sizing it unless descheduled), at
/// most 100 ms (mapping past the end would fault on access).
fn sized(f: File, path: &Path) -> Result<File, ControlError> {
    let t0 = Instant::now();
    let mut round = 0u32;
    loop {
        let len = f.metadata().map_err(|e| io("fstat", path, e))?.len();
        if len >= CONTROL_SIZE as u64 {
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

/// Checks that a tenant's file may be written as a control block: exactly [`CONTROL_SIZE`]
/// bytes (never resized) and one hard link (not another file under a second name).
fn writable_block(file: &TenantFile) -> Result<(), ControlError> {
    let len = file
        .current_len()
        .map_err(|e| io("fstat", file.path(), std::io::Error::other(e.to_string())))?;
    if len != CONTROL_SIZE as u64 || file.len() != CONTROL_SIZE as u64 {
        return Err(ControlError::WrongSize { len });
    }
    if file.nlink() != 1 {
        return Err(ControlError::HardLinked {
            links: file.nlink(),
        });
    }
    Ok(())
}

/// Reads a control block read-only with `pread` (never mapped, never written): `limit show`.
/// Copies under the seqlock protocol (the generation read before and after the fields); a copy
/// is only used if the generation stayed the same and even.
pub fn read_control(file: &TenantFile) -> Result<Option<ControlSnapshot>, ControlError> {
    let len = file
        .current_len()
        .map_err(|e| io("fstat", file.path(), std::io::Error::other(e.to_string())))?;
    if len < CONTROL_SIZE as u64 {
        return Err(ControlError::TooShort { len: len as usize });
    }
    let read_words = |w: &mut [u64]| -> Result<(), ControlError> {
        let mut bytes = [0u8; CONTROL_SIZE];
        let n = file
            .read_at(0, &mut bytes[..w.len() * 8])
            .map_err(|e| io("pread", file.path(), std::io::Error::other(e.to_string())))?;
        if n < w.len() * 8 {
            return Err(ControlError::TooShort { len: n });
        }
        for (dst, src) in w.iter_mut().zip(bytes.as_chunks::<8>().0) {
            *dst = u64::from_ne_bytes(*src);
        }
        Ok(())
    };
    let mut last = 0;
    for _ in 0..CONTROL_READ_RETRIES {
        let mut w = [0u64; CONTROL_WORDS];
        read_words(&mut w)?;
        let mut again = [0u64; 1];
        read_words(&mut again)?;
        last = w[0];
        if w[0] & 1 == 0 && again[0] == w[0] {
            return decode(&w);
        }
        std::thread::yield_now();
    }
    Err(ControlError::Busy { generation: last })
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
        let f = open_or_create_sized(path)?;
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

/// How long a writer tries to take the write section before giving up.
const WRITER_GIVE_UP_MS: u64 = 5 * WRITER_STALL_MS;

/// The agent's writer of a control block: only an existing regular file of exactly the block's
/// size, opened through [`tenant_fs`] (so never created, resized or reached through a
/// link), is written.
pub struct ControlWriter {
    map: Mapping,
    path: PathBuf,
}

impl ControlWriter {
    /// Maps `file` for writing, if it may be written as a control block (see
    /// [`ControlError::WrongSize`], [`ControlError::HardLinked`]).
    pub fn new(file: &TenantFile) -> Result<ControlWriter, ControlError> {
        writable_block(file)?;
        let path = file.path().to_owned();
        let map =
            Mapping::new(file.file(), CONTROL_SIZE, true).map_err(|e| io("mmap", &path, e))?;
        Ok(ControlWriter { map, path })
    }

    /// The current contents (no overrides if never written).
    pub fn snapshot(&self) -> Result<Option<ControlSnapshot>, ControlError> {
        let (read, changed) = sigbus::guarded(self.map.range(), || read(block(&self.map)));
        if changed {
            return Err(ControlError::ChangedWhileWriting);
        }
        read
    }

    /// Changes the settings with `update` and publishes them as a new generation, which it
    /// returns. The previous settings are kept where `update` leaves them. A block whose current
    /// contents do not validate is rewritten from `update` applied to no overrides.
    ///
    /// The owner of the file (a tenant) may truncate it while this runs, which would make the
    /// mapped stores fault: the write runs under [`sigbus::guarded`], which turns that into
    /// [`ControlError::ChangedWhileWriting`].
    pub fn update(&self, update: impl FnOnce(&mut ControlSettings)) -> Result<u64, ControlError> {
        let (result, changed) = sigbus::guarded(self.map.range(), || self.update_mapped(update));
        if changed {
            return Err(ControlError::ChangedWhileWriting);
        }
        result
    }

    fn update_mapped(
        &self,
        update: impl FnOnce(&mut ControlSettings),
    ) -> Result<u64, ControlError> {
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
        // Every word but the generation and the spare words this version gives no meaning.
        let written = (1..W_SPARE).chain(ENCODED_SPARE.iter().copied());
        for i in written {
            // Relaxed: inside the write section; published by the Release store below.
            word(b, i).store(w[i], Ordering::Relaxed);
        }
        let generation = odd + 1;
        // Release: publishes the fields; pairs with the readers' Acquire load.
        b.generation.store(generation, Ordering::Release);
        Ok(generation)
    }

    /// Takes the write section: generation even -> odd by CAS; a section left odd longer than
    /// [`WRITER_STALL_MS`] (a writer that died) is taken over. Gives up with
    /// [`ControlError::Busy`] after [`WRITER_GIVE_UP_MS`]: the file's owner can change the word
    /// under every CAS.
    fn begin(&self, b: &ControlBlock) -> Result<u64, ControlError> {
        let t0 = Instant::now();
        loop {
            if t0.elapsed() > Duration::from_millis(WRITER_GIVE_UP_MS) {
                return Err(ControlError::Busy {
                    // Relaxed: only reported.
                    generation: b.generation.load(Ordering::Relaxed),
                });
            }
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
                std::thread::yield_now();
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
    //! The control block's reader and the agent's writer, against real files.

    mod reader_and_writer {
        use super::super::*;
        use crate::control::control_path;
        use tenant_fs::{Access, open_no_links};

        /// The agent's writer of the block at `path`, which must exist.
        fn writer(path: &Path) -> Result<ControlWriter, ControlError> {
            let file = open_no_links(path, Access::ReadWrite).unwrap();
            ControlWriter::new(&file)
        }

        fn zero_block(path: &Path) {
            std::fs::write(path, [0u8; CONTROL_SIZE]).unwrap();
        }

        #[test]
        fn reader_creates_a_zero_block_and_sees_writes() {
            let dir = tempfile::tempdir().unwrap();
            let path = control_path(&dir.path().join("r.region"));
            assert!(path.to_str().unwrap().ends_with("r.region.ctl"));
            let r = ControlReader::open_or_create(&path).unwrap();
            assert_eq!(r.snapshot(), Ok(None));
            assert_eq!(std::fs::metadata(&path).unwrap().len(), CONTROL_SIZE as u64);
            let w = writer(&path).unwrap();
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
        fn the_freeze_mark_is_written_and_kept_by_other_changes() {
            use crate::control::FreezeMark;
            let dir = tempfile::tempdir().unwrap();
            let path = control_path(&dir.path().join("f.region"));
            let r = ControlReader::open_or_create(&path).unwrap();
            let w = writer(&path).unwrap();
            w.update(|s| s.freeze = FreezeMark::Frozen).unwrap();
            assert_eq!(
                r.snapshot().unwrap().unwrap().settings.freeze,
                FreezeMark::Frozen
            );
            w.update(|s| s.sm_percent[0] = Some(40)).unwrap();
            let snap = r.snapshot().unwrap().unwrap();
            assert_eq!(
                (snap.settings.freeze, snap.settings.sm_percent[0]),
                (FreezeMark::Frozen, Some(40))
            );
            w.update(|s| s.freeze = FreezeMark::Running).unwrap();
            let snap = r.snapshot().unwrap().unwrap();
            assert_eq!(
                (snap.settings.freeze, snap.settings.sm_percent[0]),
                (FreezeMark::Running, Some(40))
            );
        }

        #[test]
        fn a_dead_writer_is_taken_over() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.ctl");
            zero_block(&path);
            let w = writer(&path).unwrap();
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

    mod writer {
        use std::os::unix::fs::symlink;

        use super::super::*;
        use tenant_fs::{Access, TenantFsError, open_no_links};

        fn writer(path: &Path) -> Result<ControlWriter, ControlError> {
            ControlWriter::new(&open_no_links(path, Access::ReadWrite).unwrap())
        }

        #[test]
        fn only_a_block_of_exactly_the_size_is_written_and_never_resized() {
            let dir = tempfile::tempdir().unwrap();
            for len in [0usize, 10, CONTROL_SIZE - 8, CONTROL_SIZE + 1, 4096] {
                let path = dir.path().join(format!("b{len}.ctl"));
                std::fs::write(&path, vec![0xa5u8; len]).unwrap();
                assert_eq!(
                    writer(&path).err(),
                    Some(ControlError::WrongSize { len: len as u64 })
                );
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    vec![0xa5u8; len],
                    "untouched"
                );
            }
        }

        #[test]
        fn a_hard_linked_block_is_refused() {
            let dir = tempfile::tempdir().unwrap();
            let other = dir.path().join("other");
            std::fs::write(&other, [1u8; CONTROL_SIZE]).unwrap();
            let path = dir.path().join("r.ctl");
            std::fs::hard_link(&other, &path).unwrap();
            assert_eq!(
                writer(&path).err(),
                Some(ControlError::HardLinked { links: 2 })
            );
            assert_eq!(std::fs::read(&other).unwrap(), [1u8; CONTROL_SIZE]);
        }

        #[test]
        fn a_symlinked_block_is_not_opened() {
            let dir = tempfile::tempdir().unwrap();
            let host = dir.path().join("host-file");
            std::fs::write(&host, [2u8; CONTROL_SIZE]).unwrap();
            let path = dir.path().join("r.ctl");
            symlink(&host, &path).unwrap();
            let err = open_no_links(&path, Access::ReadWrite).unwrap_err();
            assert!(matches!(err, TenantFsError::Link { .. }), "{err}");
            assert_eq!(std::fs::read(&host).unwrap(), [2u8; CONTROL_SIZE]);
        }

        /// The file's owner truncates it between the checks and the write: the write faults, lands
        /// nowhere, and is reported; the process lives on and the next write works.
        #[test]
        fn a_block_truncated_under_the_writer_is_an_error_not_a_crash() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.ctl");
            std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
            let w = writer(&path).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            assert_eq!(
                w.update(|s| s.sm_percent[0] = Some(30)),
                Err(ControlError::ChangedWhileWriting)
            );
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "not extended");
            let again = dir.path().join("u.ctl");
            std::fs::write(&again, [0u8; CONTROL_SIZE]).unwrap();
            assert_eq!(
                writer(&again)
                    .unwrap()
                    .update(|s| s.sm_percent[0] = Some(30)),
                Ok(2)
            );
        }

        #[test]
        fn show_reads_without_writing() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.ctl");
            std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
            let ro = open_no_links(&path, Access::Read).unwrap();
            assert_eq!(read_control(&ro), Ok(None));
            writer(&path)
                .unwrap()
                .update(|s| s.memory_limit[2] = Some(1 << 30))
                .unwrap();
            let before = std::fs::read(&path).unwrap();
            let snap = read_control(&ro).unwrap().unwrap();
            assert_eq!(snap.settings.memory_limit[2], Some(1 << 30));
            assert_eq!(std::fs::read(&path).unwrap(), before);
            let short = dir.path().join("short.ctl");
            std::fs::write(&short, [0u8; 8]).unwrap();
            let ro = open_no_links(&short, Access::Read).unwrap();
            assert_eq!(read_control(&ro), Err(ControlError::TooShort { len: 8 }));
        }

        /// A tenant that keeps changing the generation word cannot keep the writer spinning.
        #[test]
        fn a_writer_gives_up_on_a_block_whose_generation_never_settles() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("spin.ctl");
            std::fs::write(&path, [0u8; CONTROL_SIZE]).unwrap();
            let w = writer(&path).unwrap();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flipper = {
                let stop = stop.clone();
                let path = path.clone();
                std::thread::spawn(move || {
                    let f = std::fs::File::options()
                        .read(true)
                        .write(true)
                        .open(&path)
                        .unwrap();
                    let map = Mapping::new(&f, CONTROL_SIZE, true).unwrap();
                    let b: &ControlBlock = map.get(0).unwrap();
                    // Odd values only, a new one every store: a write "in progress" that never ends
                    // and never looks stale for long.
                    let mut g = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        b.generation.store(g, Ordering::Relaxed);
                        g = g.wrapping_add(2);
                    }
                })
            };
            // Wait until the tenant's stores have begun.
            while !matches!(w.snapshot(), Err(ControlError::Busy { .. })) {
                std::thread::yield_now();
            }
            let t0 = Instant::now();
            let r = w.update(|s| s.sm_percent[0] = Some(10));
            stop.store(true, Ordering::Relaxed);
            flipper.join().unwrap();
            // Winning a CAS between two of the tenant's stores is possible; waiting without end is not.
            assert!(matches!(r, Err(ControlError::Busy { .. }) | Ok(_)), "{r:?}");
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        }
    }
}
