//! The NCCL side of cuda-exercise: calls a `libnccl.so.2` (the real one from the
//! `nvidia-nccl-cu12` wheel) with NCCL 2.28's C signatures (nccl.h). Without a GPU communicator
//! creation fails and collectives get a NULL communicator, which NCCL rejects with
//! `ncclInvalidArgument` (4) before touching anything: every call is still made and counted.

use std::ffi::{c_int, c_void};

use agent_common::api::{APIS, ApiKind, NCCL_NUM_TYPES, nccl_datatype_size};

use crate::driver::Driver;

pub type NcclResult = c_int;
type Comm = *mut c_void;

/// `ncclUniqueId`: 128 bytes, passed by value (on the stack, as the SysV ABI passes structs larger
/// than 16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

/// Calls `$name` with signature `fn($t...) -> ncclResult_t`; `None` if not exported.
macro_rules! call {
    ($lib:expr, $name:expr, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {{
        match $lib.symbol($name) {
            None => None,
            Some(p) => {
                // SAFETY: `p` is the address of the exported function `$name` of an NCCL library,
                // whose C signature in nccl.h (NCCL 2.28) is the one given here.
                let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> NcclResult>(p) };
                // SAFETY: pointer arguments point to live memory of the type NCCL writes or reads
                // (out-pointers, a unique id), or are NULL where NCCL checks for NULL (buffers,
                // communicators, streams and configs: NCCL returns an error or uses defaults).
                Some(unsafe { f($($a),*) })
            }
        }
    }};
}

/// ncclGetVersion, if exported.
pub fn version(lib: &Driver) -> (Option<NcclResult>, c_int) {
    let mut v: c_int = 0;
    let r = call!(lib, "ncclGetVersion", fn(*mut c_int), &mut v);
    (r, v)
}

/// ncclGetUniqueId (works without a GPU in 2.28); zeros if it fails.
pub fn unique_id(lib: &Driver) -> (Option<NcclResult>, UniqueId) {
    let mut id = UniqueId { internal: [0; 128] };
    let r = call!(lib, "ncclGetUniqueId", fn(*mut UniqueId), &mut id);
    if r != Some(0) {
        id.internal = [0; 128];
    }
    (r, id)
}

/// The traced NCCL entry points, in table order.
pub fn traced() -> impl Iterator<Item = &'static str> {
    APIS.iter()
        .filter(|a| a.kind == ApiKind::Nccl)
        .map(|a| a.name)
}

/// One call's arguments: element count and datatype of calls that take them.
#[derive(Clone, Copy, Debug)]
pub struct Args {
    pub count: usize,
    pub datatype: c_int,
}

impl Args {
    /// `count x size(datatype)`, 0 for a datatype NCCL does not define.
    pub fn bytes(self) -> u64 {
        nccl_datatype_size(self.datatype as u32).map_or(0, |s| self.count as u64 * s)
    }

    /// The arguments of call `i` of the API at position `j` of [`traced`]: counts distinct per
    /// API and call, datatypes cycling through all of NCCL's.
    pub fn nth(j: usize, i: u64) -> Args {
        Args {
            count: 1000 * (j + 1) + i as usize,
            datatype: ((i as usize + j) % NCCL_NUM_TYPES as usize) as c_int,
        }
    }
}

/// What a call did: its result, and communicators it created (to destroy later).
pub struct Outcome {
    pub result: Option<NcclResult>,
    pub created: Vec<Comm>,
    /// Whether the call takes a count and datatype (bytes are counted).
    pub data: bool,
}

/// The most ranks `call_default` creates with ncclCommInitAll.
pub const MAX_RANKS: usize = 16;

/// Calls `name` once with harmless arguments: NULL buffers and streams, `comm` as the
/// communicator of collectives and point-to-point calls (NULL unless a test's fake NCCL made
/// one; destroy and abort always get NULL), `nranks` ranks (this process the last one; device
/// list NULL), `args` for count and datatype. `Err` for a name this program does not know.
pub fn call_default(
    lib: &Driver,
    name: &str,
    id: UniqueId,
    a: Args,
    nranks: usize,
    comm: Comm,
) -> Result<Outcome, String> {
    let null: *mut c_void = std::ptr::null_mut();
    let cnull: *const c_void = std::ptr::null();
    let nranks = nranks.clamp(1, MAX_RANKS);
    let (n_ranks, rank) = (nranks as c_int, nranks as c_int - 1);
    let mut out: Comm = std::ptr::null_mut();
    let mut outs: [Comm; MAX_RANKS] = [std::ptr::null_mut(); MAX_RANKS];
    let mut ids = [id];
    let (n, d) = (a.count, a.datatype);
    type P = *mut c_void;
    type C = *const c_void;
    let mut data = false;
    let r = match name {
        "ncclCommInitRank" => call!(
            lib,
            name,
            fn(*mut Comm, c_int, UniqueId, c_int),
            &mut out,
            n_ranks,
            id,
            rank
        ),
        "ncclCommInitRankConfig" => call!(
            lib,
            name,
            fn(*mut Comm, c_int, UniqueId, c_int, P),
            &mut out,
            n_ranks,
            id,
            rank,
            null
        ),
        "ncclCommInitAll" => call!(
            lib,
            name,
            fn(*mut Comm, c_int, *const c_int),
            outs.as_mut_ptr(),
            n_ranks,
            std::ptr::null()
        ),
        "ncclCommInitRankScalable" => call!(
            lib,
            name,
            fn(*mut Comm, c_int, c_int, c_int, *mut UniqueId, P),
            &mut out,
            n_ranks,
            rank,
            1,
            ids.as_mut_ptr(),
            null
        ),
        // Always NULL: the communicators this program made are destroyed at the end.
        "ncclCommDestroy" | "ncclCommAbort" => {
            call!(lib, name, fn(Comm), std::ptr::null_mut())
        }
        "ncclGroupStart" | "ncclGroupEnd" => call!(lib, name, fn()),
        _ => {
            data = true;
            match name {
                // (send, recv, count, datatype, op, comm, stream)
                "ncclAllReduce" | "ncclReduceScatter" => call!(
                    lib,
                    name,
                    fn(C, P, usize, c_int, c_int, Comm, P),
                    cnull,
                    null,
                    n,
                    d,
                    0,
                    comm,
                    null
                ),
                // (send, recv, count, datatype, comm, stream)
                "ncclAllGather" | "ncclAlltoAll" => call!(
                    lib,
                    name,
                    fn(C, P, usize, c_int, Comm, P),
                    cnull,
                    null,
                    n,
                    d,
                    comm,
                    null
                ),
                // (send, recv, count, datatype, root, comm, stream)
                "ncclBroadcast" | "ncclGather" | "ncclScatter" => call!(
                    lib,
                    name,
                    fn(C, P, usize, c_int, c_int, Comm, P),
                    cnull,
                    null,
                    n,
                    d,
                    0,
                    comm,
                    null
                ),
                // (send, recv, count, datatype, op, root, comm, stream): comm on the stack.
                "ncclReduce" => call!(
                    lib,
                    name,
                    fn(C, P, usize, c_int, c_int, c_int, Comm, P),
                    cnull,
                    null,
                    n,
                    d,
                    0,
                    0,
                    comm,
                    null
                ),
                // (buff, count, datatype, peer, comm, stream)
                "ncclSend" | "ncclRecv" => call!(
                    lib,
                    name,
                    fn(P, usize, c_int, c_int, Comm, P),
                    null,
                    n,
                    d,
                    0,
                    comm,
                    null
                ),
                other => return Err(format!("cuda-exercise does not know how to call {other}")),
            }
        }
    };
    let mut created = Vec::new();
    if r == Some(0) {
        created.extend(
            std::iter::once(out)
                .chain(outs[..nranks].iter().copied())
                .filter(|c| !c.is_null()),
        );
    }
    Ok(Outcome {
        result: r,
        created,
        data,
    })
}

/// `ncclCommInitRankConfig(&comm, nranks, id, rank, NULL)` (what PyTorch calls): the result and
/// the communicator (NULL unless it succeeded).
pub fn init_rank_config(
    lib: &Driver,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> (Option<NcclResult>, Comm) {
    let mut out: Comm = std::ptr::null_mut();
    let r = call!(
        lib,
        "ncclCommInitRankConfig",
        fn(*mut Comm, c_int, UniqueId, c_int, *mut c_void),
        &mut out,
        nranks,
        id,
        rank,
        std::ptr::null_mut()
    );
    if r != Some(0) {
        out = std::ptr::null_mut();
    }
    (r, out)
}

/// The unique id as 256 hex digits.
pub fn hex(id: &UniqueId) -> String {
    id.internal.iter().map(|b| format!("{b:02x}")).collect()
}

/// The unique id from [`hex`]'s form.
pub fn from_hex(text: &str) -> Result<UniqueId, String> {
    let t = text.trim();
    let mut id = UniqueId { internal: [0; 128] };
    if t.len() != 256 || !t.is_ascii() {
        return Err(format!(
            "expected 256 hex digits, got {} characters",
            t.len()
        ));
    }
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&t[2 * i..2 * i + 2], 16)
            .map_err(|e| format!("hex digits {}..{}: {e}", 2 * i, 2 * i + 2))?;
    }
    Ok(id)
}

/// ncclCommDestroy on a communicator this program created.
pub fn destroy(lib: &Driver, comm: *mut c_void) -> Option<NcclResult> {
    call!(lib, "ncclCommDestroy", fn(Comm), comm)
}
