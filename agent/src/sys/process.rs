//! Signalling processes.

use std::sync::OnceLock;

/// The handler [`on_stop_signals`] installed.
static STOP_HANDLER: OnceLock<fn()> = OnceLock::new();

extern "C" fn stop_trampoline(_: libc::c_int) {
    if let Some(handler) = STOP_HANDLER.get() {
        handler();
    }
}

/// Calls `handler` on SIGINT and SIGTERM instead of letting them end the process. `handler`
/// runs in signal context: it may only do async-signal-safe things (store to an atomic). The
/// first handler installed stays.
pub fn on_stop_signals(handler: fn()) {
    let _ = STOP_HANDLER.set(handler);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the trampoline only reads an initialised OnceLock (a load) and calls a handler
        // that its contract limits to async-signal-safe work.
        unsafe { libc::signal(sig, stop_trampoline as *const () as libc::sighandler_t) };
    }
}

/// The signals the agent sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

/// Sends `signal` to host pid `pid`. The caller checks that the pid still names the process it
/// means (pids are reused).
pub fn send_signal(pid: u32, signal: Signal) -> std::io::Result<()> {
    let sig = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The CPU this thread runs on now (`None`: the kernel does not say).
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// Lowers the calling thread's scheduling priority to the lowest (nice 19), so that its work
/// (the freeze pool's populating) yields the CPU to everything else on the host.
pub fn lowest_priority_for_this_thread() -> std::io::Result<()> {
    // On Linux `PRIO_PROCESS` of a thread id is that thread alone.
    Ok(rustix::process::setpriority_process(
        Some(rustix::thread::gettid()),
        19,
    )?)
}
