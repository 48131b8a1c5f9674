//! Writing through a shared mapping of a file that its owner may truncate meanwhile.
//!
//! The agent writes a control block through a `MAP_SHARED` mapping (its seqlock needs atomic
//! compare-and-swap on the generation word, which `pwrite` cannot give). The file belongs to a
//! tenant, who can `ftruncate` it at any moment; an access to a mapped page past the new end of
//! the file raises `SIGBUS`, whose default action ends the process. [`guarded`] runs a closure with
//! a `SIGBUS` handler that, for a fault inside the given range, maps an anonymous page over the
//! faulting one (so the access completes, into memory nobody else sees) and records that it did;
//! the caller turns that into an error. A fault anywhere else gets the previous disposition back
//! and happens again, as it would have without the handler.
//!
//! Only the agent's control-block writer uses this (the limiter maps its blocks read-only and
//! never installs a handler). One guarded region at a time per process.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static HIT: AtomicBool = AtomicBool::new(false);
/// The disposition `guarded` replaced, for faults outside the range (null outside `guarded`).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    // Relaxed: stored by this thread before the guarded accesses (a handler runs on the faulting
    // thread, which is the one in `guarded`; program order suffices).
    let (start, end) = (START.load(Ordering::Relaxed), END.load(Ordering::Relaxed));
    if (start..end).contains(&addr) {
        let page = PAGE.load(Ordering::Relaxed);
        let base = addr & !(page - 1);
        // SAFETY: mmap is async-signal-safe; MAP_FIXED replaces the page at `base`, which lies in
        // the guarded mapping that `guarded`'s caller owns and unmaps as a whole afterwards.
        let p = unsafe {
            libc::mmap(
                base as *mut c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            HIT.store(true, Ordering::Relaxed);
            return;
        }
    }
    // Not ours (or the page could not be replaced): the previous disposition handles the fault
    // when the access runs again.
    let prev = PREVIOUS.load(Ordering::Acquire);
    if !prev.is_null() {
        // SAFETY: `prev` points at `guarded`'s local, alive while the handler is installed.
        unsafe { libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut()) };
    } else {
        // SAFETY: resetting a disposition is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
    }
}

/// Runs `f`, which accesses the mapping at `range`; returns its result and whether a page of the
/// range disappeared under it (the file was truncated), in which case the accesses after the
/// fault went to a private page instead of the file.
pub(crate) fn guarded<T>(range: Range<usize>, f: impl FnOnce() -> T) -> (T, bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        PAGE.store(page as usize, Ordering::Relaxed);
    }
    START.store(range.start, Ordering::Relaxed);
    END.store(range.end, Ordering::Relaxed);
    HIT.store(false, Ordering::Relaxed);
    // SAFETY: an all-zero sigaction is a valid value to be overwritten by sigaction(2).
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // Release: the handler's Acquire load sees `previous` once sigaction filled it.
    // SAFETY: as above; `ours` is fully initialised below.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_sigbus as *const () as usize;
    ours.sa_flags = libc::SA_SIGINFO;
    // SAFETY: valid pointers to initialised sigaction structs; SIGBUS can be caught.
    let installed = unsafe { libc::sigaction(libc::SIGBUS, &ours, &mut previous) } == 0;
    PREVIOUS.store(&mut previous, Ordering::Release);
    let out = f();
    if installed {
        // SAFETY: `previous` holds what sigaction returned above.
        unsafe { libc::sigaction(libc::SIGBUS, &previous, std::ptr::null_mut()) };
    }
    PREVIOUS.store(std::ptr::null_mut(), Ordering::Release);
    START.store(0, Ordering::Relaxed);
    END.store(0, Ordering::Relaxed);
    (out, HIT.load(Ordering::Relaxed))
}
