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
