//! The driver's checkpoint API (`cuCheckpointProcess*`, CUDA 12.8, driver >= 550), between
//! processes that share a device (`SIMCUDA_SHARED_DEVICE`): a second process locks, checkpoints,
//! restores and unlocks a process by its pid, as the driver lets a checkpointing tool do.
//!
//! The request travels through the target's mailbox in the shared device file (`shared.rs`): the
//! caller writes a request and waits for the answer; a thread of the target (`simcuda-ckpt`,
//! started at its `cuInit`, polling every 2 ms) carries it out:
//!
//! - lock: closes the target's call gate (every entry point then waits before its own work, as
//!   the driver blocks a locked process's CUDA calls) and waits for the calls in flight to
//!   return, up to the lock's `timeoutMs` (0: 60 s); past it the gate reopens and the answer is
//!   `CUDA_ERROR_TIMEOUT`.
//! - checkpoint (locked): the device memory the target holds is given back to the shared device
//!   and its content kept in host memory.
//! - restore (checkpointed): the memory is charged again (all or none: `CUDA_ERROR_OUT_OF_MEMORY`
//!   and still checkpointed if the device has no room) and the content is back, byte for byte.
//! - unlock (locked): the gate opens; waiting calls proceed.
//!
//! A request out of order answers `CUDA_ERROR_ILLEGAL_STATE`; an unknown pid, a pid that dies
//! while the caller waits, or the caller's own pid `CUDA_ERROR_INVALID_VALUE`; without a shared
//! device `CUDA_ERROR_NOT_SUPPORTED`. One checkpointing process at a time per target.

use crate::put;
use crate::runtime::{Sym, close_gate, enable_gate, open_gate};
use crate::shared::{self, Mailbox};
use crate::state::state;
use crate::types::*;
use std::ffi::{c_int, c_void};
use std::sync::Once;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const OP_LOCK: u64 = 1;
const OP_CHECKPOINT: u64 = 2;
const OP_RESTORE: u64 = 3;
const OP_UNLOCK: u64 = 4;

/// How often the target's thread looks at its mailbox, and the caller at the answer.
const POLL: Duration = Duration::from_millis(2);
/// The lock's wait when `timeoutMs` is 0, and any other request's.
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Starts the target side in this process (at `cuInit`), if it shares a device.
pub fn start() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let Some(mailbox) = shared::device().and_then(|d| d.own_mailbox()) else {
            return;
        };
        enable_gate();
        let spawned = std::thread::Builder::new()
            .name("simcuda-ckpt".into())
            .spawn(move || serve(mailbox));
        if let Err(e) = spawned {
            eprintln!("simcuda: warning: no checkpoint thread: {e}");
        }
    });
}

/// The target's thread: answers each new request in its mailbox.
fn serve(m: Mailbox) {
    let mut last = 0;
    loop {
        std::thread::sleep(POLL);
        // Acquire: pairs with the caller's Release store of the request.
        let r = m.request.load(Ordering::Acquire);
        let seq = r >> 40;
        if seq == last {
            continue;
        }
        last = seq;
        let timeout_ms = (r >> 8) & 0xffff_ffff;
        let result = carry_out(r & 0xff, timeout_ms, &m);
        // Release: the state (stored first) and the memory given back are visible to whoever
        // sees the answer.
        m.answer
            .store(seq << 32 | u64::from(result as u32), Ordering::Release);
    }
}

fn carry_out(op: u64, timeout_ms: u64, m: &Mailbox) -> CUresult {
    let current = m.state.load(Ordering::Acquire);
    let (from, to) = match op {
        OP_LOCK => (CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED),
        OP_CHECKPOINT => (CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED),
        OP_RESTORE => (CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED),
        OP_UNLOCK => (CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING),
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    if current != from {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    match op {
        OP_LOCK => {
            let wait = match timeout_ms {
                0 => DEFAULT_WAIT,
                ms => Duration::from_millis(ms),
            };
            if !close_gate(wait) {
                return CUDA_ERROR_TIMEOUT;
            }
        }
        OP_CHECKPOINT => {
            state().checkpoint();
        }
        OP_RESTORE => {
            if let Err(e) = state().restore() {
                return e;
            }
        }
        _ => open_gate(),
    }
    // Release: pairs with the Acquire loads of `cuCheckpointProcessGetState` and `carry_out`.
    m.state.store(to, Ordering::Release);
    CUDA_SUCCESS
}

/// The caller's side: posts `op` to `pid`'s mailbox and waits for the answer.
fn request(pid: c_int, op: u64, timeout_ms: u32) -> CUresult {
    let Some(device) = shared::device() else {
        return CUDA_ERROR_NOT_SUPPORTED;
    };
    let Ok(pid) = u32::try_from(pid) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if pid == std::process::id() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(m) = device.mailbox(pid) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let seq = ((m.request.load(Ordering::Acquire) >> 40) + 1) & 0xff_ffff;
    // Release: pairs with the target's Acquire load in `serve`.
    m.request.store(
        seq << 40 | u64::from(timeout_ms) << 8 | op,
        Ordering::Release,
    );
    let wait = Duration::from_millis(u64::from(timeout_ms)) + DEFAULT_WAIT;
    let deadline = Instant::now() + wait;
    loop {
        // Acquire: pairs with the target's Release store of the answer.
        let a = m.answer.load(Ordering::Acquire);
        if a >> 32 == seq {
            return a as u32 as CUresult;
        }
        if !shared::process_alive(u64::from(pid)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if Instant::now() >= deadline {
            return CUDA_ERROR_TIMEOUT;
        }
        std::thread::sleep(POLL);
    }
}

exports! {
    // ---- Checkpoints (called by a second process with the target's pid).
    fn cuCheckpointProcessGetState(pid: c_int, out_state: *mut c_int) {
        let Some(m) = u32::try_from(pid)
            .ok()
            .and_then(|p| shared::device().and_then(|d| d.mailbox(p)))
        else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // Acquire: pairs with the Release store in `carry_out`.
        out!(out_state, m.state.load(Ordering::Acquire) as c_int);
        CUDA_SUCCESS
    }
    fn cuCheckpointProcessLock(pid: c_int, args: *mut CUcheckpointLockArgs) {
        // SAFETY: NULL or the caller's arguments, per the API.
        let timeout_ms = unsafe { args.as_ref() }.map_or(0, |a| a.timeout_ms);
        request(pid, OP_LOCK, timeout_ms)
    }
    fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut c_void) {
        request(pid, OP_CHECKPOINT, 0)
    }
    fn cuCheckpointProcessRestore(pid: c_int, args: *mut c_void) {
        request(pid, OP_RESTORE, 0)
    }
    fn cuCheckpointProcessUnlock(pid: c_int, args: *mut c_void) {
        request(pid, OP_UNLOCK, 0)
    }
}
