//! Validating a region's header against this crate's layout and the file's size.

use agent_common::MAX_DEVICES;
use std::sync::atomic::Ordering;

use agent_common::api::API_SLOTS;
use agent_common::hist::HIST_BUCKETS;

use super::file::{Geometry, ReadError};
use crate::layout::{
    HEADER_SIZE, LAYOUT_MAJOR, MAX_SLOTS, OLDEST_READABLE_MAJOR, REGION_MAGIC, RegionHeader,
    SHARDS_PER_SLOT, region_size_for, shard_stride_for, slot_stride_for,
};
use crate::words::{PHASE_READY, init_phase};

fn expect_field(field: &'static str, offset: u64, found: u64, want: u64) -> Result<(), ReadError> {
    if found == want {
        Ok(())
    } else {
        Err(ReadError::BadField {
            field,
            offset,
            found,
            expected: want.to_string(),
        })
    }
}

/// Validates a header against this crate's layout and the file size. Used by the reader and by
/// writers joining a region another process initialised.
pub(crate) fn validate_header(header: &RegionHeader, file_len: u64) -> Result<Geometry, ReadError> {
    let r = Ordering::Relaxed;
    // Acquire: pairs with the initialiser's Release CAS to READY.
    let state = header.init_state.load(Ordering::Acquire);
    if init_phase(state) != PHASE_READY {
        return Err(ReadError::NotReady { state });
    }
    let magic = header.magic.load(r);
    if magic != REGION_MAGIC {
        return Err(ReadError::BadMagic {
            offset: 8,
            found: magic,
            expected: REGION_MAGIC,
        });
    }
    let version = header.layout_version.load(r);
    let (major, minor) = ((version >> 32) as u32, version as u32);
    if !(OLDEST_READABLE_MAJOR..=LAYOUT_MAJOR).contains(&major) {
        return Err(ReadError::UnsupportedVersion {
            major,
            minor,
            supported: LAYOUT_MAJOR,
        });
    }
    expect_field(
        "shards_per_slot",
        36,
        header.shards_per_slot.load(r).into(),
        SHARDS_PER_SLOT as u64,
    )?;
    expect_field(
        "api_slots",
        40,
        header.api_slots.load(r).into(),
        API_SLOTS as u64,
    )?;
    expect_field(
        "hist_buckets",
        44,
        header.hist_buckets.load(r).into(),
        HIST_BUCKETS as u64,
    )?;
    expect_field(
        "max_devices",
        48,
        header.max_devices.load(r).into(),
        MAX_DEVICES as u64,
    )?;
    expect_field(
        "slot_stride",
        56,
        header.slot_stride.load(r),
        slot_stride_for(major) as u64,
    )?;
    expect_field(
        "slots_offset",
        64,
        header.slots_offset.load(r),
        HEADER_SIZE as u64,
    )?;
    expect_field(
        "shard_stride",
        72,
        header.shard_stride.load(r),
        shard_stride_for(major) as u64,
    )?;
    let slot_count = header.slot_count.load(r);
    if slot_count == 0 || slot_count > MAX_SLOTS {
        return Err(ReadError::BadField {
            field: "slot_count",
            offset: 32,
            found: slot_count.into(),
            expected: format!("1..={MAX_SLOTS}"),
        });
    }
    let device_count = header.device_count.load(r);
    if device_count == 0 || device_count as usize > MAX_DEVICES {
        return Err(ReadError::BadField {
            field: "device_count",
            offset: 52,
            found: device_count.into(),
            expected: format!("1..={MAX_DEVICES}"),
        });
    }
    let total_size = region_size_for(major, slot_count);
    expect_field("total_size", 24, header.total_size.load(r), total_size)?;
    if file_len < total_size {
        return Err(ReadError::Truncated {
            len: file_len,
            needed: total_size,
        });
    }
    Ok(Geometry {
        slot_count,
        device_count,
        total_size,
        major,
        minor,
    })
}
