//! Fuzzes both region parsers. The input is written to a file and opened with `RegionReader`
//! (an input of at least one header page is extended with zeroes to the size its header claims,
//! capped at 4 slots, so slot and shard parsing is reached) and, padded to HAMi-core's size, with
//! `HamiReader`. After each snapshot the file is truncated to a length taken from the input and
//! read again through the open reader (a container truncating its region under the agent). Any
//! panic, crash or hang is a bug; every outcome must be `Ok` or a typed error.
//! Run: `cargo +nightly-2026-08-01 fuzz run reader corpus/reader seeds -- -max_total_time=300`
//! in `region/fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use region::hami::{HAMI_V1_SIZE, HamiReader};
use region::layout::{HEADER_SIZE, region_size};
use region::reader::RegionReader;

/// A length to truncate to, derived from the input (0..=`full`).
fn cut(data: &[u8], full: u64) -> u64 {
    let h = data
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    h % (full + 1)
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    std::fs::write(&path, data).unwrap();
    if data.len() >= HEADER_SIZE {
        let claimed = u64::from_le_bytes(data[24..32].try_into().unwrap());
        let len = claimed.min(region_size(4)).max(data.len() as u64);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
    if let Ok(reader) = RegionReader::open(&path) {
        let full = reader.geometry().total_size;
        let _ = reader.snapshot();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut(data, full))
            .unwrap();
        let _ = reader.snapshot();
    }
    // The HAMi-core layout needs ~2 MB: place the input at its start and zero-pad the rest.
    let mut hami = data.to_vec();
    hami.resize(HAMI_V1_SIZE as usize, 0);
    std::fs::write(&path, &hami).unwrap();
    if let Ok(reader) = HamiReader::open(&path) {
        let _ = reader.snapshot();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut(data, HAMI_V1_SIZE))
            .unwrap();
        let _ = reader.snapshot();
    }
});
