//! Host memory for what the in-process freeze saves: anonymous memory in transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`), populated by several threads at once
//! (`madvise(MADV_POPULATE_WRITE)` on slices, or a write per page on kernels before 5.14), then
//! registered with the driver (`cuMemHostRegister`: pinned, so the copies run at the link's
//! speed).
//!
//! Why not `cuMemHostAlloc`: getting the pages is what a freeze waits for, not the copy. On an
//! H200 host (driver 580, `scripts/gpu/host_link_costs.py`, 16 GiB) one `cuMemHostAlloc` took
//! 6.8-8.2 s; huge pages populated by 8 threads and registered took 3.5 s (3.1 s populate,
//! 0.4 s register), and the copy 0.31 s. Huge pages cut the page faults 512-fold; the threads
//! share the zeroing.

use std::ffi::c_void;

use super::{
    cuda::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUcontext, CUresult},
    driver::{Driver, sym},
};

/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
const CU_MEMHOSTREGISTER_PORTABLE: u32 = 1;
/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: i32 = 23;
/// Transparent huge page size on x86-64 and the alignment asked of the mapping.
const HUGE_PAGE: usize = 2 << 20;
/// The most threads that populate one buffer.
const POPULATE_THREADS: usize = 8;
/// The slices in which the pages are given back (see `HostBuffer::unmap`).
const RELEASE_SLICE: usize = 64 << 20;
/// Below this, one thread populates (threads cost more than they share).
const THREADED_FROM: usize = 256 << 20;

/// Why host memory could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostMemoryError {
    #[error("mmap of {bytes} bytes failed (errno {errno})")]
    Map { bytes: u64, errno: i32 },
    #[error("populating {bytes} bytes failed (errno {errno})")]
    Populate { bytes: u64, errno: i32 },
    #[error("cuMemHostRegister of {bytes} bytes failed with CUDA error {code}")]
    Register { bytes: u64, code: CUresult },
}

/// Pinned host memory of `len` bytes, unregistered and unmapped by [`HostBuffer::release`].
#[derive(Debug)]
pub(crate) struct HostBuffer {
    /// The context it is registered in (the driver registers and unregisters host memory in
    /// the calling thread's current context: `CUDA_ERROR_INVALID_CONTEXT` without one).
    context: usize,
    /// The mapping (one huge page longer than asked, for the alignment).
    raw: *mut c_void,
    raw_len: usize,
    /// The registered, huge-page aligned start.
    base: *mut c_void,
    len: usize,
}

// SAFETY: the buffer is memory this process mapped and nothing else refers to; whoever holds the
// `HostBuffer` owns it, on any thread.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// Maps, populates and registers `len` bytes in context `context`.
    pub(crate) fn new(
        driver: &Driver,
        context: CUcontext,
        len: u64,
    ) -> Result<HostBuffer, HostMemoryError> {
        let bytes = len;
        let len = usize::try_from(len).map_err(|_| HostMemoryError::Map { bytes, errno: 0 })?;
        let raw_len = len
            .checked_add(HUGE_PAGE)
            .ok_or(HostMemoryError::Map { bytes, errno: 0 })?;
        // SAFETY: an anonymous private mapping at an address the kernel chooses.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(HostMemoryError::Map {
                bytes,
                errno: errno(),
            });
        }
        let base = (raw as usize).next_multiple_of(HUGE_PAGE) as *mut c_void;
        let mut buf = HostBuffer {
            context: context as usize,
            raw,
            raw_len,
            base,
            len,
        };
        // SAFETY: inside the mapping just made. Without transparent huge pages (`never`) the
        // advice fails and the pages stay small: slower, not wrong.
        unsafe { libc::madvise(base, len, libc::MADV_HUGEPAGE) };
        if let Err(errno) = buf.populate() {
            buf.unmap();
            return Err(HostMemoryError::Populate { bytes, errno });
        }
        let registered = driver.with_context(context, || {
            let register = driver
                .get::<sym::MemHostRegisterV2>()
                .ok_or(CUDA_ERROR_NOT_FOUND)?;
            // SAFETY: `len` bytes of this process's mapped memory.
            match unsafe { register(base, len, CU_MEMHOSTREGISTER_PORTABLE) } {
                CUDA_SUCCESS => Ok(()),
                code => Err(code),
            }
        });
        if let Err(code) = registered {
            buf.unmap();
            return Err(HostMemoryError::Register { bytes, code });
        }
        Ok(buf)
    }

    /// The registered memory.
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.base
    }

    /// Unregisters and unmaps the memory.
    pub(crate) fn release(mut self, driver: &Driver) {
        let _ = driver.with_context(self.context as CUcontext, || {
            if let Some(unregister) = driver.get::<sym::MemHostUnregister>() {
                // SAFETY: the start `new` registered, in this context.
                unsafe { unregister(self.base) };
            }
            Ok(())
        });
        self.unmap();
    }

    /// Gives the pages back, then unmaps. `munmap` of a populated range holds the process's
    /// memory map locked for writing while it frees every page (0.36-0.38 s for 16 GiB on an
    /// H200 host), and every page fault or `mmap` of the application's threads waits for it
    /// meanwhile (this runs beside the application, after a thaw). `MADV_DONTNEED` frees the
    /// pages holding the lock only for reading, in slices; the `munmap` after it has nothing
    /// left to free.
    fn unmap(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let (base, len) = (self.raw as usize, self.raw_len);
        for lo in (0..len).step_by(RELEASE_SLICE) {
            // SAFETY: a slice of the mapping `new` made, whose contents nobody reads any more.
            unsafe {
                libc::madvise(
                    (base + lo) as *mut c_void,
                    RELEASE_SLICE.min(len - lo),
                    libc::MADV_DONTNEED,
                )
            };
        }
        // SAFETY: the whole mapping `new` made, unmapped once (`raw` is cleared).
        unsafe { libc::munmap(self.raw, self.raw_len) };
        self.raw = std::ptr::null_mut();
    }

    /// Faults every page in, from several threads for a large buffer.
    fn populate(&self) -> Result<(), i32> {
        let threads = if self.len >= THREADED_FROM {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, POPULATE_THREADS)
        } else {
            1
        };
        let step = self.len.div_ceil(threads).next_multiple_of(HUGE_PAGE);
        let base = self.base as usize;
        let len = self.len;
        let slices: Vec<(usize, usize)> = (0..len)
            .step_by(step.max(1))
            .map(|lo| (base + lo, step.min(len - lo)))
            .collect();
        let results: Vec<Result<(), i32>> = std::thread::scope(|s| {
            let handles: Vec<_> = slices
                .iter()
                .map(|&(at, n)| s.spawn(move || populate_slice(at, n)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(0)))
                .collect()
        });
        results.into_iter().collect()
    }
}

impl Drop for HostBuffer {
    /// A buffer dropped without [`HostBuffer::release`] (an error path) is at least unmapped;
    /// the driver drops a registration whose memory is gone at the process's exit.
    fn drop(&mut self) {
        self.unmap();
    }
}

/// Faults in `n` bytes at `at`: `MADV_POPULATE_WRITE`, else a write per page.
fn populate_slice(at: usize, n: usize) -> Result<(), i32> {
    // SAFETY: a slice of the caller's mapping.
    if unsafe { libc::madvise(at as *mut c_void, n, MADV_POPULATE_WRITE) } == 0 {
        return Ok(());
    }
    let e = errno();
    if e != libc::EINVAL {
        return Err(e);
    }
    // Before Linux 5.14: touch each page (the memory is zero and stays so until the copy).
    let page = 4096;
    for off in (0..n).step_by(page) {
        // SAFETY: inside the caller's writable mapping.
        unsafe { ((at + off) as *mut u8).write_volatile(0) };
    }
    Ok(())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_buffer_once_and_populate_without_a_driver() {
        // A buffer populated without registering: the slices' arithmetic and the faulting.
        let len = 300 << 20;
        let raw_len = len + HUGE_PAGE;
        // SAFETY: an anonymous mapping, unmapped by the buffer.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(raw, libc::MAP_FAILED);
        let buf = HostBuffer {
            context: 0,
            raw,
            raw_len,
            base: (raw as usize).next_multiple_of(HUGE_PAGE) as *mut c_void,
            len,
        };
        assert_eq!(buf.populate(), Ok(()));
        // Every byte is there and writable (the last one too).
        // SAFETY: inside the buffer.
        unsafe {
            let last = buf.ptr().cast::<u8>().add(len - 1);
            last.write(7);
            assert_eq!(last.read(), 7);
        }
    }
}
