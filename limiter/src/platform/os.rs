//! Process identity and the process-lifetime handlers, from the C library.

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
