//! The node's QoS board (`VGPU_QOS_BOARD`): one small file that every container on the node
//! opens, where each container publishes, per GPU, its QoS tier, what it used and was allocated,
//! and until when its latency-tier work is in flight; each reads the others' to compute its own
//! allocation (`limiter_core::qos`).
//!
//! Every tenant can write the file, so every tenant must survive what the others write into it:
//! - It is read and written with `pread`/`pwrite`, never mapped: a tenant that truncates it makes
//!   the others' reads short (an error, the tick is skipped), not a `SIGBUS`.
//! - It is opened with `O_NOFOLLOW` and used only if it is a regular file of exactly
//!   [`BOARD_SIZE`] bytes with the board's magic (a new, empty file is initialised): a symbolic
//!   link planted in the shared directory cannot turn a write into one to another file.
//! - Each entry carries a check word over its other words; an entry that does not check (torn by
//!   a concurrent write, or forged carelessly) is skipped. Decoded values are bounded by the
//!   reader (`limiter_core::qos::Tier::decode`, shares clamped to the device).
//! - An entry whose heartbeat is older than [`STALE_MS`] (its container exited or was killed) or
//!   lies in the future is ignored, and may be taken by a new container.
//!
//! What a forged entry can still do is documented in docs/qos.md: it can claim a tier and a
//! demand it does not have, which shrinks best-effort tenants' allocations; it cannot take a
//! guaranteed tenant below its guarantee (the allocation never goes there).
//!
//! Entries are claimed without a lock: a container writes its entry into a free or stale slot
//! and checks at its next read that the slot is still its own (two containers that picked the
//! same slot at once: the one that finds another owner there picks again).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `b"VGPUQOS1"` read as a little-endian `u64`.
pub const BOARD_MAGIC: u64 = u64::from_le_bytes(*b"VGPUQOS1");
/// Entries on a board: containers times the GPUs each publishes for.
pub const BOARD_ENTRIES: usize = 256;
/// Words of an entry.
const ENTRY_WORDS: usize = 8;
/// Bytes of an entry.
const ENTRY_BYTES: usize = ENTRY_WORDS * 8;
/// Bytes of the header (magic, version, entries, spare).
const HEADER_BYTES: usize = 64;
/// Bytes of a board file.
pub const BOARD_SIZE: usize = HEADER_BYTES + BOARD_ENTRIES * ENTRY_BYTES;
/// An entry not refreshed for this long is ignored and may be taken.
pub const STALE_MS: u64 = 1_000;

const _: () = assert!(BOARD_SIZE == 16_448);
const _: () = assert!(HEADER_BYTES.is_multiple_of(ENTRY_BYTES));

/// What opening or reading a board can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("QoS board {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "QoS board {path} is not a regular file of {BOARD_SIZE} bytes (a link, or {len} bytes)"
    )]
    NotABoard { path: PathBuf, len: u64 },
    #[error("QoS board {path} does not start with the board's magic")]
    BadMagic { path: PathBuf },
}

/// One container's publication for one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoardEntry {
    /// The container (a key of its region file; 0: a free entry).
    pub owner: u64,
    /// The GPU (a hash of its UUID).
    pub device: u64,
    /// `CLOCK_MONOTONIC` ms of the publication.
    pub heartbeat_ms: u64,
    /// `limiter_core::qos::Tier::encode`'s byte.
    pub tier: u8,
    /// Per mille.
    pub guarantee_pm: u16,
    /// Its ceiling, per mille.
    pub cap_pm: u16,
    /// It launched within the last active span.
    pub active: bool,
    /// Its allocation held it back since its previous publication.
    pub held: bool,
    /// What it used over the last span, per mille.
    pub used_pm: u16,
    /// What it was allocated, per mille.
    pub allocated_pm: u16,
    /// Until when its latency-tier work is in flight (`CLOCK_MONOTONIC` ns; 0: none).
    pub latency_until_ns: u64,
    /// The publisher's pid (in its own namespace; for logs).
    pub pid: u32,
}

fn check(words: &[u64; ENTRY_WORDS]) -> u64 {
    // Any word changed changes the check (a multiply-xor chain; not a defence against a forger,
    // who can compute it too, but against torn and careless writes).
    words[..ENTRY_WORDS - 1]
        .iter()
        .fold(0x9E37_79B9_7F4A_7C15u64, |h, &w| {
            (h ^ w).wrapping_mul(0x0100_0000_01B3).rotate_left(29)
        })
        | 1
}

impl BoardEntry {
    fn encode(&self) -> [u64; ENTRY_WORDS] {
        let claim = u64::from(self.tier)
            | u64::from(self.guarantee_pm) << 8
            | u64::from(self.cap_pm) << 24
            | u64::from(self.active) << 40
            | u64::from(self.held) << 41;
        let mut w = [
            self.owner,
            self.device,
            self.heartbeat_ms,
            claim,
            u64::from(self.used_pm) | u64::from(self.allocated_pm) << 16,
            self.latency_until_ns,
            u64::from(self.pid),
            0,
        ];
        w[ENTRY_WORDS - 1] = check(&w);
        w
    }

    fn decode(w: &[u64; ENTRY_WORDS]) -> Option<BoardEntry> {
        if w[0] == 0 || w[ENTRY_WORDS - 1] != check(w) {
            return None;
        }
        let claim = w[3];
        Some(BoardEntry {
            owner: w[0],
            device: w[1],
            heartbeat_ms: w[2],
            tier: claim as u8,
            guarantee_pm: (claim >> 8) as u16,
            cap_pm: (claim >> 24) as u16,
            active: claim >> 40 & 1 == 1,
            held: claim >> 41 & 1 == 1,
            used_pm: w[4] as u16,
            allocated_pm: (w[4] >> 16) as u16,
            latency_until_ns: w[5],
            pid: w[6] as u32,
        })
    }

    /// Whether the entry was refreshed within [`STALE_MS`] of `now_ms` (and not after it).
    pub fn fresh(&self, now_ms: u64) -> bool {
        self.heartbeat_ms <= now_ms + STALE_MS
            && now_ms.saturating_sub(self.heartbeat_ms) < STALE_MS
    }
}

/// An open board.
#[derive(Debug)]
pub struct Board {
    file: File,
    path: PathBuf,
}

impl Board {
    /// Opens the board at `path`, creating and initialising it if it does not exist (readable
    /// and writable by everyone: the containers of a node run as different users).
    pub fn open(path: &Path) -> Result<Board, BoardError> {
        let io = |source| BoardError::Io {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(BoardError::NotABoard {
                path: path.to_owned(),
                len: meta.len(),
            });
        }
        if meta.len() == 0 {
            // New (or a creator that has not sized it yet): size and initialise it. Two
            // containers doing this at once write the same bytes.
            file.set_len(BOARD_SIZE as u64).map_err(io)?;
            let mut header = [0u8; 24];
            header[..8].copy_from_slice(&BOARD_MAGIC.to_le_bytes());
            header[8..16].copy_from_slice(&1u64.to_le_bytes());
            header[16..].copy_from_slice(&(BOARD_ENTRIES as u64).to_le_bytes());
            file.write_all_at(&header, 0).map_err(io)?;
            if meta.uid() == own_uid() {
                // The umask may have narrowed the mode: the other containers must write too.
                let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
            }
        } else if meta.len() != BOARD_SIZE as u64 {
            return Err(BoardError::NotABoard {
                path: path.to_owned(),
                len: meta.len(),
            });
        }
        let mut magic = [0u8; 8];
        file.read_exact_at(&mut magic, 0).map_err(io)?;
        if u64::from_le_bytes(magic) != BOARD_MAGIC {
            return Err(BoardError::BadMagic {
                path: path.to_owned(),
            });
        }
        Ok(Board {
            file,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every entry that checks, with its index.
    pub fn entries(&self) -> Result<Vec<(usize, BoardEntry)>, BoardError> {
        let mut bytes = vec![0u8; BOARD_ENTRIES * ENTRY_BYTES];
        self.file
            .read_exact_at(&mut bytes, HEADER_BYTES as u64)
            .map_err(|source| BoardError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(bytes
            .as_chunks::<ENTRY_BYTES>()
            .0
            .iter()
            .enumerate()
            .filter_map(|(i, chunk)| Some((i, BoardEntry::decode(&words_of(chunk))?)))
            .collect())
    }

    /// One entry, if it checks (`None` also for an index past the board).
    pub fn entry(&self, index: usize) -> Result<Option<BoardEntry>, BoardError> {
        if index >= BOARD_ENTRIES {
            return Ok(None);
        }
        let mut bytes = [0u8; ENTRY_BYTES];
        self.file
            .read_exact_at(&mut bytes, (HEADER_BYTES + index * ENTRY_BYTES) as u64)
            .map_err(|source| BoardError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(BoardEntry::decode(&words_of(&bytes)))
    }

    /// Writes `entry` at `index` (one `pwrite` of its 64 bytes).
    pub fn write(&self, index: usize, entry: &BoardEntry) -> Result<(), BoardError> {
        if index >= BOARD_ENTRIES {
            return Ok(());
        }
        let mut bytes = [0u8; ENTRY_BYTES];
        for (b, w) in bytes.as_chunks_mut::<8>().0.iter_mut().zip(entry.encode()) {
            *b = w.to_le_bytes();
        }
        self.file
            .write_all_at(&bytes, (HEADER_BYTES + index * ENTRY_BYTES) as u64)
            .map_err(|source| BoardError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

/// The entry to publish `(owner, device)` in, given the board's `entries`: its own, else the
/// first free or stale one. `None`: the board is full of fresh entries.
pub fn slot_for(
    entries: &[(usize, BoardEntry)],
    owner: u64,
    device: u64,
    now_ms: u64,
) -> Option<usize> {
    if let Some((i, _)) = entries
        .iter()
        .find(|(_, e)| e.owner == owner && e.device == device)
    {
        return Some(*i);
    }
    let taken: Vec<usize> = entries
        .iter()
        .filter(|(_, e)| e.fresh(now_ms))
        .map(|(i, _)| *i)
        .collect();
    (0..BOARD_ENTRIES).find(|i| !taken.contains(i))
}

/// An entry's words from its bytes (little-endian).
fn words_of(bytes: &[u8; ENTRY_BYTES]) -> [u64; ENTRY_WORDS] {
    let mut w = [0u64; ENTRY_WORDS];
    for (word, b) in w.iter_mut().zip(bytes.as_chunks::<8>().0) {
        *word = u64::from_le_bytes(*b);
    }
    w
}

fn own_uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: u64, heartbeat_ms: u64) -> BoardEntry {
        BoardEntry {
            owner,
            device: 77,
            heartbeat_ms,
            tier: 2,
            guarantee_pm: 300,
            cap_pm: 1000,
            active: true,
            held: true,
            used_pm: 290,
            allocated_pm: 300,
            latency_until_ns: 5,
            pid: 42,
        }
    }

    #[test]
    fn entries_round_trip_and_a_torn_or_forged_one_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qos.board");
        let board = Board::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), BOARD_SIZE as u64);
        assert!(board.entries().unwrap().is_empty());
        let e = entry(9, 1_000);
        board.write(3, &e).unwrap();
        // A second opener sees the same board.
        let again = Board::open(&path).unwrap();
        assert_eq!(again.entries().unwrap(), [(3, e)]);
        assert_eq!(again.entry(3).unwrap(), Some(e));
        assert_eq!(again.entry(BOARD_ENTRIES).unwrap(), None);
        // One word changed without its check: skipped.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(
            &500u64.to_le_bytes(),
            (HEADER_BYTES + 3 * ENTRY_BYTES + 32) as u64,
        )
        .unwrap();
        assert!(board.entries().unwrap().is_empty());
    }

    #[test]
    fn a_link_a_wrong_size_or_a_wrong_magic_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, vec![1u8; BOARD_SIZE]).unwrap();
        let link = dir.path().join("qos.board");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(Board::open(&link), Err(BoardError::Io { .. })));
        assert_eq!(
            std::fs::read(&target).unwrap(),
            vec![1u8; BOARD_SIZE],
            "untouched"
        );
        assert!(matches!(
            Board::open(&target),
            Err(BoardError::BadMagic { .. })
        ));
        let short = dir.path().join("short");
        std::fs::write(&short, b"x").unwrap();
        assert!(matches!(
            Board::open(&short),
            Err(BoardError::NotABoard { len: 1, .. })
        ));
        assert!(matches!(
            Board::open(dir.path()),
            Err(BoardError::Io { .. }) | Err(BoardError::NotABoard { .. })
        ));
        // A board truncated under its readers: reads fail, nothing faults.
        let path = dir.path().join("truncated");
        let board = Board::open(&path).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(10)
            .unwrap();
        assert!(board.entries().is_err());
        assert!(board.entry(0).is_err());
    }

    #[test]
    fn a_container_keeps_its_slot_and_takes_a_stale_one() {
        let now = 10_000;
        let entries = vec![
            (0, entry(1, now)),
            (1, entry(2, now - 5_000)),
            (2, entry(3, now)),
        ];
        assert_eq!(slot_for(&entries, 3, 77, now), Some(2), "its own");
        assert_eq!(slot_for(&entries, 4, 77, now), Some(1), "the stale one");
        let future = vec![(0, entry(1, now + 60_000))];
        assert_eq!(
            slot_for(&future, 4, 77, now),
            Some(0),
            "a heartbeat in the future is stale"
        );
        let full: Vec<_> = (0..BOARD_ENTRIES)
            .map(|i| (i, entry(100 + i as u64, now)))
            .collect();
        assert_eq!(slot_for(&full, 4, 77, now), None);
        assert!(entry(1, now).fresh(now + STALE_MS - 1));
        assert!(!entry(1, now).fresh(now + STALE_MS));
    }
}
