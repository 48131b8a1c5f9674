//! A tmpfs of the agent's own in transparent huge pages, mounted nowhere, and unnamed files in it
//! (the freeze pool's chunks): made with the mount API (`fsopen`, `fsconfig`, `fsmount`), so no
//! path anyone could reach names it, and `O_TMPFILE`, so no name in it does either.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

#[cfg(test)]
use rustix::mm::{MapFlags, ProtFlags};
use rustix::{
    fs::{FallocateFlags, Mode, OFlags},
    mount::{FsMountFlags, FsOpenFlags, MountAttrFlags},
};

/// Which step of making the tmpfs failed, and how.
#[derive(Debug)]
pub struct MountError {
    pub step: &'static str,
    pub source: std::io::Error,
}

/// A new tmpfs in transparent huge pages (`huge=always`), mounted nowhere: the descriptor of its
/// root. No size or inode limit of its own (`size=0`, `nr_inodes=0`): what the agent allocates
/// there is bounded by its own books, and what a process given one of its files writes into it
/// is charged to that process's memory cgroup. Root directory `0700`; no set-uid, devices or
/// execution. Needs `CAP_SYS_ADMIN` (Linux 5.2 or newer, with transparent huge pages).
pub fn huge_tmpfs() -> Result<OwnedFd, MountError> {
    let step = |step: &'static str| {
        move |e: rustix::io::Errno| MountError {
            step,
            source: e.into(),
        }
    };
    let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(step("fsopen"))?;
    for (key, value) in [
        ("huge", "always"),
        ("size", "0"),
        ("nr_inodes", "0"),
        ("mode", "0700"),
    ] {
        rustix::mount::fsconfig_set_string(&fs, key, value).map_err(match key {
            "huge" => step("fsconfig huge=always"),
            "size" => step("fsconfig size=0"),
            "nr_inodes" => step("fsconfig nr_inodes=0"),
            _ => step("fsconfig mode=0700"),
        })?;
    }
    rustix::mount::fsconfig_create(&fs).map_err(step("fsconfig create"))?;
    rustix::mount::fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .map_err(step("fsmount"))
}

/// A new unnamed file (`O_TMPFILE`, mode `0600`) in the tmpfs whose root is `mount`, open for
/// reading and writing (close-on-exec).
pub fn unnamed_file(mount: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        mount,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?)
}

/// Allocates `len` bytes of `file` from 0 (`fallocate`, mode 0): its pages exist from now (in
/// huge pages on a `huge=always` tmpfs), charged to the caller's memory cgroup, but a tmpfs
/// zeroes them only at their first use ([`write_zeros`]).
pub fn allocate(file: BorrowedFd<'_>, len: u64) -> std::io::Result<()> {
    Ok(rustix::fs::fallocate(
        file,
        FallocateFlags::empty(),
        0,
        len,
    )?)
}

/// Writes zeros over the first `len` bytes of `file` from `zeros` (a buffer of zeros), which
/// makes a tmpfs take the pages [`allocate`] left for their first use as written: zeroed now, not
/// at that use. Through the file, not a mapping of it: the agent's address space (and its lock,
/// which every other thread's mapping and fault needs) is not held while it runs.
pub fn write_zeros(file: BorrowedFd<'_>, len: u64, zeros: &[u8]) -> std::io::Result<()> {
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from(len - at)
            .unwrap_or(usize::MAX)
            .min(zeros.len());
        match rustix::io::pwrite(file, &zeros[..n], at) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => at += written as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Frees every page of the first `len` bytes of `file` (`fallocate` punching a hole, its size
/// kept): also the pages other processes map or hold the file for (their mappings then fault
/// in new pages, charged to them), except pages pinned by a driver, which stay until it unpins
/// them.
pub fn punch(file: BorrowedFd<'_>, len: u64) -> std::io::Result<()> {
    Ok(rustix::fs::fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        0,
        len,
    )?)
}

/// The bytes of `file` that have pages now (`st_blocks`, in 512-byte units) and its size.
pub fn allocated(file: impl AsFd) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(file)?;
    // `st_blocks` is signed on some targets; a file never has negative blocks or size.
    #[allow(clippy::unnecessary_cast)]
    Ok(((st.st_blocks as u64) * 512, st.st_size as u64))
}

/// Holds a reference to one page in each 2 MiB of the first `len` bytes of `file` in pipes
/// (`vmsplice` from a shared mapping, unmapped before it returns), as a borrower can: the pages
/// stay allocated while the pipes are open, whatever is done to the file. The pipes (read and
/// write ends).
#[cfg(test)]
pub fn pin_in_pipes(file: BorrowedFd<'_>, len: usize) -> std::io::Result<Vec<(OwnedFd, OwnedFd)>> {
    use std::os::fd::{AsRawFd, FromRawFd};
    const STEP: usize = 2 << 20;
    // A pipe holds 16 buffers by default.
    const PER_PIPE: usize = 16;
    // SAFETY: a new shared read-only mapping at an address the kernel chooses, unmapped below.
    let at = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ,
            MapFlags::SHARED,
            file,
            0,
        )
    }?;
    let mut pipes = Vec::new();
    let mut outcome = Ok(());
    for (i, offset) in (0..len).step_by(STEP).enumerate() {
        if i % PER_PIPE == 0 {
            let mut fds = [0; 2];
            // SAFETY: pipe2 writes two descriptors into the array it is given.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                outcome = Err(std::io::Error::last_os_error());
                break;
            }
            // SAFETY: two new descriptors that nothing else owns.
            pipes.push(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) });
        }
        let iov = libc::iovec {
            // SAFETY: `offset` is within the mapping made above.
            iov_base: unsafe { at.cast::<u8>().add(offset) }.cast(),
            iov_len: 4096,
        };
        let write_end = pipes.last().map(|p| p.1.as_raw_fd()).unwrap_or(-1);
        // SAFETY: one iovec naming a page of the live mapping; the kernel takes a reference to
        // the page, which outlives the mapping.
        if unsafe { libc::vmsplice(write_end, &iov, 1, 0) } < 0 {
            outcome = Err(std::io::Error::last_os_error());
            break;
        }
    }
    // SAFETY: the mapping made above, unmapped once; no reference into it exists.
    unsafe { rustix::mm::munmap(at, len) }?;
    outcome.map(|()| pipes)
}
