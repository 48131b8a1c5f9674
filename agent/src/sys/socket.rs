//! Unix stream sockets created and connected in steps (std's `UnixStream::connect` allows no
//! socket option before `connect`).

use std::{
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    path::Path,
};

/// A new, unconnected Unix stream socket (close-on-exec).
pub fn unix_stream() -> std::io::Result<UnixStream> {
    // SAFETY: `socket(2)` with constant arguments has no memory-safety preconditions; the
    // result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a valid descriptor that nothing else owns; `OwnedFd` closes it on every
    // path from here.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `connect(2)` of an already created Unix stream socket to the socket file at `path`.
pub fn connect_unix(stream: &UnixStream, path: &Path) -> std::io::Result<()> {
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: `sockaddr_un` is plain old data; all-zero is a valid value.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= sun.sun_path.len() {
        return Err(std::io::Error::other("socket path too long"));
    }
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in sun.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    loop {
        // SAFETY: `sun` is an initialised `sockaddr_un` whose path is NUL-terminated within
        // `len` bytes, and the descriptor is open for the lifetime of `stream`.
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                (&raw const sun).cast::<libc::sockaddr>(),
                len,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
