//! A container may truncate, re-extend and rewrite its own region file while the agent reads it.
//! The readers copy the file with `pread` and never map it, so every snapshot is `Ok` or a typed
//! error and the reading process never takes `SIGBUS`. One thread keeps truncating, re-extending
//! and scribbling garbage over the header while this thread takes thousands of snapshots through
//! readers opened on the valid file (`RegionReader` and `HamiReader`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_common::api::ApiId;
use region::hami::{HAMI_MAGIC, HAMI_V1_SIZE, HamiError, HamiReader};
use region::reader::{ReadError, RegionReader};
use region::{Region, RegionConfig};

/// Snapshots each test takes at least (more if the race has not produced both outcomes yet).
const SNAPSHOTS: usize = 3000;
/// Truncate/restore cycles each test runs at least.
const CYCLES: u64 = 200;
/// Upper bound on a test's run time.
const LIMIT: Duration = Duration::from_secs(30);

/// xorshift64: a cheap, seeded source of offsets and lengths.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Until `stop`: truncate to a random length (sometimes 0), scribble over the header, and
/// restore the valid image; yields between steps so the reader runs in every state.
fn mutate(path: &Path, image: &[u8], header_len: usize, stop: &AtomicBool, cycles: &AtomicU64) {
    let file: File = OpenOptions::new().write(true).open(path).unwrap();
    let full = image.len() as u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    // Relaxed: a stop flag and a counter; nothing else is published through them.
    while !stop.load(Ordering::Relaxed) {
        let cut = match next(&mut rng) % 4 {
            0 => 0,
            _ => next(&mut rng) % full,
        };
        file.set_len(cut).unwrap();
        std::thread::yield_now();
        // Re-extend (zeroes past the cut) and restore what the cut removed.
        file.set_len(full).unwrap();
        file.write_at(&image[cut as usize..], cut).unwrap();
        if next(&mut rng).is_multiple_of(2) {
            let at = ((next(&mut rng) % header_len as u64) & !7) as usize;
            file.write_at(&next(&mut rng).to_le_bytes(), at as u64)
                .unwrap();
            std::thread::yield_now();
            file.write_at(&image[at..at + 8], at as u64).unwrap();
        }
        std::thread::yield_now();
        cycles.fetch_add(1, Ordering::Relaxed);
    }
}

/// Outcomes seen by the reading thread.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    truncated: usize,
    other_errors: usize,
}

impl Tally {
    fn total(&self) -> usize {
        self.ok + self.truncated + self.other_errors
    }
    fn done(&self, cycles: u64) -> bool {
        self.total() >= SNAPSHOTS && cycles >= CYCLES && self.ok > 0 && self.truncated > 0
    }
}

fn run(path: &Path, image: Vec<u8>, header_len: usize, mut snapshot: impl FnMut(&mut Tally)) {
    std::fs::write(path, &image).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let mutator = {
        let (path, stop, cycles) = (path.to_path_buf(), Arc::clone(&stop), Arc::clone(&cycles));
        std::thread::spawn(move || mutate(&path, &image, header_len, &stop, &cycles))
    };
    let started = Instant::now();
    let mut tally = Tally::default();
    while !tally.done(cycles.load(Ordering::Relaxed)) && started.elapsed() < LIMIT {
        snapshot(&mut tally);
    }
    stop.store(true, Ordering::Relaxed);
    mutator.join().unwrap();
    let cycles = cycles.load(Ordering::Relaxed);
    eprintln!("{tally:?} over {cycles} truncate/restore cycles");
    assert!(
        tally.total() >= SNAPSHOTS,
        "only {} snapshots in {LIMIT:?}",
        tally.total()
    );
    assert!(tally.ok > 0, "no snapshot of the restored file succeeded");
    assert!(tally.truncated > 0, "no snapshot met a truncated file");
    assert!(cycles >= CYCLES, "only {cycles} truncate/restore cycles");
}

#[test]
fn region_reader_survives_a_file_truncated_and_rewritten_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    let mut config = RegionConfig::unlimited(2);
    config.slots = 2;
    config.memory_limit[0] = 1 << 30;
    let image = {
        let (region, _) = Region::open_or_create(&path, &config).unwrap();
        let slot = region.claim_slot().unwrap();
        region.try_reserve(&slot, 0, 4096).unwrap();
        let launch = ApiId::from_name("cuLaunchKernel").unwrap();
        let w = region.shard_writer(&slot);
        w.record_call(launch, 1_000, true);
        drop(w);
        std::fs::read(&path).unwrap()
    };
    let reader = RegionReader::open(&path).unwrap();
    run(&path, image, 4096, |tally| match reader.snapshot() {
        Ok(snap) => {
            assert!(snap.slots.len() <= 2);
            tally.ok += 1;
        }
        Err(ReadError::Truncated { len, needed }) => {
            assert!(len < needed);
            tally.truncated += 1;
        }
        Err(_) => tally.other_errors += 1,
    });
    // A reader opened now (on a valid file) still works: nothing was left half-done.
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.devices[0].reserved, 4096);
}

#[test]
fn hami_reader_survives_a_file_truncated_and_rewritten_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cudevshr.cache");
    let mut image = vec![0u8; HAMI_V1_SIZE as usize];
    image[0..4].copy_from_slice(&HAMI_MAGIC.to_le_bytes());
    image[4..8].copy_from_slice(&1i32.to_le_bytes());
    image[56..64].copy_from_slice(&1u64.to_le_bytes());
    for p in [0usize, 500, 1023] {
        let slot = 1856 + p * 1960;
        image[slot..slot + 4].copy_from_slice(&(p as i32 + 1).to_le_bytes());
        image[slot + 1928..slot + 1932].copy_from_slice(&1i32.to_le_bytes());
    }
    std::fs::write(&path, &image).unwrap();
    let reader = HamiReader::open(&path).unwrap();
    run(&path, image, 1856, |tally| match reader.snapshot() {
        Ok(snap) => {
            assert!(snap.processes.len() <= 3);
            tally.ok += 1;
        }
        Err(HamiError::Truncated { len, needed }) => {
            assert!(len < needed);
            tally.truncated += 1;
        }
        Err(_) => tally.other_errors += 1,
    });
    let snap = HamiReader::open(&path).unwrap().snapshot().unwrap();
    assert_eq!(snap.processes.len(), 3);
}
