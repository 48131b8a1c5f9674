//! `SIMCUDA_SHARED_DEVICE=<file>`: one simulated device for every process that names the same
//! file, as a GPU time-slices the contexts of several processes. Launches from all of them queue
//! their work one after the other (in launch order); a process's synchronisation waits for its
//! own work, which ends after whatever was queued before it. The file (created if missing,
//! 4096 bytes, little-endian `u64` words) is also the device's own accounting, which tests read
//! to measure shares without counting launches themselves:
//!
//! | word | meaning |
//! |---|---|
//! | 0 | `busy_until`: `CLOCK_MONOTONIC` ns at which all work queued so far will have finished |
//! | 1 | `launched_ns`: device time of all launches so far; the time executed by `t` is `launched_ns - max(0, busy_until - t)` |
//! | 8 + 2i, 9 + 2i | process entry `i` (0..64): its pid (0: free) and its launches |
//! | 256 + d | device `d`'s memory (0..64): bytes charged by all processes, checked against `SIMCUDA_CAPACITY` |
//! | 320 + 3i, 321 + 3i, 322 + 3i | process entry `i`'s checkpoint mailbox: the request (`seq << 40 \| timeout_ms << 8 \| op`), the answer (`seq << 32 \| result`) and its state (`CUprocessState`); see `checkpoint.rs` |
//!
//! A word may be read while another process updates the other (a reader may see a launch in
//! `busy_until` before it is in `launched_ns`): one launch's time, nothing more.
//!
//! Memory is one pool per device for all processes, as on a GPU: an allocation fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` when the bytes charged by every process naming the file would pass
//! the capacity. A process that exits without freeing leaves its bytes charged (a real driver
//! returns them); tests free before they exit.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

const WORDS: usize = 512;
const W_BUSY_UNTIL: usize = 0;
const W_LAUNCHED_NS: usize = 1;
const W_PROCESSES: usize = 8;
const PROCESSES: usize = 64;
const W_MEMORY: usize = 256;
/// Devices whose memory the file accounts for.
const MEMORY_DEVICES: usize = 64;
const W_CHECKPOINT: usize = 320;
const _: () = assert!(W_CHECKPOINT + 3 * PROCESSES <= WORDS);
const _: () = assert!(W_MEMORY + MEMORY_DEVICES <= W_CHECKPOINT);

/// A process entry's checkpoint mailbox: see the table above.
pub struct Mailbox {
    pub request: &'static AtomicU64,
    pub answer: &'static AtomicU64,
    pub state: &'static AtomicU64,
}

/// The mapped file and this process's entry.
pub struct SharedDevice {
    words: &'static [AtomicU64; WORDS],
    /// This process's entry's launch counter (none if all 64 are taken by live processes).
    launches: Option<&'static AtomicU64>,
    /// This process's entry (none if all 64 are taken by live processes).
    entry: Option<usize>,
}

/// `CLOCK_MONOTONIC` in ns: the clock every process of the host shares.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Whether process `pid` exists (a pid of 0 or past `pid_t` never does).
pub fn process_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; EPERM means it does.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

impl SharedDevice {
    /// Maps `path` (created and sized if needed); `None` (with a warning) if it cannot be.
    fn open(path: &str) -> Option<SharedDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| eprintln!("simcuda: warning: SIMCUDA_SHARED_DEVICE={path:?}: {e}"))
            .ok()?;
        if file.metadata().ok()?.len() < (WORDS * 8) as u64 {
            file.set_len((WORDS * 8) as u64).ok()?;
        }
        // SAFETY: a shared read-write mapping of a regular file of at least WORDS * 8 bytes;
        // the mapping outlives the file descriptor and is never unmapped (leaked for the
        // process's life).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                WORDS * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            eprintln!("simcuda: warning: SIMCUDA_SHARED_DEVICE={path:?}: mmap failed");
            return None;
        }
        // SAFETY: page-aligned, WORDS * 8 bytes, mapped for the process's life; every access is
        // atomic.
        let words: &'static [AtomicU64; WORDS] = unsafe { &*p.cast() };
        let pid = u64::from(std::process::id());
        // This process's entry: a free one, one that already names this pid (a pid reused), or
        // failing those one whose process is gone.
        let claim = |i: usize, from: u64| {
            words[W_PROCESSES + 2 * i]
                .compare_exchange(from, pid, Ordering::AcqRel, Ordering::Acquire)
                .map_or_else(|v| v == pid, |_| true)
        };
        let entry = (0..PROCESSES).find(|i| claim(*i, 0)).or_else(|| {
            (0..PROCESSES).find(|i| {
                let owner = words[W_PROCESSES + 2 * i].load(Ordering::Acquire);
                !process_alive(owner) && claim(*i, owner)
            })
        });
        let launches = entry.map(|i| &words[W_PROCESSES + 2 * i + 1]);
        if let Some(l) = launches {
            l.store(0, Ordering::Release);
        }
        let device = SharedDevice {
            words,
            launches,
            entry,
        };
        if let Some(i) = entry {
            // A fresh mailbox: a reused entry may hold a dead process's last exchange.
            let m = device.mailbox_at(i);
            m.request.store(0, Ordering::Release);
            m.answer.store(0, Ordering::Release);
            m.state.store(0, Ordering::Release);
        }
        Some(device)
    }

    /// Queues `ns` of work after all work queued so far; returns when it will have finished
    /// (`CLOCK_MONOTONIC` ns).
    pub fn launch(&self, ns: u64) -> u64 {
        let now = monotonic_ns();
        let busy = &self.words[W_BUSY_UNTIL];
        let mut cur = busy.load(Ordering::Acquire);
        let end = loop {
            let end = cur.max(now) + ns;
            match busy.compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break end,
                Err(v) => cur = v,
            }
        };
        self.words[W_LAUNCHED_NS].fetch_add(ns, Ordering::AcqRel);
        if let Some(l) = self.launches {
            l.fetch_add(1, Ordering::AcqRel);
        }
        end
    }
}

impl SharedDevice {
    /// Charges `size` bytes to `device` if every process's charge stays within `capacity`.
    pub fn try_charge(&self, device: usize, size: u64, capacity: u64) -> bool {
        let Some(word) = self.memory(device) else {
            return false;
        };
        // AcqRel/Acquire: the charge is the one word every process's allocations contend on;
        // the exchange orders them (no other memory is published through it).
        word.try_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(size).filter(|n| *n <= capacity)
        })
        .is_ok()
    }

    /// Returns `size` bytes charged to `device`.
    pub fn uncharge(&self, device: usize, size: u64) {
        if let Some(word) = self.memory(device) {
            // Saturating: a file reset by hand under a live process must not wrap.
            let _ = word.try_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(size))
            });
        }
    }

    /// Bytes charged to `device` by every process.
    pub fn charged(&self, device: usize) -> u64 {
        // Acquire: pairs with the exchanges of `try_charge` and `uncharge`.
        self.memory(device)
            .map_or(0, |word| word.load(Ordering::Acquire))
    }

    /// This process's checkpoint mailbox (none if it has no entry).
    pub fn own_mailbox(&self) -> Option<Mailbox> {
        self.entry.map(|i| self.mailbox_at(i))
    }

    /// The checkpoint mailbox of process `pid`, if it has an entry.
    pub fn mailbox(&self, pid: u32) -> Option<Mailbox> {
        let pid = u64::from(pid);
        (0..PROCESSES)
            // Acquire: pairs with the entry's claim in `open`.
            .find(|i| pid != 0 && self.words[W_PROCESSES + 2 * i].load(Ordering::Acquire) == pid)
            .map(|i| self.mailbox_at(i))
    }

    fn mailbox_at(&self, i: usize) -> Mailbox {
        Mailbox {
            request: &self.words[W_CHECKPOINT + 3 * i],
            answer: &self.words[W_CHECKPOINT + 3 * i + 1],
            state: &self.words[W_CHECKPOINT + 3 * i + 2],
        }
    }

    fn memory(&self, device: usize) -> Option<&AtomicU64> {
        (device < MEMORY_DEVICES).then(|| &self.words[W_MEMORY + device])
    }

    /// When all work queued so far, by every process, will have finished (`CLOCK_MONOTONIC` ns).
    pub fn busy_until(&self) -> u64 {
        // Acquire: pairs with the AcqRel update in `launch` (any process's).
        self.words[W_BUSY_UNTIL].load(Ordering::Acquire)
    }
}

/// The shared device, if `SIMCUDA_SHARED_DEVICE` names one that could be mapped.
pub fn device() -> Option<&'static SharedDevice> {
    static DEVICE: OnceLock<Option<SharedDevice>> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            crate::config::config()
                .shared_device
                .as_deref()
                .and_then(SharedDevice::open)
        })
        .as_ref()
}
