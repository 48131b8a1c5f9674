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

/// The pid of the process that connected `stream` (`SO_PEERCRED`, as the kernel recorded it at
/// `connect`, in this process's pid namespace); `None` when the kernel cannot name it here (0:
/// a process of a pid namespace this one does not see). libc, not rustix: rustix's `UCred` holds
/// a non-zero pid, which the kernel's 0 would break.
pub fn peer_pid(stream: &UnixStream) -> std::io::Result<Option<u32>> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes, and the descriptor is open for the
    // lifetime of `stream`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u32::try_from(cred.pid).ok().filter(|p| *p > 0))
}

/// Sends `bytes` on `stream` with `fds` (`SCM_RIGHTS`) in one `sendmsg`, without waiting for
/// room (`MSG_DONTWAIT`) and without `SIGPIPE`; the bytes sent.
pub fn send_with_fds(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let message = SendAncillaryMessage::ScmRights(fds);
    let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); message.size()];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(message) {
        return Err(std::io::Error::other("no room for the descriptors"));
    }
    Ok(rustix::net::sendmsg(
        stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
    )?)
}

/// Receives up to `buf.len()` bytes from `stream` with at most `max_fds` descriptors
/// (`SCM_RIGHTS`, close-on-exec): the bytes read and the descriptors. Descriptors that did not
/// fit are an error (`MSG_CTRUNC`: the kernel closed them).
#[cfg(test)]
pub fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
    let mut space =
        vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream,
        &mut [std::io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.flags.contains(ReturnFlags::CTRUNC) {
        return Err(std::io::Error::other("descriptors cut (MSG_CTRUNC)"));
    }
    Ok((got.bytes, fds))
}
