//! Typed wrappers of the driver's checkpoint API (`cuCheckpointProcess*`, CUDA 12.8), called on
//! another process by its pid.

use std::ffi::{c_int, c_void};

use super::{CUresult, Driver};

/// `CUcheckpointLockArgs`.
#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

impl Driver {
    /// `cuCheckpointProcessLock`: waits up to `timeout_ms` (0: no limit) for the process's calls
    /// in flight, then blocks its CUDA calls.
    pub fn checkpoint_lock(&self, pid: i32, timeout_ms: u32) -> Option<CUresult> {
        let mut args = LockArgs {
            timeout_ms,
            reserved0: 0,
            reserved1: [0; 7],
        };
        call!(
            self,
            "cuCheckpointProcessLock",
            fn(c_int, *mut LockArgs),
            pid,
            &mut args
        )
    }

    /// `cuCheckpointProcessCheckpoint`, `cuCheckpointProcessRestore` or
    /// `cuCheckpointProcessUnlock` (`name`), with no arguments.
    pub fn checkpoint_step(&self, name: &str, pid: i32) -> Option<CUresult> {
        call!(
            self,
            name,
            fn(c_int, *mut c_void),
            pid,
            std::ptr::null_mut()
        )
    }

    /// `cuCheckpointProcessGetState`: result and `CUprocessState`.
    pub fn checkpoint_state(&self, pid: i32) -> (Option<CUresult>, c_int) {
        let mut state: c_int = -1;
        (
            call!(
                self,
                "cuCheckpointProcessGetState",
                fn(c_int, *mut c_int),
                pid,
                &mut state
            ),
            state,
        )
    }
}
