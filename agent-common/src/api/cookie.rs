//! Where a call's arguments are ([`ArgLoc`]), and the attach cookie ([`ProbeCookie`]) that carries
//! an API's id and argument locations to the generic eBPF programs.

use super::{ApiId, MemEffect, NcclArgs, NcclOp, UniqueIdAt};
// Named in doc links only.
#[cfg(doc)]
use super::{ApiKind, ApiSpec};

/// Where an argument is at a function's first instruction (x86-64 System V): one of the six
/// integer argument registers, or a stack slot above the return address. A struct larger than
/// 16 bytes passed by value (NCCL's 128-byte `ncclUniqueId`) goes on the stack and takes no
/// register, so the integer arguments after it move up one register.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgLoc {
    Rdi = 0,
    Rsi = 1,
    Rdx = 2,
    Rcx = 3,
    R8 = 4,
    R9 = 5,
    /// The 7th integer argument: `[rsp + 8]` at entry.
    Stack1 = 6,
    /// The 8th integer argument: `[rsp + 16]` at entry.
    Stack2 = 7,
    /// The 9th integer argument: `[rsp + 24]` at entry.
    Stack3 = 8,
}

impl ArgLoc {
    pub const fn from_u8(v: u8) -> Option<ArgLoc> {
        match v {
            0 => Some(ArgLoc::Rdi),
            1 => Some(ArgLoc::Rsi),
            2 => Some(ArgLoc::Rdx),
            3 => Some(ArgLoc::Rcx),
            4 => Some(ArgLoc::R8),
            5 => Some(ArgLoc::R9),
            6 => Some(ArgLoc::Stack1),
            7 => Some(ArgLoc::Stack2),
            8 => Some(ArgLoc::Stack3),
            _ => None,
        }
    }

    /// The stack slot's offset from `rsp` at entry, for stack arguments.
    pub const fn stack_offset(self) -> Option<u64> {
        match self {
            ArgLoc::Stack1 => Some(8),
            ArgLoc::Stack2 => Some(16),
            ArgLoc::Stack3 => Some(24),
            _ => None,
        }
    }
}

/// An argument location in 4 cookie bits: `ArgLoc` + 1, 0 for none.
const fn loc(l: Option<ArgLoc>) -> u64 {
    match l {
        Some(l) => (l as u64 & 0xf) + 1,
        None => 0,
    }
}

/// The attach cookie of a probe: everything the generic eBPF program needs to know about the call it
/// sits on, so that one program serves a whole [`ApiKind`].
///
/// Bits 0..16: api id; 16..20: size argument index + 1 (0 = none); 20..24: [`MemEffect`].
/// NCCL ([`NcclArgs`], zero for the CUDA driver API): 24..28: count [`ArgLoc`] + 1 (0 = none);
/// 28..32: datatype `ArgLoc` + 1; 32..36: communicator `ArgLoc` + 1; 36..40: [`NcclOp`].
/// 40..44: the stream argument's `ArgLoc` + 1 (0 = none; [`ApiSpec::stream`]). 44..48: where an
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

    pub fn for_api(id: ApiId) -> Option<ProbeCookie> {
        id.spec().map(|s| {
            ProbeCookie::new(id.0, s.size_arg, s.effect)
                .with_nccl(s.nccl)
                .with_stream(s.stream)
        })
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
