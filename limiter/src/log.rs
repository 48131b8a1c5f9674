//! Diagnostics on stderr without allocation: a level read once from `LIBCUDA_LOG_LEVEL` (HAMi-core's
//! scale) and messages formatted into a stack buffer, written with one `write(2)`.

use std::{
    fmt::{self, Write as _},
    sync::atomic::{AtomicU8, Ordering},
};

/// HAMi-core's `LIBCUDA_LOG_LEVEL` scale.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// 0: nothing at all, not even configuration errors.
    Silent = 0,
    /// 1 (default): errors.
    Error = 1,
    /// 2: warnings.
    Warn = 2,
    /// 3: information.
    Info = 3,
    /// 4: debugging detail.
    Debug = 4,
}

impl Level {
    pub const DEFAULT: Level = Level::Error;

    pub const fn from_u8(v: u8) -> Option<Level> {
        match v {
            0 => Some(Level::Silent),
            1 => Some(Level::Error),
            2 => Some(Level::Warn),
            3 => Some(Level::Info),
            4 => Some(Level::Debug),
            _ => None,
        }
    }

    const fn tag(self) -> &'static str {
        match self {
            Level::Silent => "",
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        }
    }
}

/// The level in force. Relaxed everywhere: it is one independent byte, set once at initialisation;
/// a message racing with that store may use either level.
static LEVEL: AtomicU8 = AtomicU8::new(Level::DEFAULT as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

#[inline]
pub fn enabled(level: Level) -> bool {
    level != Level::Silent && level as u8 <= LEVEL.load(Ordering::Relaxed)
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

/// Writes `[vgpu-limiter <pid>] LEVEL: message\n` to stderr if `level` is enabled.
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    if enabled(level) {
        emit(level, args);
    }
}

/// Writes the message whatever the level: for configuration errors, after which every CUDA call
/// fails, so that the failure is never silent.
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    let mut out = StackBuf {
        buf: [0; 512],
        len: 0,
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // StackBuf::write_str never fails.
    let _ = write!(out, "[vgpu-limiter {pid}] {}: ", level.tag());
    let _ = out.write_fmt(args);
    out.buf[out.len] = b'\n';
    out.len += 1;
    // SAFETY: the pointer and length describe the initialised prefix of `out.buf`. A short or failed
    // write to stderr is ignored: there is nowhere else to report it.
    unsafe { libc::write(libc::STDERR_FILENO, out.buf.as_ptr().cast(), out.len) };
}

/// Formats only when debug output is enabled.
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($arg)*)) };
}
pub(crate) use debug;
