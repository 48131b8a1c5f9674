//! Process identity, the process-lifetime handlers (from the C library) and a thread's early
//! wake-up ([`Waker`]).

use std::sync::atomic::{AtomicPtr, Ordering};

/// The calling process's id (as its own pid namespace sees it).
pub(crate) fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Registers `child` to run in the child after `fork()` and `exit` at normal process exit.
/// Both must live as long as the process (this library is preloaded and never unloaded) and never
/// unwind. Returns which registrations failed, as `(fork, exit)`.
pub(crate) fn register_lifetime_handlers(
    child: extern "C" fn(),
    exit: extern "C" fn(),
) -> (bool, bool) {
    // SAFETY: both handlers are `extern "C" fn()` that the caller guarantees live as long as the
    // process and never unwind.
    unsafe {
        (
            libc::pthread_atfork(None, None, Some(child)) != 0,
            libc::atexit(exit) != 0,
        )
    }
}

/// A thread that others wake early from its timed sleeps (`std::thread::park_timeout`): the
/// thread registers itself, any thread wakes it. Waking costs an atomic swap, and a `futex` wake
/// only while the thread is parked.
#[derive(Debug)]
pub(crate) struct Waker(AtomicPtr<std::thread::Thread>);

impl Waker {
    pub(crate) const fn new() -> Waker {
        Waker(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// The calling thread is the one woken from now on. The handle of the thread registered
    /// before (a forked parent's, which does not exist in the child) is leaked, not freed: a
    /// waker in another thread may be reading it.
    pub(crate) fn register_current(&self) {
        let handle = Box::into_raw(Box::new(std::thread::current()));
        // Release: pairs with the Acquire in `wake`; the handle is fully built before it is seen.
        self.0.store(handle, Ordering::Release);
    }

    /// Wakes the registered thread (nothing before one registers).
    pub(crate) fn wake(&self) {
        // Acquire: pairs with the Release in `register_current`.
        let handle = self.0.load(Ordering::Acquire);
        // SAFETY: non-null pointers here come from `Box::into_raw` in `register_current` and are
        // never freed, so the reference is valid for the life of the process.
        if let Some(thread) = unsafe { handle.as_ref() } {
            thread.unpark();
        }
    }
}
