//! The attach cookie ([`ProbeCookie`]) that carries an API's id and argument locations to the
//! generic eBPF programs.

use super::args::{ArgLoc, MemEffect};
use super::nccl::{NcclArgs, NcclOp, UniqueIdAt};

/// An argument location in 4 cookie bits: `ArgLoc` + 1, 0 for none.
const fn loc(l: Option<ArgLoc>) -> u64 {
    match l {
        Some(l) => (l as u64 & 0xf) + 1,
        None => 0,
    }
}

/// The attach cookie of a probe: everything the generic eBPF program needs to know about the call it
/// sits on, so that one program serves a whole [`ApiKind`](super::ApiKind).
///
/// Bits 0..16: api id; 16..20: size argument index + 1 (0 = none); 20..24: [`MemEffect`].
/// NCCL ([`NcclArgs`], zero for the CUDA driver API): 24..28: count [`ArgLoc`] + 1 (0 = none);
/// 28..32: datatype `ArgLoc` + 1; 32..36: communicator `ArgLoc` + 1; 36..40: [`NcclOp`].
/// 40..44: the stream argument's `ArgLoc` + 1 (0 = none; [`ApiSpec::stream`](super::ApiSpec::stream)). 44..48: where an
/// ncclCommInit* call's `ncclUniqueId` is ([`UniqueIdAt::encode`]). Bits 48..64 are free.
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

    /// Adds where an NCCL call's arguments are.
    pub const fn with_nccl(self, args: NcclArgs) -> ProbeCookie {
        ProbeCookie(
            self.0
                | (loc(args.count) << 24)
                | (loc(args.datatype) << 28)
                | (loc(args.comm) << 32)
                | ((args.op as u64 & 0xf) << 36)
                | (UniqueIdAt::encode(args.unique_id) << 44),
        )
    }

    /// Adds where the stream argument is.
    pub const fn with_stream(self, stream: Option<ArgLoc>) -> ProbeCookie {
        ProbeCookie(self.0 | (loc(stream) << 40))
    }

    /// Where the stream argument is.
    #[inline(always)]
    pub const fn stream(self) -> Option<ArgLoc> {
        self.loc_at(40)
    }

    #[inline(always)]
    const fn loc_at(self, shift: u32) -> Option<ArgLoc> {
        match (self.0 >> shift) & 0xf {
            0 => None,
            n => ArgLoc::from_u8((n - 1) as u8),
        }
    }

    /// Where an NCCL call's element count is.
    #[inline(always)]
    pub const fn nccl_count(self) -> Option<ArgLoc> {
        self.loc_at(24)
    }

    /// Where an NCCL call's `ncclDataType_t` is.
    #[inline(always)]
    pub const fn nccl_datatype(self) -> Option<ArgLoc> {
        self.loc_at(28)
    }

    /// Where an NCCL call's `ncclComm_t` is.
    #[inline(always)]
    pub const fn nccl_comm(self) -> Option<ArgLoc> {
        self.loc_at(32)
    }

    #[inline(always)]
    pub const fn nccl_op(self) -> NcclOp {
        NcclOp::from_u8(((self.0 >> 36) & 0xf) as u8)
    }

    /// Where an ncclCommInit* call's `ncclUniqueId` is.
    #[inline(always)]
    pub const fn nccl_unique_id(self) -> Option<UniqueIdAt> {
        UniqueIdAt::decode(self.0 >> 44)
    }

    /// All NCCL argument locations at once.
    pub const fn nccl_args(self) -> NcclArgs {
        NcclArgs {
            count: self.nccl_count(),
            datatype: self.nccl_datatype(),
            comm: self.nccl_comm(),
            op: self.nccl_op(),
            unique_id: self.nccl_unique_id(),
        }
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
