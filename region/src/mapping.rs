//! RAII wrapper around a `MAP_SHARED` file mapping.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A shared mapping of the first `len` bytes of a file, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes; every access to it goes
// through atomics (the layout types contain only atomics), so sharing the pointer between threads
// adds no data race that other processes could not already cause.
unsafe impl Send for Mapping {}
// SAFETY: as above: only atomic accesses are made through `&Mapping`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, read-write or read-only.
    pub(crate) fn new(file: &File, len: usize, writable: bool) -> std::io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping (null hint) of a valid open fd; the kernel checks `len`, `prot`
        // against the fd's access mode, and the result is checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // To be paranoid, and so we never need to talk about a null pointer, check it anyway.
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap null"))?;
        Ok(Mapping { ptr, len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The mapped addresses, `start..end`.
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        let start = self.ptr.as_ptr() as usize;
        start..start + self.len
    }

    /// A reference to a `T` at `offset`, or `None` if it does not fit or is misaligned.
    /// `T` must be a layout type (all atomics, valid for any bit pattern).
    #[inline(always)]
    pub(crate) fn get<T: crate::layout_types::RegionPod>(&self, offset: usize) -> Option<&T> {
        let end = offset.checked_add(size_of::<T>())?;
        if end > self.len || !offset.is_multiple_of(align_of::<T>()) {
            return None;
        }
        // SAFETY: `offset..end` lies inside the mapping (checked above) and is aligned for `T`
        // (the mapping is page aligned and `offset` is a multiple of `T`'s alignment). `T` is a
        // `RegionPod`: made of atomics only, valid for every bit pattern, and only ever accessed
        // atomically, so concurrent writes by other processes are not data races. The reference
        // lives no longer than `&self`, i.e. the mapping.
        Some(unsafe { &*self.ptr.as_ptr().add(offset).cast::<T>() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping created in `new` that nothing else unmaps;
        // references into it borrow `self` and so are gone by now.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
