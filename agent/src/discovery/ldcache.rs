//! A reader for glibc's `/etc/ld.so.cache` (the "glibc-ld.so.cache1.1" format that glibc >= 2.32
//! writes), to find the host's libcuda the way the dynamic loader would.
//!
//! The file is trusted no more than any input: every offset is bounds-checked.

use std::path::PathBuf;

use thiserror::Error;

const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const HEADER_LEN: usize = 48;
const ENTRY_LEN: usize = 24;
/// `FLAG_ELF_LIBC6`: the entry's type.
const FLAG_TYPE_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`: the entry's architecture.
const FLAG_ARCH_X8664_LIB64: i32 = 0x0300;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LdCacheError {
    #[error("not a glibc-ld.so.cache1.1 file (an old or unknown format)")]
    UnknownFormat,
    #[error("truncated: {what} needs bytes up to {end}, the file has {len}")]
    Truncated {
        what: &'static str,
        end: usize,
        len: usize,
    },
}

/// One x86-64 library entry: its soname and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdCacheEntry {
    pub soname: String,
    pub path: PathBuf,
}

fn u32_at(buf: &[u8], at: usize, what: &'static str) -> Result<u32, LdCacheError> {
    let end = at.checked_add(4).ok_or(LdCacheError::Truncated {
        what,
        end: usize::MAX,
        len: buf.len(),
    })?;
    let bytes = buf.get(at..end).ok_or(LdCacheError::Truncated {
        what,
        end,
        len: buf.len(),
    })?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

fn c_str_at(buf: &[u8], at: usize) -> Option<&str> {
    let rest = buf.get(at..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..len]).ok()
}

/// Parses the x86-64 (libc6, lib64) entries of an ld.so.cache image.
pub fn parse(buf: &[u8]) -> Result<Vec<LdCacheEntry>, LdCacheError> {
    if !buf.starts_with(MAGIC) {
        return Err(LdCacheError::UnknownFormat);
    }
    if buf.len() < HEADER_LEN {
        return Err(LdCacheError::Truncated {
            what: "header",
            end: HEADER_LEN,
            len: buf.len(),
        });
    }
    let nlibs = u32_at(buf, 20, "library count")? as usize;
    let mut out = Vec::new();
    for i in 0..nlibs {
        let at = HEADER_LEN + i * ENTRY_LEN;
        let flags = u32_at(buf, at, "entry")? as i32;
        let key = u32_at(buf, at + 4, "entry")? as usize;
        let value = u32_at(buf, at + 8, "entry")? as usize;
        if flags & 0xff != FLAG_TYPE_ELF_LIBC6 || flags & 0xff00 != FLAG_ARCH_X8664_LIB64 {
            continue;
        }
        // String offsets are relative to the start of the file in the new format.
        if let (Some(soname), Some(path)) = (c_str_at(buf, key), c_str_at(buf, value)) {
            out.push(LdCacheEntry {
                soname: soname.to_owned(),
                path: PathBuf::from(path),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a cache image the way ldconfig lays it out.
    fn image(entries: &[(i32, &str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let strings_at = HEADER_LEN + entries.len() * ENTRY_LEN;
        let mut table = Vec::new();
        for (flags, key, value) in entries {
            let k = strings_at + strings.len();
            strings.extend_from_slice(key.as_bytes());
            strings.push(0);
            let v = strings_at + strings.len();
            strings.extend_from_slice(value.as_bytes());
            strings.push(0);
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&(k as u32).to_le_bytes());
            table.extend_from_slice(&(v as u32).to_le_bytes());
            table.extend_from_slice(&[0u8; 12]);
        }
        let mut buf = MAGIC.to_vec();
        buf.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        buf.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        buf.resize(HEADER_LEN, 0);
        buf.extend(table);
        buf.extend(strings);
        buf
    }

    #[test]
    fn finds_x86_64_entries_only() {
        let buf = image(&[
            (
                0x0303,
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ),
            (
                0x0003,
                "libcuda.so.1",
                "/usr/lib/i386-linux-gnu/libcuda.so.1",
            ),
            (0x0303, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ]);
        let entries = parse(&buf).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].soname, "libcuda.so.1");
        assert_eq!(
            entries[0].path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
    }

    #[test]
    fn rejects_bad_input_without_panicking() {
        assert_eq!(parse(b"ld.so-1.7.0"), Err(LdCacheError::UnknownFormat));
        let buf = image(&[(0x0303, "libcuda.so.1", "/x")]);
        for cut in 0..buf.len() {
            // Any truncation either errors or yields fewer entries; it never panics.
            let _ = parse(&buf[..cut]);
        }
        let mut lying = image(&[(0x0303, "a", "b")]);
        lying[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&lying), Err(LdCacheError::Truncated { .. })));
    }

    #[test]
    fn parses_this_hosts_cache_if_present() {
        if let Ok(buf) = std::fs::read("/etc/ld.so.cache") {
            let entries = parse(&buf).expect("the host's cache parses");
            assert!(
                entries.iter().any(|e| e.soname.starts_with("libc.so")),
                "libc is in every cache"
            );
        }
    }
}
