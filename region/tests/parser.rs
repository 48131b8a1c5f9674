//! Property tests of the readers on arbitrary and mutated files: every input gives `Ok` or a typed
//! error, never a panic or a hang.

use std::path::Path;
use std::sync::OnceLock;

use agent_common::api::ApiId;
use proptest::prelude::*;
use region::hami::{HAMI_MAGIC, HAMI_V1_SIZE, HamiReader};
use region::reader::RegionReader;
use region::{Region, RegionConfig};

/// A valid, populated region image (2 slots) to mutate.
fn valid_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let mut config = RegionConfig::unlimited(2);
        config.slots = 2;
        config.memory_limit[0] = 1 << 30;
        let (region, _) = Region::open_or_create(&path, &config).unwrap();
        let slot = region.claim_slot().unwrap();
        region.try_reserve(&slot, 0, 4096).unwrap();
        let w = region.shard_writer(&slot);
        w.record_call(agent_common::api::ApiId(40), 1234, true);
        std::mem::forget(w);
        std::fs::read(&path).unwrap()
    })
}

fn read_region(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    std::fs::write(&path, bytes).unwrap();
    if let Ok(reader) = RegionReader::open(&path) {
        let snap = reader.snapshot().expect("a file that opened reads");
        assert!(snap.slots.len() <= snap.geometry.slot_count as usize);
        for slot in &snap.slots {
            assert_eq!(slot.held.len(), snap.geometry.device_count as usize);
        }
        if snap.geometry.major >= 2 {
            // Whatever the tags hold, a tagged word decodes to at most 2^48 - 1 bytes.
            let held = snap.slots.iter().flat_map(|s| s.held.iter());
            let reserved = snap.devices.iter().map(|d| &d.reserved);
            assert!(held.chain(reserved).all(|&b| b <= region::MAX_RESERVABLE));
        }
    }
}

fn read_hami(path: &Path) {
    if let Ok(reader) = HamiReader::open(path) {
        let snap = reader.snapshot().expect("a file that opened reads");
        assert!(snap.device_count <= 16);
        assert!(snap.processes.len() <= 1024);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_crash_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..8192)) {
        read_region(&bytes);
    }

    #[test]
    fn mutated_regions_never_crash_the_reader(
        edits in proptest::collection::vec((0usize..1 << 20, any::<u64>()), 1..32),
        truncate_to in proptest::option::of(0usize..1 << 20),
    ) {
        let mut bytes = valid_image().to_vec();
        for (offset, value) in edits {
            // Bias edits to the header and the first slot's header, where the parser looks.
            let offset = if offset % 2 == 0 { offset % 4096 } else { 4096 + offset % 4096 } & !7;
            bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        }
        if let Some(len) = truncate_to {
            bytes.truncate(len.min(bytes.len()));
        }
        read_region(&bytes);
    }

    #[test]
    fn mutated_hami_files_never_crash_the_reader(
        edits in proptest::collection::vec((0usize..HAMI_V1_SIZE as usize, any::<u64>()), 0..32),
    ) {
        let mut bytes = vec![0u8; HAMI_V1_SIZE as usize];
        bytes[0..4].copy_from_slice(&HAMI_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        for (offset, value) in edits {
            let offset = offset.min(HAMI_V1_SIZE as usize - 8) & !7;
            bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        std::fs::write(&path, &bytes).unwrap();
        read_hami(&path);
    }
}

/// A HAMi-core v1 file built field by field at the documented offsets reads back.
#[test]
fn hami_v1_fields_are_read_at_their_offsets() {
    let mut b = vec![0u8; HAMI_V1_SIZE as usize];
    let put32 =
        |b: &mut Vec<u8>, off: usize, v: i32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |b: &mut Vec<u8>, off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put32(&mut b, 0, HAMI_MAGIC);
    put32(&mut b, 4, 1);
    put32(&mut b, 8, 2);
    put64(&mut b, 56, 2);
    b[64..64 + 8].copy_from_slice(b"GPU-abcd");
    put64(&mut b, 1600 + 8, 8 << 30);
    put64(&mut b, 1728, 50);
    // Slot 3 (not below proc_num: HAMi-core's compaction can leave live slots there).
    let slot = 1856 + 3 * 1960;
    put32(&mut b, slot, 42);
    put32(&mut b, slot + 4, 4242);
    put64(&mut b, slot + 8 + 64, 512 << 20); // used[1].context_size
    put64(&mut b, slot + 8 + 64 + 32, 3 << 30); // used[1].total
    put64(&mut b, slot + 1032 + 8, 1 << 30); // monitorused[1]
    put64(&mut b, slot + 1160 + 48 + 16, 77); // device_util[1].sm_util
    put32(&mut b, slot + 1928, 1);
    put64(&mut b, slot + 1936, 6); // seqlock, even
    put32(&mut b, 2_008_896, 1); // proc_num
    put32(&mut b, 2_008_904, 2); // recent_kernel
    put64(&mut b, 2_008_912, 1_700_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cudevshr.cache");
    std::fs::write(&path, &b).unwrap();
    let snap = HamiReader::open(&path).unwrap().snapshot().unwrap();
    assert_eq!((snap.major, snap.minor, snap.device_count), (1, 2, 2));
    assert_eq!(snap.uuids[0], "GPU-abcd");
    assert_eq!(snap.limit, vec![0, 8 << 30]);
    assert_eq!(snap.sm_limit, vec![50, 0]);
    assert_eq!(
        (snap.recent_kernel, snap.last_kernel_time),
        (2, 1_700_000_000)
    );
    assert_eq!(snap.processes.len(), 1);
    let p = &snap.processes[0];
    assert_eq!((p.slot, p.pid, p.hostpid, p.status), (3, 42, 4242, 1));
    assert_eq!(p.used_total, vec![0, 3 << 30]);
    assert_eq!(p.context_size, vec![0, 512 << 20]);
    assert_eq!(p.monitor_used, vec![0, 1 << 30]);
    assert_eq!(p.sm_util, vec![0, 77]);
    assert!(p.consistent);
    // A writer killed mid-update leaves the seqlock odd: flagged, not waited on.
    put64(&mut b, slot + 1936, 7);
    std::fs::write(&path, &b).unwrap();
    let snap = HamiReader::open(&path).unwrap().snapshot().unwrap();
    assert!(!snap.processes[0].consistent);
    // Wrong magic, wrong major, short file: typed errors.
    for (off, v) in [(0usize, 1i32), (4, 2)] {
        let mut bad = b.clone();
        put32(&mut bad, off, v);
        std::fs::write(&path, &bad).unwrap();
        assert!(HamiReader::open(&path).is_err());
    }
    std::fs::write(&path, &b[..1000]).unwrap();
    assert!(matches!(
        HamiReader::open(&path),
        Err(region::hami::HamiError::Truncated { .. })
    ));
}

/// The fuzz target's seeds (`fuzz/seeds`) are valid files, so fuzzing starts from inputs that
/// reach slot, shard and process parsing rather than only the header checks.
#[test]
fn fuzz_seeds_parse() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut bytes = std::fs::read(seeds.join("vgpu-1-slot")).unwrap();
    bytes.resize(region::layout::region_size_for(1, 1) as usize, 0);
    std::fs::write(&path, &bytes).unwrap();
    let snap = RegionReader::open(&path).unwrap().snapshot().unwrap();
    assert_eq!(snap.geometry.major, 1, "the seed is a version 1.0 region");
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].name, "seed");
    assert_eq!(snap.slots[0].apis[0].calls, 5);
    let snap = snapshot_of(&v2_image());
    assert_eq!(snap.geometry.major, 2, "the seed is a version 2.0 region");
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(snap.slots[0].apis[0].api, ApiId(40));
    assert_eq!(snap.slots[0].apis[0].calls, 1);
    let mut bytes = std::fs::read(seeds.join("hami-1-proc")).unwrap();
    bytes.resize(HAMI_V1_SIZE as usize, 0);
    std::fs::write(&path, &bytes).unwrap();
    let snap = HamiReader::open(&path).unwrap().snapshot().unwrap();
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].pid, 42);
}

const RESERVED_0: usize = 160 + 8;
const SLOT0: usize = 4096;

/// Offsets of slot 0's first held word and its intent in layout `major`.
fn held_and_intent(major: u32) -> (usize, usize) {
    use region::layout::SlotHeader;
    use region::layout_v2::SlotHeaderV2;
    use std::mem::offset_of;
    if major >= 3 {
        (offset_of!(SlotHeader, held), offset_of!(SlotHeader, intent))
    } else {
        (
            offset_of!(SlotHeaderV2, held),
            offset_of!(SlotHeaderV2, intent),
        )
    }
}

/// The version 2.0 seed (`fuzz/seeds/vgpu-2-slots`, written by the layout 2 writer: 2 slots, 2
/// devices, slot 0 holding 4096 bytes on device 0 and one call of API 40), at its full size.
fn v2_image() -> Vec<u8> {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut bytes = std::fs::read(seeds.join("vgpu-2-slots")).unwrap();
    bytes.resize(region::layout::region_size_for(2, 2) as usize, 0);
    bytes
}

fn put(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

fn snapshot_of(bytes: &[u8]) -> region::reader::RegionSnapshot {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    std::fs::write(&path, bytes).unwrap();
    RegionReader::open(&path).unwrap().snapshot().unwrap()
}

/// Version 2 and 3 words carry tags above bit 48: the reader reports bytes only, and garbage in
/// the tags or in the intent words changes nothing it reports.
#[test]
fn tagged_words_decode_to_bytes_whatever_the_tags_hold() {
    for (major, image) in [(3, valid_image().to_vec()), (2, v2_image())] {
        let snap = snapshot_of(&image);
        assert_eq!(snap.geometry.major, major);
        assert_eq!(snap.devices[0].reserved, 4096);
        assert_eq!(snap.slots[0].held[0], 4096);
        let (held_0, intent) = held_and_intent(major);
        let mut bytes = image.clone();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let (reserved, held) = (word(RESERVED_0), word(SLOT0 + held_0));
        assert_ne!(reserved >> 48, 0, "the container word carries a tag");
        put(
            &mut bytes,
            RESERVED_0,
            0xffff << 48 | (reserved & region::MAX_RESERVABLE),
        );
        put(
            &mut bytes,
            SLOT0 + held_0,
            0xabcd << 48 | (held & region::MAX_RESERVABLE),
        );
        put(&mut bytes, SLOT0 + intent, u64::MAX);
        put(&mut bytes, SLOT0 + intent + 8, u64::MAX);
        let garbled = snapshot_of(&bytes);
        assert_eq!(garbled.devices[0].reserved, 4096);
        assert_eq!(garbled.slots[0].held[0], 4096);
    }
}

/// Version 1 and 2 files still read (version 1 words undecoded); a version 3 writer refuses to
/// join them with a typed error; an unknown major is refused by the reader.
#[test]
fn older_majors_read_and_writers_refuse_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut config = RegionConfig::unlimited(2);
    config.slots = 2;
    std::fs::write(&path, v2_image()).unwrap();
    let err = Region::open_or_create(&path, &config).unwrap_err();
    assert!(
        matches!(
            err,
            region::RegionError::Invalid {
                source: region::reader::ReadError::UnsupportedVersion { major: 2, .. },
                ..
            }
        ),
        "{err:?}"
    );
    let mut bytes = v2_image();
    put(&mut bytes, 16, 1 << 32 | 3);
    put(&mut bytes, RESERVED_0, 1 << 50);
    let snap = snapshot_of(&bytes);
    assert_eq!((snap.geometry.major, snap.geometry.minor), (1, 3));
    assert_eq!(
        snap.devices[0].reserved,
        1 << 50,
        "major 1 words are plain bytes"
    );
    std::fs::write(&path, &bytes).unwrap();
    let err = Region::open_or_create(&path, &config).unwrap_err();
    assert!(
        matches!(
            err,
            region::RegionError::Invalid {
                source: region::reader::ReadError::UnsupportedVersion { major: 1, .. },
                ..
            }
        ),
        "{err:?}"
    );
    put(&mut bytes, 16, 4 << 32);
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        RegionReader::open(&path),
        Err(region::reader::ReadError::UnsupportedVersion { major: 4, .. })
    ));
}
