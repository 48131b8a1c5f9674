//! Signalling processes.

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
