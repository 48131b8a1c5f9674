//! The freeze pool's wire protocol: how a limiter that freezes in-process borrows host memory
//! the agent populated beforehand (docs/oversubscription.md, "The host pool").
//!
//! Populating fresh host pages is what an in-process freeze waits for (3.1 s for 16 GiB with 8
//! threads on an H200 host, against 0.31 s for the copy). The agent's daemon, with
//! `--freeze-pool SIZE`, keeps that much host memory populated in chunks of [`CHUNK_BYTES`]
//! (files of a tmpfs in huge pages, mounted nowhere) and lends chunks to a process that is
//! freezing in-process, over a Unix socket that containers see read-only.
//!
//! One exchange per connection, at most [`REQUEST_SIZE`] and [`REPLY_SIZE`] bytes:
//!
//! ```text
//!   limiter -> agent   Request { bytes }                       16 bytes
//!   agent -> limiter   Reply { status, chunk_bytes, chunks }   24 bytes, with `chunks` file
//!                      descriptors (SCM_RIGHTS) when `status` is `Lent`
//! ```
//!
//! The agent learns who asks from the socket (`SO_PEERCRED`), never from the request; it lends
//! only to a process whose container's control block marks an in-process freeze, at most what
//! NVML says the process holds on the GPU, one loan per process at a time, and takes the pages
//! back (a hole punched in each chunk) once the process answered a thaw or exited, whether or not
//! the process still holds the descriptors. A chunk is never lent twice: its pages are freed with
//! the loan, and a new chunk is populated for the next.
//!
//! This module is bytes only: no I/O (the agent's `freeze_pool` and the limiter's
//! `platform::freeze_pool` do that).

/// `b"VGFP"` read as a little-endian `u32`.
pub const POOL_MAGIC: u32 = u32::from_le_bytes(*b"VGFP");
/// The protocol's version: each side refuses any other.
pub const POOL_VERSION: u16 = 1;
/// Bytes of a request.
pub const REQUEST_SIZE: usize = 16;
/// Bytes of a reply.
pub const REPLY_SIZE: usize = 24;
/// Bytes of one chunk of the pool: each is one file, mapped whole, registered with the driver
/// on its own (a copy may not span two registrations, so a chunk is also the longest copy).
pub const CHUNK_BYTES: u64 = 1 << 30;
/// The most chunks one reply carries (the kernel's `SCM_MAX_FD` is 253): 250 GiB, more than a
/// GPU holds.
pub const MAX_CHUNKS: u32 = 250;
/// The variable that names the socket in a container; [`DEFAULT_SOCKET`] without it.
pub const SOCKET_ENV: &str = "VGPU_FREEZE_POOL_SOCKET";
/// Where the daemon binds the socket, and where containers see it (the directory is mounted
/// read-only into them: connecting to a socket needs no write access to the mount).
pub const DEFAULT_SOCKET: &str = "/run/vgpu-agent/pool/freeze-pool.sock";

/// What a limiter asks for: host memory for `bytes` of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub bytes: u64,
}

/// The agent's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `chunks` descriptors of `chunk_bytes` each come with the reply.
    Lent,
    /// The process's container is not being frozen in-process.
    NotFreezing,
    /// The process already holds a loan.
    AlreadyLent,
    /// The pool has less than asked populated now.
    Empty,
    /// More than the process holds on the GPU, or more than [`MAX_CHUNKS`] chunks.
    TooMuch,
    /// The agent could not tell who asked, or could not measure it.
    Unknown,
}

impl Status {
    fn code(self) -> u16 {
        match self {
            Status::Lent => 0,
            Status::NotFreezing => 1,
            Status::AlreadyLent => 2,
            Status::Empty => 3,
            Status::TooMuch => 4,
            Status::Unknown => 5,
        }
    }

    fn from_code(code: u16) -> Option<Status> {
        Some(match code {
            0 => Status::Lent,
            1 => Status::NotFreezing,
            2 => Status::AlreadyLent,
            3 => Status::Empty,
            4 => Status::TooMuch,
            5 => Status::Unknown,
            _ => return None,
        })
    }

    /// Why nothing was lent, for a log line.
    pub fn reason(self) -> &'static str {
        match self {
            Status::Lent => "lent",
            Status::NotFreezing => "the agent does not see this container freezing in-process",
            Status::AlreadyLent => "this process holds a loan already",
            Status::Empty => "the pool has less populated now than asked",
            Status::TooMuch => "more than the process holds on the GPU",
            Status::Unknown => "the agent could not identify or measure the process",
        }
    }
}

/// The agent's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    /// Bytes of each chunk lent (0 unless lent).
    pub chunk_bytes: u64,
    /// Chunks lent: the descriptors that came with the reply (0 unless lent).
    pub chunks: u32,
}

/// Why bytes are not a request or a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{got} bytes, expected {expected}")]
    Size { got: usize, expected: usize },
    #[error("magic {0:#010x} is not the freeze pool's")]
    Magic(u32),
    #[error("protocol version {0}, expected {POOL_VERSION}")]
    Version(u16),
    #[error("unknown status {0}")]
    Status(u16),
    #[error("a loan of {chunks} chunks of {chunk_bytes} bytes is not one the protocol makes")]
    Loan { chunks: u32, chunk_bytes: u64 },
    #[error("reserved word {0:#06x} is not zero")]
    Reserved(u16),
    #[error("a request for 0 bytes")]
    Empty,
}

fn header(buf: &mut [u8], second: u16) {
    buf[0..4].copy_from_slice(&POOL_MAGIC.to_le_bytes());
    buf[4..6].copy_from_slice(&POOL_VERSION.to_le_bytes());
    buf[6..8].copy_from_slice(&second.to_le_bytes());
}

fn check_header(buf: &[u8], expected: usize) -> Result<u16, WireError> {
    if buf.len() != expected {
        return Err(WireError::Size {
            got: buf.len(),
            expected,
        });
    }
    let magic = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if magic != POOL_MAGIC {
        return Err(WireError::Magic(magic));
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    if version != POOL_VERSION {
        return Err(WireError::Version(version));
    }
    Ok(u16::from_le_bytes([buf[6], buf[7]]))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Request {
    pub fn encode(self) -> [u8; REQUEST_SIZE] {
        let mut buf = [0; REQUEST_SIZE];
        header(&mut buf, 0);
        buf[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        buf
    }

    /// Validates what a tenant sent (hostile bytes give a typed error).
    pub fn decode(buf: &[u8]) -> Result<Request, WireError> {
        let reserved = check_header(buf, REQUEST_SIZE)?;
        if reserved != 0 {
            return Err(WireError::Reserved(reserved));
        }
        let bytes = u64_at(buf, 8);
        if bytes == 0 {
            return Err(WireError::Empty);
        }
        Ok(Request { bytes })
    }

    /// Chunks that hold the request (saturating at `u32::MAX`; the agent refuses more than
    /// [`MAX_CHUNKS`]).
    pub fn chunks(self) -> u32 {
        u32::try_from(self.bytes.div_ceil(CHUNK_BYTES)).unwrap_or(u32::MAX)
    }
}

impl Reply {
    /// A refusal.
    pub fn refused(status: Status) -> Reply {
        Reply {
            status,
            chunk_bytes: 0,
            chunks: 0,
        }
    }

    /// A loan of `chunks` chunks of [`CHUNK_BYTES`].
    pub fn lent(chunks: u32) -> Reply {
        Reply {
            status: Status::Lent,
            chunk_bytes: CHUNK_BYTES,
            chunks,
        }
    }

    pub fn encode(self) -> [u8; REPLY_SIZE] {
        let mut buf = [0; REPLY_SIZE];
        header(&mut buf, self.status.code());
        buf[8..16].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        buf[16..20].copy_from_slice(&self.chunks.to_le_bytes());
        buf
    }

    /// Validates the agent's reply: a loan has between 1 and [`MAX_CHUNKS`] chunks of
    /// [`CHUNK_BYTES`]; a refusal has none.
    pub fn decode(buf: &[u8]) -> Result<Reply, WireError> {
        let code = check_header(buf, REPLY_SIZE)?;
        let status = Status::from_code(code).ok_or(WireError::Status(code))?;
        let chunk_bytes = u64_at(buf, 8);
        let chunks = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if buf[20..24] != [0; 4] {
            return Err(WireError::Reserved(1));
        }
        let valid = match status {
            Status::Lent => chunk_bytes == CHUNK_BYTES && (1..=MAX_CHUNKS).contains(&chunks),
            _ => chunk_bytes == 0 && chunks == 0,
        };
        if !valid {
            return Err(WireError::Loan {
                chunks,
                chunk_bytes,
            });
        }
        Ok(Reply {
            status,
            chunk_bytes,
            chunks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let r = Request { bytes: 16 << 30 };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert_eq!(r.chunks(), 16);
        assert_eq!(Request { bytes: 1 }.chunks(), 1);
        assert_eq!(
            Request {
                bytes: (4 << 30) + 1
            }
            .chunks(),
            5
        );
        assert_eq!(Request { bytes: u64::MAX }.chunks(), u32::MAX);
        for reply in [
            Reply::lent(1),
            Reply::lent(MAX_CHUNKS),
            Reply::refused(Status::NotFreezing),
            Reply::refused(Status::AlreadyLent),
            Reply::refused(Status::Empty),
            Reply::refused(Status::TooMuch),
            Reply::refused(Status::Unknown),
        ] {
            assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        }
    }

    #[test]
    fn hostile_bytes_give_typed_errors() {
        let good = Request { bytes: 1 << 30 }.encode();
        assert_eq!(
            Request::decode(&good[..15]),
            Err(WireError::Size {
                got: 15,
                expected: REQUEST_SIZE
            })
        );
        let mut bad = good;
        bad[0] ^= 1;
        assert!(matches!(Request::decode(&bad), Err(WireError::Magic(_))));
        let mut bad = good;
        bad[4] = 9;
        assert_eq!(Request::decode(&bad), Err(WireError::Version(9)));
        assert_eq!(
            Request::decode(&Request { bytes: 0 }.encode()),
            Err(WireError::Empty)
        );
        let mut bad = Reply::lent(3).encode();
        bad[6] = 77;
        assert_eq!(Reply::decode(&bad), Err(WireError::Status(77)));
        for (chunks, chunk_bytes) in [(0, CHUNK_BYTES), (MAX_CHUNKS + 1, CHUNK_BYTES), (1, 4096)] {
            let forged = Reply {
                status: Status::Lent,
                chunk_bytes,
                chunks,
            };
            assert!(matches!(
                Reply::decode(&forged.encode()),
                Err(WireError::Loan { .. })
            ));
        }
        let forged = Reply {
            status: Status::Empty,
            chunk_bytes: CHUNK_BYTES,
            chunks: 2,
        };
        assert!(matches!(
            Reply::decode(&forged.encode()),
            Err(WireError::Loan { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_error_without_panicking(
            buf in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)
        ) {
            if let Ok(r) = Request::decode(&buf) {
                let again = r.encode();
                proptest::prop_assert_eq!(&again[..], &buf[..]);
            }
            if let Ok(r) = Reply::decode(&buf) {
                proptest::prop_assert!(r.chunks <= MAX_CHUNKS);
            }
        }
    }
}
