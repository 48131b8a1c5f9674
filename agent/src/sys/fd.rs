//! Waiting on descriptors.

use std::{os::fd::RawFd, time::Duration};

/// Waits until `fd` is readable or `timeout` passes (an error or an interrupt returns early:
/// callers poll in a loop). `fd` must stay open for the call, as the caller's owner of it does.
pub fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd, for a descriptor the caller keeps open.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
