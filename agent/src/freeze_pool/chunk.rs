//! The pool's memory: chunks of [`CHUNK_BYTES`], each an unnamed file of the agent's own tmpfs in
//! transparent huge pages, mounted nowhere (`sys::tmpfs`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use region::freeze_pool::CHUNK_BYTES;

use super::error::FreezePoolError;
use crate::sys::tmpfs;

/// The tmpfs the chunks are files of: the descriptor of its root (the mount lives as long as it
/// or a file of it is open anywhere).
pub(super) struct Tmpfs(OwnedFd);

impl Tmpfs {
    /// Makes the tmpfs, and one file in it to show that files can be made there.
    pub fn new() -> Result<Tmpfs, FreezePoolError> {
        let root = tmpfs::huge_tmpfs().map_err(|e| FreezePoolError::Tmpfs {
            step: e.step,
            source: e.source,
        })?;
        tmpfs::unnamed_file(root.as_fd()).map_err(|source| FreezePoolError::Tmpfs {
            step: "openat O_TMPFILE",
            source,
        })?;
        Ok(Tmpfs(root))
    }

    /// Files made in the directory `dir` instead (an unprivileged test's pool of no chunks).
    #[cfg(test)]
    pub fn in_dir(dir: &std::path::Path) -> Tmpfs {
        Tmpfs(std::fs::File::open(dir).unwrap().into())
    }

    /// A new chunk, populated: [`CHUNK_BYTES`] allocated (charged to the agent's memory cgroup)
    /// and written with zeros from `zeros`, so that a tmpfs has zeroed its pages (`fallocate`
    /// alone leaves that to their first use: the freezing process's).
    pub fn chunk(&self, zeros: &[u8]) -> std::io::Result<Chunk> {
        let file = tmpfs::unnamed_file(self.0.as_fd())?;
        tmpfs::allocate(file.as_fd(), CHUNK_BYTES)?;
        tmpfs::write_zeros(file.as_fd(), CHUNK_BYTES, zeros)?;
        let (allocated, _) = tmpfs::allocated(file.as_fd())?;
        if allocated < CHUNK_BYTES {
            return Err(std::io::Error::other(format!(
                "{allocated} of its {CHUNK_BYTES} bytes have pages"
            )));
        }
        Ok(Chunk(file))
    }
}

/// One chunk: a file of [`CHUNK_BYTES`] whose pages exist, lent at most once.
#[derive(Debug)]
pub struct Chunk(OwnedFd);

impl Chunk {
    /// The descriptor to send with a loan.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Takes the chunk's pages back: a hole punched through the whole file, then the agent's
    /// descriptor closed. A process that kept a descriptor (or a mapping) of it sees a file of
    /// the same size without pages: what it writes there again is its own (charged to its memory
    /// cgroup).
    pub fn take_back(self) -> std::io::Result<()> {
        tmpfs::punch(self.0.as_fd(), CHUNK_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testing::privileged_tmpfs, *};

    /// A chunk has pages for all of its bytes before it is lent; taking it back frees them all,
    /// also when a borrower kept a descriptor of it (and the file keeps its size for it).
    #[test]
    fn a_chunk_is_populated_whole_and_its_pages_freed_when_taken_back_though_a_copy_is_kept() {
        let Some(tmpfs) = privileged_tmpfs() else {
            return;
        };
        let chunk = tmpfs.chunk(&vec![0; 2 << 20]).unwrap();
        let kept = chunk.fd().try_clone_to_owned().unwrap();
        assert_eq!(tmpfs::allocated(&kept).unwrap(), (CHUNK_BYTES, CHUNK_BYTES));
        chunk.take_back().unwrap();
        assert_eq!(tmpfs::allocated(&kept).unwrap(), (0, CHUNK_BYTES));
    }
}
