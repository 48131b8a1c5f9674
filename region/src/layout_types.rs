//! The marker trait for types that may be viewed inside a mapping.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

use crate::layout::{ApiRecord, DeviceState, RegionHeader, Shard, SlotHeader, SlotRecord};
use crate::layout_v2::{ApiCountersV2, ShardV2, SlotHeaderV2, SlotRecordV2};

/// Types that may be placed over bytes of a shared mapping.
///
/// # Safety
/// Implementors must be `#[repr(C)]` (or primitive atomics), contain only atomics (so every access
/// is atomic and another process writing concurrently is no data race), be valid for every bit
/// pattern, and hold no pointers, references or file descriptors (they mean nothing in another
/// process).
pub(crate) unsafe trait RegionPod: Sync {}

// SAFETY: primitive atomics: valid for any bits, accessed atomically.
unsafe impl RegionPod for AtomicU64 {}
// SAFETY: as above.
unsafe impl RegionPod for AtomicU32 {}
// SAFETY: as above.
unsafe impl RegionPod for AtomicI32 {}
// SAFETY: `#[repr(C)]` structs made only of `AtomicU64`/`AtomicU32` fields and arrays of them.
unsafe impl RegionPod for RegionHeader {}
// SAFETY: as above.
unsafe impl RegionPod for DeviceState {}
// SAFETY: as above.
unsafe impl RegionPod for SlotRecord {}
// SAFETY: as above.
unsafe impl RegionPod for SlotHeader {}
// SAFETY: as above.
unsafe impl RegionPod for Shard {}
// SAFETY: as above.
unsafe impl RegionPod for ApiRecord {}
// SAFETY: as above.
unsafe impl RegionPod for SlotRecordV2 {}
// SAFETY: as above.
unsafe impl RegionPod for SlotHeaderV2 {}
// SAFETY: as above.
unsafe impl RegionPod for ShardV2 {}
// SAFETY: as above.
unsafe impl RegionPod for ApiCountersV2 {}
