//! What the probes know of a call's arguments: where each is at the call's first instruction
//! ([`ArgLoc`]), and what the call does to live device memory through them ([`MemEffect`]).

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
