//! NCCL argument specs: what an NCCL call does to communicators ([`NcclOp`]), where its count,
//! datatype, communicator and `ncclUniqueId` are ([`NcclArgs`]), the size of an
//! `ncclDataType_t`, and NCCL's communicator id ([`comm_id_of`]).

use super::ArgLoc;

/// What an NCCL call does to communicators, beyond being counted.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclOp {
    /// A collective, point-to-point or group call.
    Call = 0,
    /// Creates one communicator: `ncclComm_t *out` in rdi, `int nranks` in rsi, `int rank` in
    /// rdx (ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitRankScalable).
    InitOne = 1,
    /// `ncclCommInitAll(ncclComm_t *comms /*rdi*/, int ndev /*rsi*/, const int *devlist)`:
    /// `comms[i]` has rank i of ndev.
    InitAll = 2,
    /// Ends the communicator in its comm argument (ncclCommDestroy, ncclCommAbort).
    Destroy = 3,
}

impl NcclOp {
    pub const fn from_u8(v: u8) -> NcclOp {
        match v {
            1 => NcclOp::InitOne,
            2 => NcclOp::InitAll,
            3 => NcclOp::Destroy,
            _ => NcclOp::Call,
        }
    }
}

/// Where an ncclCommInit* call's `ncclUniqueId` (128 bytes) is at its first instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UniqueIdAt {
    /// Passed by value: a struct over 16 bytes goes on the stack, at `[rsp + 8]` at entry
    /// (ncclCommInitRank, ncclCommInitRankConfig).
    ByValue,
    /// Through a pointer argument (ncclCommInitRankScalable's `commIds`: NCCL hashes the first).
    Pointer(ArgLoc),
}

impl UniqueIdAt {
    /// 4 cookie bits: 0 none, 1 by value, 2 + `ArgLoc` through a pointer.
    pub const fn encode(at: Option<UniqueIdAt>) -> u64 {
        match at {
            None => 0,
            Some(UniqueIdAt::ByValue) => 1,
            Some(UniqueIdAt::Pointer(l)) => 2 + (l as u64 & 0xf),
        }
    }

    pub const fn decode(bits: u64) -> Option<UniqueIdAt> {
        match bits & 0xf {
            0 => None,
            1 => Some(UniqueIdAt::ByValue),
            n => match ArgLoc::from_u8((n - 2) as u8) {
                Some(l) => Some(UniqueIdAt::Pointer(l)),
                None => None,
            },
        }
    }
}

/// Bytes of an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// One step of NCCL's `hashUniqueId` (src/init.cc, NCCL 2.12 to 2.28): the communicator id that
/// NCCL prints as `commId 0x...` in its `NCCL_DEBUG=INFO` lines ("Init START", "Init COMPLETE"),
/// the same in every rank of one communicator. Bytes are C `char`s, signed on x86-64.
#[inline(always)]
pub const fn comm_id_step(h: u64, byte: u8) -> u64 {
    let h = h ^ (h >> 32);
    h.wrapping_mul(0x8db3_db47_fa29_94ad)
        .wrapping_add(byte as i8 as i64 as u64)
}

/// The starting value of [`comm_id_step`].
pub const COMM_ID_SEED: u64 = 0xdead_beef;

/// NCCL's communicator id of a unique id.
pub fn comm_id_of(unique_id: &[u8; NCCL_UNIQUE_ID_BYTES]) -> u64 {
    unique_id
        .iter()
        .fold(COMM_ID_SEED, |h, b| comm_id_step(h, *b))
}

/// Where an NCCL call's element count, datatype, communicator and unique id are. Bytes are
/// `count x size(datatype)` ([`nccl_datatype_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclArgs {
    pub count: Option<ArgLoc>,
    pub datatype: Option<ArgLoc>,
    pub comm: Option<ArgLoc>,
    pub op: NcclOp,
    /// ncclCommInit* calls that take an `ncclUniqueId`: where it is.
    pub unique_id: Option<UniqueIdAt>,
}

impl NcclArgs {
    pub const NONE: NcclArgs = NcclArgs {
        count: None,
        datatype: None,
        comm: None,
        op: NcclOp::Call,
        unique_id: None,
    };

    /// A call on a data buffer: count, datatype and communicator.
    pub(super) const fn data(count: ArgLoc, datatype: ArgLoc, comm: ArgLoc) -> NcclArgs {
        NcclArgs {
            count: Some(count),
            datatype: Some(datatype),
            comm: Some(comm),
            op: NcclOp::Call,
            unique_id: None,
        }
    }

    pub(super) const fn op(op: NcclOp, comm: Option<ArgLoc>) -> NcclArgs {
        NcclArgs {
            count: None,
            datatype: None,
            comm,
            op,
            unique_id: None,
        }
    }

    /// A communicator creation whose `ncclUniqueId` is at `at`.
    pub(super) const fn init_one(at: UniqueIdAt) -> NcclArgs {
        NcclArgs {
            unique_id: Some(at),
            ..NcclArgs::op(NcclOp::InitOne, None)
        }
    }
}

/// Number of NCCL datatypes (`ncclNumTypes` in NCCL 2.24-2.28).
pub const NCCL_NUM_TYPES: u32 = 12;

/// Bytes per element of an `ncclDataType_t`, `None` for values NCCL 2.28 does not define.
#[inline(always)]
pub const fn nccl_datatype_size(datatype: u32) -> Option<u64> {
    match datatype {
        // ncclInt8, ncclUint8, ncclFloat8e4m3, ncclFloat8e5m2
        0 | 1 | 10 | 11 => Some(1),
        // ncclFloat16, ncclBfloat16
        6 | 9 => Some(2),
        // ncclInt32, ncclUint32, ncclFloat32
        2 | 3 | 7 => Some(4),
        // ncclInt64, ncclUint64, ncclFloat64
        4 | 5 | 8 => Some(8),
        _ => None,
    }
}
