//! Error numbers the agent tells apart.

/// "Operation not permitted", as `std::io::Error::raw_os_error` reports it.
pub const EPERM: i32 = libc::EPERM;
