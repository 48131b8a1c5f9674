//! The CUDA driver API entry points that vgpu-agent traces or intercepts.
//!
//! An [`ApiId`] is the index of an entry in [`APIS`]. Ids are part of the on-disk region protocol and
//! of the eBPF map keys, so the table is **append-only**: never reorder or remove an entry.

/// What a call does, which decides the eBPF program that probes it and how it is shown.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiKind {
    /// Device memory allocation.
    Alloc = 0,
    /// Device memory release.
    Free = 1,
    /// Host thread waits for the device.
    Sync = 2,
    /// Memory copies, synchronous and asynchronous.
    Copy = 3,
    /// Kernel and graph launches: the hot path.
    Launch = 4,
    /// Driver and context lifecycle.
    Lifecycle = 5,
    /// Memory information queries (intercepted by the limiter, not probed).
    Info = 6,
}

impl ApiKind {
    /// Kinds that have an eBPF entry/return program pair.
    pub const PROBED: [ApiKind; 6] = [
        ApiKind::Alloc,
        ApiKind::Free,
        ApiKind::Sync,
        ApiKind::Copy,
        ApiKind::Launch,
        ApiKind::Lifecycle,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ApiKind::Alloc => "alloc",
            ApiKind::Free => "free",
            ApiKind::Sync => "sync",
            ApiKind::Copy => "copy",
            ApiKind::Launch => "launch",
            ApiKind::Lifecycle => "lifecycle",
            ApiKind::Info => "info",
        }
    }
}

/// How a call changes live device memory, and where its arguments are (x86-64 SysV argument
/// indices, 0 = first argument).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemEffect {
    None = 0,
    /// `fn(CUdeviceptr *out /*arg 0*/, size_t bytes /*arg 1*/, ...)`: on success `*out` holds the
    /// new allocation's address.
    AllocPtr = 1,
    /// `cuMemAllocPitch_v2(CUdeviceptr *out, size_t *pitch, size_t width, size_t height, unsigned)`:
    /// the size is `*pitch * height`, known only on return.
    AllocPitch = 2,
    /// `cuMemCreate(CUmemGenericAllocationHandle *out, size_t size, ...)`: physical memory named
    /// by a handle rather than an address.
    AllocHandle = 3,
    /// `fn(CUdeviceptr ptr /*arg 0*/, ...)` frees the allocation at `ptr`.
    FreePtr = 4,
    /// `cuMemRelease(CUmemGenericAllocationHandle handle)`.
    FreeHandle = 5,
}

impl MemEffect {
    pub const fn from_u8(v: u8) -> MemEffect {
        match v {
            1 => MemEffect::AllocPtr,
            2 => MemEffect::AllocPitch,
            3 => MemEffect::AllocHandle,
            4 => MemEffect::FreePtr,
            5 => MemEffect::FreeHandle,
            _ => MemEffect::None,
        }
    }
}

/// Where a tracked allocation lives: an address space (pointers) or a handle space (cuMemCreate).
pub const ALLOC_SPACE_PTR: u32 = 0;
pub const ALLOC_SPACE_HANDLE: u32 = 1;

/// One traced entry point.
#[derive(Clone, Copy, Debug)]
pub struct ApiSpec {
    /// The exported symbol name in libcuda.
    pub name: &'static str,
    pub kind: ApiKind,
    /// The argument that holds the byte count, if any.
    pub size_arg: Option<u8>,
    pub effect: MemEffect,
}

const fn spec(
    name: &'static str,
    kind: ApiKind,
    size_arg: Option<u8>,
    effect: MemEffect,
) -> ApiSpec {
    ApiSpec {
        name,
        kind,
        size_arg,
        effect,
    }
}

use ApiKind::*;
use MemEffect as E;

/// Every entry point, indexed by [`ApiId`]. Append only.
pub const APIS: &[ApiSpec] = &[
    // Allocation.
    spec("cuMemAlloc_v2", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocPitch_v2", Alloc, None, E::AllocPitch),
    spec("cuMemAllocManaged", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocAsync", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocAsync_ptsz", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocFromPoolAsync", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocFromPoolAsync_ptsz", Alloc, Some(1), E::AllocPtr),
    spec("cuMemCreate", Alloc, Some(1), E::AllocHandle),
    // cuMemMap maps memory already counted by cuMemCreate: bytes are shown, live memory is not
    // counted twice.
    spec("cuMemMap", Alloc, Some(1), E::None),
    // Release.
    spec("cuMemFree_v2", Free, None, E::FreePtr),
    spec("cuMemFreeAsync", Free, None, E::FreePtr),
    spec("cuMemFreeAsync_ptsz", Free, None, E::FreePtr),
    spec("cuMemRelease", Free, None, E::FreeHandle),
    spec("cuMemUnmap", Free, Some(1), E::None),
    // Synchronisation.
    spec("cuStreamSynchronize", Sync, None, E::None),
    spec("cuStreamSynchronize_ptsz", Sync, None, E::None),
    spec("cuCtxSynchronize", Sync, None, E::None),
    spec("cuEventSynchronize", Sync, None, E::None),
    spec("cuStreamWaitEvent", Sync, None, E::None),
    spec("cuStreamWaitEvent_ptsz", Sync, None, E::None),
    // Copies.
    spec("cuMemcpy", Copy, Some(2), E::None),
    spec("cuMemcpy_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyAsync", Copy, Some(2), E::None),
    spec("cuMemcpyAsync_ptsz", Copy, Some(2), E::None),
    spec("cuMemcpyHtoD_v2", Copy, Some(2), E::None),
    spec("cuMemcpyHtoD_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyDtoH_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoH_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyDtoD_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoD_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyHtoDAsync_v2", Copy, Some(2), E::None),
    spec("cuMemcpyHtoDAsync_v2_ptsz", Copy, Some(2), E::None),
    spec("cuMemcpyDtoHAsync_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoHAsync_v2_ptsz", Copy, Some(2), E::None),
    spec("cuMemcpyDtoDAsync_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoDAsync_v2_ptsz", Copy, Some(2), E::None),
    spec("cuMemcpyPeer", Copy, Some(4), E::None),
    spec("cuMemcpyPeerAsync", Copy, Some(4), E::None),
    // Launches.
    spec("cuLaunchKernel", Launch, None, E::None),
    spec("cuLaunchKernel_ptsz", Launch, None, E::None),
    spec("cuLaunchKernelEx", Launch, None, E::None),
    spec("cuLaunchKernelEx_ptsz", Launch, None, E::None),
    spec("cuLaunchCooperativeKernel", Launch, None, E::None),
    spec("cuLaunchCooperativeKernel_ptsz", Launch, None, E::None),
    spec("cuGraphLaunch", Launch, None, E::None),
    spec("cuGraphLaunch_ptsz", Launch, None, E::None),
    // Lifecycle.
    spec("cuInit", Lifecycle, None, E::None),
    spec("cuCtxCreate_v2", Lifecycle, None, E::None),
    spec("cuCtxCreate_v3", Lifecycle, None, E::None),
    spec("cuCtxCreate_v4", Lifecycle, None, E::None),
    spec("cuDevicePrimaryCtxRetain", Lifecycle, None, E::None),
    spec("cuCtxDestroy_v2", Lifecycle, None, E::None),
    // Information (intercepted by the limiter).
    spec("cuMemGetInfo_v2", Info, None, E::None),
    spec("cuDeviceTotalMem_v2", Info, None, E::None),
    // Appended for the limiter (ids 54..): memory pools and the driver's own symbol lookup.
    spec("cuMemPoolCreate", Lifecycle, None, E::None),
    spec("cuMemPoolDestroy", Free, None, E::None),
    spec("cuMemPoolTrimTo", Free, None, E::None),
    spec("cuGetProcAddress", Lifecycle, None, E::None),
    spec("cuGetProcAddress_v2", Lifecycle, None, E::None),
    // Appended (ids 59..) after listing driver 580's exports: CUDA 13's cudaDeviceSynchronize
    // calls cuCtxSynchronize_v2; batched copies; per-thread peer copies; host callbacks.
    spec("cuCtxSynchronize_v2", Sync, None, E::None),
    spec("cuMemcpyPeer_ptds", Copy, Some(4), E::None),
    spec("cuMemcpyPeerAsync_ptsz", Copy, Some(4), E::None),
    spec("cuMemcpyBatchAsync", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_ptsz", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_v2", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_v2_ptsz", Copy, None, E::None),
    spec("cuLaunchHostFunc", Launch, None, E::None),
    spec("cuLaunchHostFunc_ptsz", Launch, None, E::None),
];

/// Number of entries in [`APIS`]. Region shards reserve room for [`API_SLOTS`] so the table can grow
/// without a layout change.
pub const API_COUNT: usize = APIS.len();

/// Room reserved for API ids in fixed-size per-API arrays (region shards).
pub const API_SLOTS: usize = 96;
const _: () = assert!(API_COUNT <= API_SLOTS);

/// Index of an entry in [`APIS`].
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiId(pub u16);

impl ApiId {
    /// The id of a symbol name, if traced.
    pub fn from_name(name: &str) -> Option<ApiId> {
        APIS.iter()
            .position(|s| s.name == name)
            .map(|i| ApiId(i as u16))
    }

    pub fn spec(self) -> Option<&'static ApiSpec> {
        APIS.get(self.0 as usize)
    }

    pub fn name(self) -> &'static str {
        self.spec().map(|s| s.name).unwrap_or("unknown")
    }

    /// All ids, in table order.
    pub fn all() -> impl Iterator<Item = ApiId> {
        (0..API_COUNT as u16).map(ApiId)
    }
}

/// The attach cookie of a probe: everything the generic eBPF program needs to know about the call it
/// sits on, so that one program serves a whole [`ApiKind`].
///
/// Bits 0..16: api id; 16..20: size argument index + 1 (0 = none); 20..24: [`MemEffect`].
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeCookie(pub u64);

impl ProbeCookie {
    /// Cookie of the agent's own calibration probe (never an API id).
    pub const CALIBRATION_API: u16 = 0xfffe;

    pub const fn new(api: u16, size_arg: Option<u8>, effect: MemEffect) -> ProbeCookie {
        let size = match size_arg {
            Some(i) => (i as u64 & 0x7) + 1,
            None => 0,
        };
        ProbeCookie(api as u64 | (size << 16) | ((effect as u64 & 0xf) << 20))
    }

    pub fn for_api(id: ApiId) -> Option<ProbeCookie> {
        id.spec()
            .map(|s| ProbeCookie::new(id.0, s.size_arg, s.effect))
    }

    #[inline(always)]
    pub const fn api(self) -> u16 {
        self.0 as u16
    }

    #[inline(always)]
    pub const fn size_arg(self) -> Option<u8> {
        match (self.0 >> 16) & 0xf {
            0 => None,
            n => Some((n - 1) as u8),
        }
    }

    #[inline(always)]
    pub const fn effect(self) -> MemEffect {
        MemEffect::from_u8(((self.0 >> 20) & 0xf) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_ids_round_trip() {
        for (i, a) in APIS.iter().enumerate() {
            assert_eq!(
                ApiId::from_name(a.name),
                Some(ApiId(i as u16)),
                "{}",
                a.name
            );
        }
    }

    #[test]
    fn cookies_round_trip() {
        for id in ApiId::all() {
            let s = id.spec().unwrap();
            let c = ProbeCookie::for_api(id).unwrap();
            assert_eq!(c.api(), id.0);
            assert_eq!(c.size_arg(), s.size_arg);
            assert_eq!(c.effect(), s.effect);
        }
    }

    #[test]
    fn memory_effects_sit_on_the_right_kinds() {
        for a in APIS {
            match a.effect {
                MemEffect::AllocPtr | MemEffect::AllocPitch | MemEffect::AllocHandle => {
                    assert_eq!(a.kind, ApiKind::Alloc, "{}", a.name)
                }
                MemEffect::FreePtr | MemEffect::FreeHandle => {
                    assert_eq!(a.kind, ApiKind::Free, "{}", a.name)
                }
                MemEffect::None => {}
            }
        }
    }
}
