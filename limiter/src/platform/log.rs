//! Diagnostics on stderr without allocation: messages formatted into a stack buffer and written
//! with one `write(2)`, at HAMi-core's `LIBCUDA_LOG_LEVEL` scale. The level in force is the
//! configuration's (`Config::log_level`): callers pass it, nothing is kept here.

use std::fmt::{self, Write as _};

pub(crate) use limiter_core::config::Level;

/// Whether a message at `level` is written when `in_force` is the configured level.
#[inline]
pub(crate) fn enabled(in_force: Level, level: Level) -> bool {
    level != Level::Silent && level <= in_force
}

/// A fixed buffer that truncates instead of failing, so a long message is cut, never lost whole.
struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes `[vgpu-limiter <pid>] LEVEL: message\n` to stderr if `level` is enabled at `in_force`.
pub(crate) fn write(in_force: Level, level: Level, args: fmt::Arguments<'_>) {
    if enabled(in_force, level) {
        emit(level, args);
    }
}

/// Writes the message whatever the level: for configuration errors, after which every CUDA call
/// fails, so that the failure is never silent.
pub(crate) fn emit(level: Level, args: fmt::Arguments<'_>) {
    let mut out = StackBuf {
        buf: [0; 512],
        len: 0,
    };
    // StackBuf::write_str never fails.
    let _ = write!(out, "[vgpu-limiter {}] {}: ", super::os::pid(), level.tag());
    let _ = out.write_fmt(args);
    out.buf[out.len] = b'\n';
    out.len += 1;
    // SAFETY: the pointer and length describe the initialised prefix of `out.buf`. A short or failed
    // write to stderr is ignored: there is nowhere else to report it.
    unsafe { libc::write(libc::STDERR_FILENO, out.buf.as_ptr().cast(), out.len) };
}

/// Formats only when debug output is enabled at `in_force`.
macro_rules! debug {
    ($in_force:expr, $($arg:tt)*) => {
        $crate::platform::log::write($in_force, $crate::platform::log::Level::Debug, format_args!($($arg)*))
    };
}
pub(crate) use debug;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_gate_messages_and_silent_writes_nothing() {
        assert!(enabled(Level::Error, Level::Error));
        assert!(!enabled(Level::Error, Level::Warn));
        assert!(enabled(Level::Debug, Level::Info));
        assert!(!enabled(Level::Silent, Level::Error));
        assert!(!enabled(Level::Debug, Level::Silent));
        let mut b = StackBuf {
            buf: [0; 512],
            len: 0,
        };
        let long = "x".repeat(600);
        let _ = b.write_str(&long);
        assert_eq!(b.len, 511, "truncated, room kept for the newline");
    }
}
