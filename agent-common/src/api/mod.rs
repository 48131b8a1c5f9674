//! The CUDA driver API entry points that vgpu-agent traces or intercepts.
//!
//! An [`ApiId`] is the index of an entry in [`APIS`]. Ids are part of the on-disk region protocol and
//! of the eBPF map keys, so the table is **append-only**: never reorder or remove an entry.

mod args;
mod cookie;
mod nccl;

pub use args::{ArgLoc, MemEffect};
pub use cookie::ProbeCookie;
pub use nccl::{
    COMM_ID_START, NCCL_NUM_TYPES, NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_WORDS, NcclArgs, NcclOp,
    UniqueIdAt, comm_id_digest, comm_id_of, comm_id_word, nccl_datatype_size,
};

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
    /// NCCL (`libnccl.so.2`): communicator lifecycle, collectives, point-to-point and groups.
    /// Probed on NCCL libraries only, by the `nccl_*` program pair; see [`NcclArgs`].
    Nccl = 7,
}

impl ApiKind {
    /// Kinds of the CUDA driver API (libcuda) that have an eBPF entry/return program pair.
    /// NCCL's kind is probed too, on NCCL libraries only: see [`ApiKind::NCCL_PROBED`].
    pub const PROBED: [ApiKind; 6] = [
        ApiKind::Alloc,
        ApiKind::Free,
        ApiKind::Sync,
        ApiKind::Copy,
        ApiKind::Launch,
        ApiKind::Lifecycle,
    ];

    /// The high-rate kinds of the CUDA driver API: a probe budget samples them, and the limiter
    /// records them itself (so processes under it are not probed for them).
    pub const HIGH_RATE: [ApiKind; 3] = [ApiKind::Launch, ApiKind::Sync, ApiKind::Copy];

    /// The kinds a probe budget samples: the high-rate ones and NCCL's (its collective,
    /// point-to-point and group calls; a communicator's creation and end are always probed:
    /// [`ApiSpec::is_nccl_call`]).
    pub const BUDGETED: [ApiKind; 4] =
        [ApiKind::Launch, ApiKind::Sync, ApiKind::Copy, ApiKind::Nccl];

    /// Kinds probed on NCCL libraries.
    pub const NCCL_PROBED: [ApiKind; 1] = [ApiKind::Nccl];

    /// Whether the kind's entry points live in libnccl (else in libcuda).
    pub const fn is_nccl(self) -> bool {
        matches!(self, ApiKind::Nccl)
    }

    pub const fn name(self) -> &'static str {
        match self {
            ApiKind::Alloc => "alloc",
            ApiKind::Free => "free",
            ApiKind::Sync => "sync",
            ApiKind::Copy => "copy",
            ApiKind::Launch => "launch",
            ApiKind::Lifecycle => "lifecycle",
            ApiKind::Info => "info",
            ApiKind::Nccl => "nccl",
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
    /// Where an NCCL call's arguments are ([`NcclArgs::NONE`] for the CUDA driver API).
    pub nccl: NcclArgs,
    /// Where the stream argument (`CUstream`, `cudaStream_t`) is, for APIs that take one in a
    /// register or one of the first stack slots (spans carry it as `cuda.stream`).
    pub stream: Option<ArgLoc>,
}

impl ApiSpec {
    /// Whether this is an NCCL collective, point-to-point or group call (not a communicator's
    /// creation or end): the NCCL calls a probe budget samples.
    pub const fn is_nccl_call(&self) -> bool {
        matches!(self.kind, ApiKind::Nccl) && matches!(self.nccl.op, NcclOp::Call)
    }

    /// The same entry point, with its stream argument at `loc`.
    const fn on_stream(self, loc: ArgLoc) -> ApiSpec {
        ApiSpec {
            stream: Some(loc),
            ..self
        }
    }
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
        nccl: NcclArgs::NONE,
        stream: None,
    }
}

/// An NCCL entry point: `ncclX`, resolved as `pncclX` where the weak alias is missing.
const fn nccl(name: &'static str, args: NcclArgs) -> ApiSpec {
    ApiSpec {
        name,
        kind: ApiKind::Nccl,
        size_arg: None,
        effect: MemEffect::None,
        nccl: args,
        stream: None,
    }
}

use ArgLoc as L;

use ApiKind::*;
use MemEffect as E;

/// Every entry point, indexed by [`ApiId`]. Append only.
pub const APIS: &[ApiSpec] = &[
    // Allocation.
    spec("cuMemAlloc_v2", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocPitch_v2", Alloc, None, E::AllocPitch),
    spec("cuMemAllocManaged", Alloc, Some(1), E::AllocPtr),
    spec("cuMemAllocAsync", Alloc, Some(1), E::AllocPtr).on_stream(L::Rdx),
    spec("cuMemAllocAsync_ptsz", Alloc, Some(1), E::AllocPtr).on_stream(L::Rdx),
    spec("cuMemAllocFromPoolAsync", Alloc, Some(1), E::AllocPtr).on_stream(L::Rcx),
    spec("cuMemAllocFromPoolAsync_ptsz", Alloc, Some(1), E::AllocPtr).on_stream(L::Rcx),
    spec("cuMemCreate", Alloc, Some(1), E::AllocHandle),
    // cuMemMap maps memory already counted by cuMemCreate: bytes are shown, live memory is not
    // counted twice.
    spec("cuMemMap", Alloc, Some(1), E::None),
    // Release.
    spec("cuMemFree_v2", Free, None, E::FreePtr),
    spec("cuMemFreeAsync", Free, None, E::FreePtr).on_stream(L::Rsi),
    spec("cuMemFreeAsync_ptsz", Free, None, E::FreePtr).on_stream(L::Rsi),
    spec("cuMemRelease", Free, None, E::FreeHandle),
    spec("cuMemUnmap", Free, Some(1), E::None),
    // Synchronisation.
    spec("cuStreamSynchronize", Sync, None, E::None).on_stream(L::Rdi),
    spec("cuStreamSynchronize_ptsz", Sync, None, E::None).on_stream(L::Rdi),
    spec("cuCtxSynchronize", Sync, None, E::None),
    spec("cuEventSynchronize", Sync, None, E::None),
    spec("cuStreamWaitEvent", Sync, None, E::None).on_stream(L::Rdi),
    spec("cuStreamWaitEvent_ptsz", Sync, None, E::None).on_stream(L::Rdi),
    // Copies.
    spec("cuMemcpy", Copy, Some(2), E::None),
    spec("cuMemcpy_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyAsync", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyAsync_ptsz", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyHtoD_v2", Copy, Some(2), E::None),
    spec("cuMemcpyHtoD_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyDtoH_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoH_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyDtoD_v2", Copy, Some(2), E::None),
    spec("cuMemcpyDtoD_v2_ptds", Copy, Some(2), E::None),
    spec("cuMemcpyHtoDAsync_v2", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyHtoDAsync_v2_ptsz", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyDtoHAsync_v2", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyDtoHAsync_v2_ptsz", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyDtoDAsync_v2", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyDtoDAsync_v2_ptsz", Copy, Some(2), E::None).on_stream(L::Rcx),
    spec("cuMemcpyPeer", Copy, Some(4), E::None),
    spec("cuMemcpyPeerAsync", Copy, Some(4), E::None).on_stream(L::R9),
    // Launches.
    spec("cuLaunchKernel", Launch, None, E::None).on_stream(L::Stack3),
    spec("cuLaunchKernel_ptsz", Launch, None, E::None).on_stream(L::Stack3),
    spec("cuLaunchKernelEx", Launch, None, E::None),
    spec("cuLaunchKernelEx_ptsz", Launch, None, E::None),
    spec("cuLaunchCooperativeKernel", Launch, None, E::None).on_stream(L::Stack3),
    spec("cuLaunchCooperativeKernel_ptsz", Launch, None, E::None).on_stream(L::Stack3),
    spec("cuGraphLaunch", Launch, None, E::None).on_stream(L::Rsi),
    spec("cuGraphLaunch_ptsz", Launch, None, E::None).on_stream(L::Rsi),
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
    spec("cuMemcpyPeerAsync_ptsz", Copy, Some(4), E::None).on_stream(L::R9),
    spec("cuMemcpyBatchAsync", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_ptsz", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_v2", Copy, None, E::None),
    spec("cuMemcpyBatchAsync_v2_ptsz", Copy, None, E::None),
    spec("cuLaunchHostFunc", Launch, None, E::None).on_stream(L::Rdi),
    spec("cuLaunchHostFunc_ptsz", Launch, None, E::None).on_stream(L::Rdi),
    // NCCL (ids 68..), from nccl.h of NCCL 2.28 (all return ncclResult_t; ncclSuccess = 0).
    // Registers are x86-64 SysV at the first instruction; `[rsp+8]` is the 7th integer argument.
    // ncclCommInitRank(ncclComm_t* comm /*rdi*/, int nranks /*rsi*/, ncclUniqueId commId
    //   /*128 bytes by value: stack, no register*/, int rank /*rdx*/)
    nccl("ncclCommInitRank", NcclArgs::init_one(UniqueIdAt::ByValue)),
    // ncclCommInitRankConfig(ncclComm_t* comm /*rdi*/, int nranks /*rsi*/, ncclUniqueId commId
    //   /*stack*/, int rank /*rdx*/, ncclConfig_t* config /*rcx*/): what PyTorch calls.
    nccl(
        "ncclCommInitRankConfig",
        NcclArgs::init_one(UniqueIdAt::ByValue),
    ),
    // ncclCommInitAll(ncclComm_t* comms /*rdi*/, int ndev /*rsi*/, const int* devlist /*rdx*/)
    nccl("ncclCommInitAll", NcclArgs::op(NcclOp::InitAll, None)),
    // ncclCommInitRankScalable(ncclComm_t* newcomm /*rdi*/, int nranks /*rsi*/, int myrank
    //   /*rdx*/, int nId /*rcx*/, ncclUniqueId* commIds /*r8*/, ncclConfig_t* config /*r9*/)
    nccl(
        "ncclCommInitRankScalable",
        NcclArgs::init_one(UniqueIdAt::Pointer(L::R8)),
    ),
    // ncclCommDestroy(ncclComm_t comm /*rdi*/), ncclCommAbort(ncclComm_t comm /*rdi*/)
    nccl(
        "ncclCommDestroy",
        NcclArgs::op(NcclOp::Destroy, Some(L::Rdi)),
    ),
    nccl("ncclCommAbort", NcclArgs::op(NcclOp::Destroy, Some(L::Rdi))),
    // ncclAllReduce(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t count /*rdx*/,
    //   ncclDataType_t datatype /*rcx*/, ncclRedOp_t op /*r8*/, ncclComm_t comm /*r9*/,
    //   cudaStream_t stream /*[rsp+8]*/)
    nccl("ncclAllReduce", NcclArgs::data(L::Rdx, L::Rcx, L::R9)).on_stream(L::Stack1),
    // ncclAllGather(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t sendcount
    //   /*rdx*/, ncclDataType_t datatype /*rcx*/, ncclComm_t comm /*r8*/, cudaStream_t stream
    //   /*r9*/): bytes are what each rank sends.
    nccl("ncclAllGather", NcclArgs::data(L::Rdx, L::Rcx, L::R8)).on_stream(L::R9),
    // ncclReduceScatter(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t recvcount
    //   /*rdx*/, ncclDataType_t datatype /*rcx*/, ncclRedOp_t op /*r8*/, ncclComm_t comm /*r9*/,
    //   cudaStream_t stream /*[rsp+8]*/): bytes are what each rank receives.
    nccl("ncclReduceScatter", NcclArgs::data(L::Rdx, L::Rcx, L::R9)).on_stream(L::Stack1),
    // ncclBroadcast(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t count /*rdx*/,
    //   ncclDataType_t datatype /*rcx*/, int root /*r8*/, ncclComm_t comm /*r9*/,
    //   cudaStream_t stream /*[rsp+8]*/)
    nccl("ncclBroadcast", NcclArgs::data(L::Rdx, L::Rcx, L::R9)).on_stream(L::Stack1),
    // ncclReduce(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t count /*rdx*/,
    //   ncclDataType_t datatype /*rcx*/, ncclRedOp_t op /*r8*/, int root /*r9*/, ncclComm_t comm
    //   /*[rsp+8]*/, cudaStream_t stream /*[rsp+16]*/)
    nccl("ncclReduce", NcclArgs::data(L::Rdx, L::Rcx, L::Stack1)).on_stream(L::Stack2),
    // ncclSend(const void* sendbuff /*rdi*/, size_t count /*rsi*/, ncclDataType_t datatype
    //   /*rdx*/, int peer /*rcx*/, ncclComm_t comm /*r8*/, cudaStream_t stream /*r9*/)
    nccl("ncclSend", NcclArgs::data(L::Rsi, L::Rdx, L::R8)).on_stream(L::R9),
    // ncclRecv(void* recvbuff /*rdi*/, size_t count /*rsi*/, ncclDataType_t datatype /*rdx*/,
    //   int peer /*rcx*/, ncclComm_t comm /*r8*/, cudaStream_t stream /*r9*/)
    nccl("ncclRecv", NcclArgs::data(L::Rsi, L::Rdx, L::R8)).on_stream(L::R9),
    // ncclGroupStart(void), ncclGroupEnd(void)
    nccl("ncclGroupStart", NcclArgs::NONE),
    nccl("ncclGroupEnd", NcclArgs::NONE),
    // ncclAlltoAll(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t count /*rdx*/,
    //   ncclDataType_t datatype /*rcx*/, ncclComm_t comm /*r8*/, cudaStream_t stream /*r9*/)
    //   (new in 2.28; spelled "Allto", not "AllTo")
    nccl("ncclAlltoAll", NcclArgs::data(L::Rdx, L::Rcx, L::R8)).on_stream(L::R9),
    // ncclGather(const void* sendbuff /*rdi*/, void* recvbuff /*rsi*/, size_t count /*rdx*/,
    //   ncclDataType_t datatype /*rcx*/, int root /*r8*/, ncclComm_t comm /*r9*/,
    //   cudaStream_t stream /*[rsp+8]*/)
    nccl("ncclGather", NcclArgs::data(L::Rdx, L::Rcx, L::R9)).on_stream(L::Stack1),
    // ncclScatter: as ncclGather.
    nccl("ncclScatter", NcclArgs::data(L::Rdx, L::Rcx, L::R9)).on_stream(L::Stack1),
    // Not traced: ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
    //   ncclComm_t comm, cudaStream_t stream), which PyTorch's broadcast calls. NCCL implements
    //   it as ncclBroadcast(buff, buff, ...), so the probe on ncclBroadcast counts it once;
    //   probing both would count it twice.
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
    /// The id of a symbol name, if traced. A `const fn`, so callers with a constant name (the
    /// limiter's hooks) get the id at compile time.
    pub const fn from_name(name: &str) -> Option<ApiId> {
        const fn same(a: &[u8], b: &[u8]) -> bool {
            if a.len() != b.len() {
                return false;
            }
            let mut i = 0;
            while i < a.len() {
                if a[i] != b[i] {
                    return false;
                }
                i += 1;
            }
            true
        }
        let mut i = 0;
        while i < APIS.len() {
            if same(APIS[i].name.as_bytes(), name.as_bytes()) {
                return Some(ApiId(i as u16));
            }
            i += 1;
        }
        None
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

// The cookie of a table entry is made here, beside the table, so that the cookie's module needs
// nothing of the table.
impl ProbeCookie {
    /// The cookie of the API `id` (`None` for an id outside the table).
    pub fn for_api(id: ApiId) -> Option<ProbeCookie> {
        id.spec().map(|s| {
            ProbeCookie::new(id.0, s.size_arg, s.effect)
                .with_nccl(s.nccl)
                .with_stream(s.stream)
        })
    }
}

#[cfg(test)]
mod tests {
    //! Unit tests of the API table, the NCCL argument specs and the probe cookie encoding.

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
            assert_eq!(c.nccl_args(), s.nccl);
            assert_eq!(c.stream(), s.stream);
        }
    }

    #[test]
    fn stream_locations_are_pinned() {
        let c = |name| ProbeCookie::for_api(ApiId::from_name(name).unwrap()).unwrap();
        assert_eq!(c("cuStreamSynchronize").stream(), Some(ArgLoc::Rdi));
        assert_eq!(c("cuStreamSynchronize").0 >> 40, 1);
        assert_eq!(c("cuMemcpyHtoDAsync_v2").stream(), Some(ArgLoc::Rcx));
        assert_eq!(c("cuMemcpyPeerAsync").stream(), Some(ArgLoc::R9));
        // cuLaunchKernel's hStream is its 9th argument: [rsp+24].
        assert_eq!(c("cuLaunchKernel").stream(), Some(ArgLoc::Stack3));
        assert_eq!(c("cuLaunchKernel").0 >> 40, 9);
        assert_eq!(ArgLoc::Stack3.stack_offset(), Some(24));
        assert_eq!(c("ncclAllReduce").stream(), Some(ArgLoc::Stack1));
        assert_eq!(c("ncclReduce").stream(), Some(ArgLoc::Stack2));
        assert_eq!(c("ncclSend").stream(), Some(ArgLoc::R9));
        // No stream argument: synchronous calls, context-wide synchronisation.
        for name in [
            "cuMemcpyHtoD_v2",
            "cuCtxSynchronize",
            "cuMemAlloc_v2",
            "ncclGroupEnd",
        ] {
            assert_eq!(c(name).stream(), None, "{name}");
        }
    }

    #[test]
    fn cuda_cookies_keep_their_bits() {
        // The CUDA kinds' cookies have no NCCL bits (24..40); the stream location is above them.
        for id in ApiId::all() {
            let s = id.spec().unwrap();
            let c = ProbeCookie::for_api(id).unwrap();
            if s.kind.is_nccl() {
                assert_eq!(s.size_arg, None, "{}", s.name);
                assert_eq!(s.effect, MemEffect::None, "{}", s.name);
            } else {
                assert_eq!(c.0 >> 24 & 0xffff, 0, "{}", s.name);
                assert_eq!(s.nccl, NcclArgs::NONE, "{}", s.name);
            }
        }
        let alloc = ApiId::from_name("cuMemAlloc_v2").unwrap();
        assert_eq!(ProbeCookie::for_api(alloc).unwrap().0, 0x0012_0000);
    }

    #[test]
    fn nccl_cookie_encoding_is_pinned() {
        let c = |name| ProbeCookie::for_api(ApiId::from_name(name).unwrap()).unwrap();
        // ncclAllReduce: id 74, count rdx (2+1), datatype rcx (3+1), comm r9 (5+1), op Call.
        let ar = c("ncclAllReduce");
        assert_eq!(ar.api(), 74);
        assert_eq!(ar.0, 74 | (3 << 24) | (4 << 28) | (6 << 32) | (7 << 40));
        assert_eq!(ar.nccl_count(), Some(ArgLoc::Rdx));
        assert_eq!(ar.nccl_datatype(), Some(ArgLoc::Rcx));
        assert_eq!(ar.nccl_comm(), Some(ArgLoc::R9));
        // ncclReduce's comm is the 7th argument, on the stack at [rsp+8].
        let r = c("ncclReduce");
        assert_eq!(r.nccl_comm(), Some(ArgLoc::Stack1));
        assert_eq!(r.0 >> 32 & 0xf, 7);
        assert_eq!(ArgLoc::Stack1.stack_offset(), Some(8));
        assert_eq!(ArgLoc::Stack2.stack_offset(), Some(16));
        assert_eq!(ArgLoc::R9.stack_offset(), None);
        // Send/Recv: count rsi, datatype rdx, comm r8.
        for name in ["ncclSend", "ncclRecv"] {
            let a = c(name).nccl_args();
            assert_eq!(
                (a.count, a.datatype, a.comm),
                (Some(ArgLoc::Rsi), Some(ArgLoc::Rdx), Some(ArgLoc::R8)),
                "{name}"
            );
        }
        // Communicator creation: op in bits 36..40, the unique id by value in 44..48, no
        // count/datatype/comm location.
        let init = c("ncclCommInitRank");
        assert_eq!(init.0, 68 | (1 << 36) | (1 << 44));
        assert_eq!(c("ncclCommInitRankConfig").nccl_op(), NcclOp::InitOne);
        assert_eq!(c("ncclCommInitAll").nccl_op(), NcclOp::InitAll);
        let d = c("ncclCommDestroy");
        assert_eq!(
            (d.nccl_op(), d.nccl_comm()),
            (NcclOp::Destroy, Some(ArgLoc::Rdi))
        );
        assert_eq!(c("ncclGroupEnd").0 >> 16, 0);
        // Where the unique id is: bits 44..48, 1 = by value at [rsp+8], 2 + ArgLoc = a pointer.
        assert_eq!(init.nccl_unique_id(), Some(UniqueIdAt::ByValue));
        assert_eq!(
            c("ncclCommInitRankConfig").nccl_unique_id(),
            Some(UniqueIdAt::ByValue)
        );
        let scalable = c("ncclCommInitRankScalable");
        assert_eq!((scalable.0 >> 44) & 0xf, 2 + ArgLoc::R8 as u64);
        assert_eq!(
            scalable.nccl_unique_id(),
            Some(UniqueIdAt::Pointer(ArgLoc::R8))
        );
        assert_eq!(c("ncclCommInitAll").nccl_unique_id(), None);
        assert_eq!(c("ncclAllReduce").nccl_unique_id(), None);
    }

    #[test]
    fn comm_id_is_nccls_hash_of_the_unique_id() {
        // Expected values from NCCL's own getHash (src/include/bitops.h, 2.28.3, the commId its
        // "Init START" line prints) compiled with g++ on x86-64: bytes 0..128, bytes 255 down to
        // 128, zeros.
        let ascending: [u8; NCCL_UNIQUE_ID_BYTES] = core::array::from_fn(|i| i as u8);
        let descending: [u8; NCCL_UNIQUE_ID_BYTES] = core::array::from_fn(|i| 255 - i as u8);
        assert_eq!(comm_id_of(&ascending), 0x6afe_1cc1_7717_e1f4);
        assert_eq!(comm_id_of(&descending), 0xf8a0_d528_3e69_3fb2);
        assert_eq!(
            comm_id_of(&[0; NCCL_UNIQUE_ID_BYTES]),
            0xcc97_6ec6_c24b_b53c
        );
    }

    #[test]
    fn nccl_ids_are_appended_and_within_the_reserved_slots() {
        let first = ApiId::from_name("ncclCommInitRank").unwrap().0 as usize;
        assert_eq!(first, 68);
        assert!(APIS[..first].iter().all(|a| !a.kind.is_nccl()));
        assert!(APIS[first..].iter().all(|a| a.kind == ApiKind::Nccl));
        assert_eq!(ApiId::from_name("ncclScatter").unwrap().0, 85);
        assert_eq!(API_COUNT, 86);
        assert_eq!(
            ApiId::from_name("ncclBcast"),
            None,
            "counted as ncclBroadcast"
        );
    }

    #[test]
    fn nccl_datatype_sizes() {
        let want = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
        for (dt, size) in want.iter().enumerate() {
            assert_eq!(nccl_datatype_size(dt as u32), Some(*size), "datatype {dt}");
        }
        assert_eq!(want.len() as u32, NCCL_NUM_TYPES);
        assert_eq!(nccl_datatype_size(NCCL_NUM_TYPES), None);
        assert_eq!(nccl_datatype_size(u32::MAX), None);
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
