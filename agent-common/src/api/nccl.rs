//! NCCL argument specs: what an NCCL call does to communicators ([`NcclOp`]), where its count,
//! datatype and communicator are ([`NcclArgs`]), and the size of an `ncclDataType_t`.

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

/// Where an NCCL call's element count, datatype and communicator are. Bytes are
/// `count x size(datatype)` ([`nccl_datatype_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclArgs {
    pub count: Option<ArgLoc>,
    pub datatype: Option<ArgLoc>,
    pub comm: Option<ArgLoc>,
    pub op: NcclOp,
}

impl NcclArgs {
    pub const NONE: NcclArgs = NcclArgs {
        count: None,
        datatype: None,
        comm: None,
        op: NcclOp::Call,
    };

    /// A call on a data buffer: count, datatype and communicator.
    pub(super) const fn data(count: ArgLoc, datatype: ArgLoc, comm: ArgLoc) -> NcclArgs {
        NcclArgs {
            count: Some(count),
            datatype: Some(datatype),
            comm: Some(comm),
            op: NcclOp::Call,
        }
    }

    pub(super) const fn op(op: NcclOp, comm: Option<ArgLoc>) -> NcclArgs {
        NcclArgs {
            count: None,
            datatype: None,
            comm,
            op,
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
