//! NCCL argument specs: what an NCCL call does to communicators ([`NcclOp`]), where its count,
//! datatype, communicator and `ncclUniqueId` are ([`NcclArgs`]), the size of an
//! `ncclDataType_t`, and NCCL's communicator id ([`comm_id_of`]).

use super::args::ArgLoc;

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

/// NCCL's communicator id (NCCL 2.26 and later): the `commId 0x...` it prints in its
/// `NCCL_DEBUG=INFO` lines ("Init START", "Init COMPLETE"), the same in every rank of one
/// communicator, for communicators made from an `ncclUniqueId` (ncclCommInitRank,
/// InitRankConfig, InitRankScalable). NCCL hashes the id's 128 bytes as sixteen little-endian
/// 64-bit words into a two-word accumulator ([`comm_id_word`]), starting from
/// [`COMM_ID_START`], and mixes the result ([`comm_id_digest`]). (NCCL 2.12 to 2.25 printed
/// another hash of the same bytes; ids of those versions do not match NCCL's logs.)
pub const COMM_ID_START: [u64; 2] = [1 ^ NCCL_UNIQUE_ID_BYTES as u64, 1];

/// Words of an `ncclUniqueId` hashed by [`comm_id_word`].
pub const NCCL_UNIQUE_ID_WORDS: usize = NCCL_UNIQUE_ID_BYTES / 8;

/// One word of the unique id into the accumulator.
#[inline(always)]
pub const fn comm_id_word(acc: [u64; 2], word: u64) -> [u64; 2] {
    let mut a = acc[0].wrapping_add(acc[1]);
    let mut b = acc[1] ^ a;
    a ^= a >> 31;
    a = a.wrapping_mul(0x9de6_2bbc_8cef_3ce3);
    b ^= b >> 32;
    b = b.wrapping_mul(0x485c_d631_1b59_9e79);
    [a.wrapping_add(word), b]
}

/// The id of an accumulator that took every word.
#[inline(always)]
pub const fn comm_id_digest(acc: [u64; 2]) -> u64 {
    let mut h = acc[0];
    h ^= h >> 31;
    h = h.wrapping_mul(0xbac3_bd56_2846_de6b);
    h = h.wrapping_add(acc[1]);
    h ^= h >> 32;
    h.wrapping_mul(0x995a_187a_14e7_b445)
}

/// NCCL's communicator id of a unique id.
pub fn comm_id_of(unique_id: &[u8; NCCL_UNIQUE_ID_BYTES]) -> u64 {
    let (words, _) = unique_id.as_chunks::<8>();
    let acc = words.iter().fold(COMM_ID_START, |acc, w| {
        comm_id_word(acc, u64::from_le_bytes(*w))
    });
    comm_id_digest(acc)
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
