//! Process resource limits.

/// Raises the soft limit of open files to the hard limit, at most `cap`. Returns the error of
/// the raise if it failed (nothing to do, or an unreadable limit, is `Ok`).
pub fn raise_open_files(cap: u64) -> std::io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Ok(());
    }
    let want = lim.rlim_max.min(cap);
    if lim.rlim_cur < want {
        lim.rlim_cur = want;
        // SAFETY: setrlimit reads the struct we pass; a soft limit up to the hard one is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
