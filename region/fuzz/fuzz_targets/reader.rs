//! Fuzzes both region parsers: the input is written to a file and opened with `RegionReader` and,
//! padded to HAMi-core's size, with `HamiReader`. Any panic, crash or hang is a bug.
//! Run: `cargo +nightly-2026-08-01 fuzz run reader -- -max_total_time=60` in `region/fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use region::hami::{HAMI_V1_SIZE, HamiReader};
use region::reader::RegionReader;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("region");
    std::fs::write(&path, data).unwrap();
    if let Ok(reader) = RegionReader::open(&path) {
        let _ = reader.snapshot();
    }
    // The HAMi-core layout needs ~2 MB: place the input at its start and zero-pad the rest.
    let mut hami = data.to_vec();
    hami.resize(HAMI_V1_SIZE as usize, 0);
    std::fs::write(&path, &hami).unwrap();
    if let Ok(reader) = HamiReader::open(&path) {
        let _ = reader.snapshot();
    }
});
