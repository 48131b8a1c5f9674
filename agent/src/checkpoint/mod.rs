//! The driver's checkpoint API (`cuCheckpointProcess*`, CUDA 12.8, driver >= 550), called from
//! the agent on a GPU process by its pid: lock (the process's CUDA calls wait), checkpoint (its
//! device memory moves to host memory and is given back to the GPU), restore, unlock.
//!
//! Every call goes through [`CheckpointApi`]; the real one is [`DriverCheckpoint`], the host's
//! libcuda loaded with `dlopen`. [`freeze`] and [`thaw`] are the two sequences `vgpu-agent
//! freeze` and `thaw` run, written against the trait so that tests drive them with a fake.
//!
//! The agent never waits on a tenant without a bound: the lock waits for the process's calls in
//! flight only up to its timeout (the driver's own bound), and a freeze that cannot complete
//! unlocks the process again.

use std::{ffi::c_int, ffi::c_void, path::Path, time::Duration};

pub mod measure;
pub mod room;

/// `CUresult`.
type CuResult = c_int;

/// Why a checkpoint call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("loading {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("the driver has no {0} (the checkpoint API needs driver 550 or newer)")]
    Missing(&'static str),
    #[error("cuInit failed with CUDA error {0}")]
    Init(CuResult),
    #[error("{call} on pid {pid} failed with CUDA error {code} ({})", error_name(*.code))]
    Call {
        call: &'static str,
        pid: u32,
        code: CuResult,
    },
    #[error(
        "pid {pid} is not restored yet: it held {} on {gpu} and {} is free there (with {} to \
         spare); a restore that fails for lack of room leaves the process unrestorable \
         (driver 580, NVIDIA/cuda-checkpoint#44), so it waits, frozen, until the GPU has room",
        crate::units::bytes(*.need),
        crate::units::bytes(*.free),
        crate::units::bytes(room::MARGIN)
    )]
    NoRoom {
        pid: u32,
        gpu: String,
        need: u64,
        free: u64,
    },
    #[error("pid {pid} is {state:?}, not {expected}")]
    State {
        pid: u32,
        state: ProcessState,
        expected: &'static str,
    },
}

/// What the common codes mean.
fn error_name(code: CuResult) -> &'static str {
    match code {
        1 => "invalid value: no such CUDA process",
        2 => "out of memory",
        3 => "not initialized",
        401 => "illegal state",
        801 => "not supported",
        909 => "timeout",
        _ => "see cuda.h",
    }
}

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    Other(c_int),
}

impl ProcessState {
    fn from_raw(v: c_int) -> ProcessState {
        match v {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            v => ProcessState::Other(v),
        }
    }
}

/// The checkpoint API, one call per method.
pub trait CheckpointApi {
    /// `cuCheckpointProcessLock` with `timeout` (0: the driver waits without a limit).
    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CheckpointError>;
    fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError>;
    fn restore(&self, pid: u32) -> Result<(), CheckpointError>;
    fn unlock(&self, pid: u32) -> Result<(), CheckpointError>;
    fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError>;
}

/// An API behind a reference or an `Arc` is the API: the daemon lends the one it loaded once,
/// and its workers share it.
macro_rules! forward_checkpoint_api {
    ($($ptr:ty),*) => {$(
        impl<T: CheckpointApi + ?Sized> CheckpointApi for $ptr {
            fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CheckpointError> {
                (**self).lock(pid, timeout)
            }
            fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
                (**self).checkpoint(pid)
            }
            fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
                (**self).restore(pid)
            }
            fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
                (**self).unlock(pid)
            }
            fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
                (**self).state(pid)
            }
        }
    )*};
}

forward_checkpoint_api!(&T, std::sync::Arc<T>);

/// Freezes `pid`: lock (waiting at most `lock_timeout` for its calls in flight), then
/// checkpoint. A checkpoint that fails unlocks the process again, so that a failed freeze
/// leaves it running.
pub fn freeze(
    api: &impl CheckpointApi,
    pid: u32,
    lock_timeout: Duration,
) -> Result<(), CheckpointError> {
    api.lock(pid, lock_timeout)?;
    if let Err(e) = api.checkpoint(pid) {
        // The unlock's own failure adds nothing the first error does not say.
        let _ = api.unlock(pid);
        return Err(e);
    }
    Ok(())
}

/// Thaws `pid` from whatever step it is at: restore if checkpointed, then unlock; a running
/// process is left alone. A restore that fails leaves it checkpointed and locked, its memory
/// still held in host memory. Whether a later thaw can finish it is the driver's: after a restore
/// that failed for lack of room, driver 580 never restores the process again, which is why the
/// agent's API ([`room::RoomChecked`]) does not call the restore without room.
pub fn thaw(api: &impl CheckpointApi, pid: u32) -> Result<ProcessState, CheckpointError> {
    match api.state(pid)? {
        ProcessState::Running => return Ok(ProcessState::Running),
        ProcessState::Checkpointed => api.restore(pid)?,
        ProcessState::Locked => {}
        state => {
            return Err(CheckpointError::State {
                pid,
                state,
                expected: "checkpointed or locked",
            });
        }
    }
    api.unlock(pid)?;
    Ok(ProcessState::Running)
}

type LockFn = unsafe extern "C" fn(c_int, *mut LockArgs) -> CuResult;
type StepFn = unsafe extern "C" fn(c_int, *mut c_void) -> CuResult;
type StateFn = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type InitFn = unsafe extern "C" fn(u32) -> CuResult;

/// `CUcheckpointLockArgs`.
#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

/// The real API: the driver library, initialised.
pub struct DriverCheckpoint {
    lock: LockFn,
    checkpoint: StepFn,
    restore: StepFn,
    unlock: StepFn,
    state: StateFn,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
}

impl DriverCheckpoint {
    /// Loads the driver at `path` (`libcuda.so.1` finds the host's) and calls `cuInit`.
    pub fn open(path: &Path) -> Result<DriverCheckpoint, CheckpointError> {
        let load_error = |reason: String| CheckpointError::Load {
            path: path.display().to_string(),
            reason,
        };
        // SAFETY: loading the CUDA driver runs its initialisers, which is what using it means;
        // the agent loads no other library under this name.
        let library = unsafe { libloading::Library::new(path.as_os_str()) }
            .map_err(|e| load_error(e.to_string()))?;
        /// A function of the driver, by name and C signature.
        fn get<T: Copy>(
            lib: &libloading::Library,
            name: &'static str,
        ) -> Result<T, CheckpointError> {
            // SAFETY: `T` is the function type cuda.h (CUDA 12.8) declares for `name`; the
            // pointer stays valid while the library is loaded, which `DriverCheckpoint` keeps.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| CheckpointError::Missing(name))
        }
        let init: InitFn = get(&library, "cuInit")?;
        // SAFETY: cuInit(0) has no preconditions.
        let r = unsafe { init(0) };
        if r != 0 {
            return Err(CheckpointError::Init(r));
        }
        Ok(DriverCheckpoint {
            lock: get(&library, "cuCheckpointProcessLock")?,
            checkpoint: get(&library, "cuCheckpointProcessCheckpoint")?,
            restore: get(&library, "cuCheckpointProcessRestore")?,
            unlock: get(&library, "cuCheckpointProcessUnlock")?,
            state: get(&library, "cuCheckpointProcessGetState")?,
            _library: library,
        })
    }
}

/// A pid as the driver takes it (`int`); a pid past it names no process.
fn raw_pid(pid: u32, call: &'static str) -> Result<c_int, CheckpointError> {
    c_int::try_from(pid).map_err(|_| CheckpointError::Call { call, pid, code: 1 })
}

fn check(call: &'static str, pid: u32, code: CuResult) -> Result<(), CheckpointError> {
    if code == 0 {
        Ok(())
    } else {
        Err(CheckpointError::Call { call, pid, code })
    }
}

impl DriverCheckpoint {
    fn step(&self, f: StepFn, call: &'static str, pid: u32) -> Result<(), CheckpointError> {
        let raw = raw_pid(pid, call)?;
        // SAFETY: the driver's function with a pid and NULL arguments (the API allows NULL).
        check(call, pid, unsafe { f(raw, std::ptr::null_mut()) })
    }
}

impl CheckpointApi for DriverCheckpoint {
    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CheckpointError> {
        const CALL: &str = "cuCheckpointProcessLock";
        let raw = raw_pid(pid, CALL)?;
        let mut args = LockArgs {
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            reserved0: 0,
            reserved1: [0; 7],
        };
        // SAFETY: the driver's function with a pid and a live CUcheckpointLockArgs.
        check(CALL, pid, unsafe { (self.lock)(raw, &mut args) })
    }

    fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
        self.step(self.checkpoint, "cuCheckpointProcessCheckpoint", pid)
    }

    fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
        self.step(self.restore, "cuCheckpointProcessRestore", pid)
    }

    fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
        self.step(self.unlock, "cuCheckpointProcessUnlock", pid)
    }

    fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
        const CALL: &str = "cuCheckpointProcessGetState";
        let raw = raw_pid(pid, CALL)?;
        let mut state: c_int = -1;
        // SAFETY: the driver's function with a pid and a live out-pointer.
        check(CALL, pid, unsafe { (self.state)(raw, &mut state) })?;
        Ok(ProcessState::from_raw(state))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A fake driver: one process's state, the calls made, and calls that fail.
    #[derive(Default)]
    struct Fake {
        state: RefCell<Option<ProcessState>>,
        calls: RefCell<Vec<&'static str>>,
        failing: Vec<(&'static str, CuResult)>,
    }

    impl Fake {
        fn at(state: ProcessState) -> Fake {
            Fake {
                state: RefCell::new(Some(state)),
                ..Fake::default()
            }
        }

        fn call(
            &self,
            call: &'static str,
            pid: u32,
            from: ProcessState,
            to: ProcessState,
        ) -> Result<(), CheckpointError> {
            self.calls.borrow_mut().push(call);
            if let Some((_, code)) = self.failing.iter().find(|(c, _)| *c == call) {
                return Err(CheckpointError::Call {
                    call,
                    pid,
                    code: *code,
                });
            }
            let mut s = self.state.borrow_mut();
            if *s != Some(from) {
                return Err(CheckpointError::Call {
                    call,
                    pid,
                    code: 401,
                });
            }
            *s = Some(to);
            Ok(())
        }
    }

    impl CheckpointApi for Fake {
        fn lock(&self, pid: u32, _: Duration) -> Result<(), CheckpointError> {
            self.call("lock", pid, ProcessState::Running, ProcessState::Locked)
        }
        fn checkpoint(&self, pid: u32) -> Result<(), CheckpointError> {
            self.call(
                "checkpoint",
                pid,
                ProcessState::Locked,
                ProcessState::Checkpointed,
            )
        }
        fn restore(&self, pid: u32) -> Result<(), CheckpointError> {
            self.call(
                "restore",
                pid,
                ProcessState::Checkpointed,
                ProcessState::Locked,
            )
        }
        fn unlock(&self, pid: u32) -> Result<(), CheckpointError> {
            self.call("unlock", pid, ProcessState::Locked, ProcessState::Running)
        }
        fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
            self.state.borrow().ok_or(CheckpointError::Call {
                call: "state",
                pid,
                code: 1,
            })
        }
    }

    #[test]
    fn a_freeze_locks_then_checkpoints_and_a_thaw_restores_then_unlocks() {
        let f = Fake::at(ProcessState::Running);
        freeze(&f, 7, Duration::from_secs(10)).unwrap();
        assert_eq!(*f.state.borrow(), Some(ProcessState::Checkpointed));
        assert_eq!(thaw(&f, 7), Ok(ProcessState::Running));
        assert_eq!(
            *f.calls.borrow(),
            ["lock", "checkpoint", "restore", "unlock"]
        );
        // A running process is left alone.
        assert_eq!(thaw(&f, 7), Ok(ProcessState::Running));
        assert_eq!(f.calls.borrow().len(), 4);
    }

    #[test]
    fn a_failed_checkpoint_unlocks_the_process_again() {
        let f = Fake {
            failing: vec![("checkpoint", 2)],
            ..Fake::at(ProcessState::Running)
        };
        let e = freeze(&f, 7, Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
        assert_eq!(*f.state.borrow(), Some(ProcessState::Running));
        assert_eq!(*f.calls.borrow(), ["lock", "checkpoint", "unlock"]);
        // A lock that times out leaves nothing to undo.
        let f = Fake {
            failing: vec![("lock", 909)],
            ..Fake::at(ProcessState::Running)
        };
        let e = freeze(&f, 7, Duration::from_millis(1)).unwrap_err();
        assert!(e.to_string().contains("timeout"), "{e}");
        assert_eq!(*f.calls.borrow(), ["lock"]);
    }

    #[test]
    fn a_thaw_without_room_stays_checkpointed_and_a_later_thaw_finishes() {
        let mut f = Fake {
            failing: vec![("restore", 2)],
            ..Fake::at(ProcessState::Checkpointed)
        };
        assert!(thaw(&f, 7).is_err());
        assert_eq!(*f.state.borrow(), Some(ProcessState::Checkpointed));
        f.failing.clear();
        assert_eq!(thaw(&f, 7), Ok(ProcessState::Running));
        // A process left locked (a thaw interrupted after its restore) is unlocked.
        let f = Fake::at(ProcessState::Locked);
        assert_eq!(thaw(&f, 7), Ok(ProcessState::Running));
        assert_eq!(*f.calls.borrow(), ["unlock"]);
        // A failed process is reported, not touched.
        let f = Fake::at(ProcessState::Failed);
        assert!(matches!(thaw(&f, 7), Err(CheckpointError::State { .. })));
        assert!(f.calls.borrow().is_empty());
    }

    #[test]
    fn a_driver_without_the_checkpoint_api_is_named() {
        let e = DriverCheckpoint::open(Path::new("/nonexistent/libcuda.so.1"))
            .err()
            .unwrap();
        assert!(matches!(e, CheckpointError::Load { .. }), "{e}");
        assert_eq!(
            CheckpointError::Missing("cuCheckpointProcessLock").to_string(),
            "the driver has no cuCheckpointProcessLock (the checkpoint API needs driver 550 or newer)"
        );
    }
}
