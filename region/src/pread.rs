//! Reading an untrusted file with `pread(2)` into memory this process owns.
//!
//! The readers never dereference a mapping of a file another process can truncate: a page that
//! disappears under a mapping raises `SIGBUS` on access, while a `pread` past the end of the file
//! simply returns fewer bytes, which becomes a typed error ([`PreadError::Short`]).

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::layout_types::RegionPod;

/// A `pread` that could not fill its buffer.
#[derive(Debug)]
pub(crate) enum PreadError {
    /// The file ended at `len` bytes; the read needed `needed`.
    Short {
        /// Where the file ended (the offset of the first byte not read).
        len: u64,
        /// The end of the range asked for.
        needed: u64,
    },
    /// The system call failed.
    Io(std::io::Error),
}

/// Fills `buf` from `offset`, retrying partial reads and `EINTR`.
pub(crate) fn read_bytes(file: &File, offset: u64, buf: &mut [u8]) -> Result<(), PreadError> {
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset.saturating_add(done as u64);
        match file.read_at(&mut buf[done..], at) {
            Ok(0) => {
                return Err(PreadError::Short {
                    len: at,
                    needed: offset.saturating_add(buf.len() as u64),
                });
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(PreadError::Io(e)),
        }
    }
    Ok(())
}

/// Reads the little-endian `u64` at `offset`.
pub(crate) fn read_u64(file: &File, offset: u64) -> Result<u64, PreadError> {
    let mut bytes = [0u8; 8];
    read_bytes(file, offset, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// Overwrites `dst`, a private copy of a layout type, with the bytes of the file at `offset`.
pub(crate) fn read_pod<T: RegionPod>(
    file: &File,
    offset: u64,
    dst: &mut T,
) -> Result<(), PreadError> {
    // SAFETY: `dst` is a unique reference, so nothing else reads or writes these bytes while the
    // slice lives; `T` is a `RegionPod`: initialised, without padding, made of atomics only and
    // valid for every bit pattern, so any bytes the kernel writes leave a valid `T` (a short read
    // leaves a mix of old and new bytes, which is valid too and reported as an error anyway).
    let bytes =
        unsafe { std::slice::from_raw_parts_mut((dst as *mut T).cast::<u8>(), size_of::<T>()) };
    read_bytes(file, offset, bytes)
}

/// Fills `words` with the file's bytes at `offset`, in native byte order (as the layout's atomics
/// hold them).
pub(crate) fn read_words(file: &File, offset: u64, words: &mut [u64]) -> Result<(), PreadError> {
    // SAFETY: the byte view covers exactly `words`, which it borrows uniquely; `u64` has no
    // padding and every byte pattern is a valid `u64`.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), size_of_val(words))
    };
    read_bytes(file, offset, bytes)
}

/// A zero-filled private `T` on the heap (the layout types are up to 36 KiB).
pub(crate) fn boxed_zeroed<T: RegionPod>() -> Box<T> {
    // SAFETY: `RegionPod` types are valid for every bit pattern, all zeroes included.
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn short_reads_are_typed_errors() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; 12]).unwrap();
        assert_eq!(read_u64(&file, 0).unwrap(), 0x0707_0707_0707_0707);
        match read_u64(&file, 8) {
            Err(PreadError::Short { len, needed }) => assert_eq!((len, needed), (12, 16)),
            other => panic!("expected a short read, got {other:?}"),
        }
        let mut word = boxed_zeroed::<AtomicU64>();
        read_pod(&file, 4, &mut *word).unwrap();
        assert_eq!(word.load(Ordering::Relaxed), 0x0707_0707_0707_0707);
        assert!(matches!(
            read_pod(&file, u64::MAX - 2, &mut *word),
            Err(PreadError::Short { .. } | PreadError::Io(_))
        ));
    }
}
