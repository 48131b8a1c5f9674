//! The per-thread words every hook reads: the re-entrancy flag, this thread's statistics writer
//! and its countdown to the next launch timed on the GPU.
//!
//! Why not `thread_local!`: in a shared library it compiles to the general-dynamic TLS model, a
//! call to `__tls_get_addr` per access. On a call that finds its caches cold (an allocation after
//! the driver's own work, on the GPU machine every allocation), that call costs the dynamic
//! loader's code page, two of its data pages, the thread's DTV and the library's GOT: five pages
//! and TLB misses, more than everything else a hook reads. These words are instead one
//! `.tbss` object accessed with the initial-exec model: the thread pointer plus an offset that is
//! the same in every thread (static TLS, which a preloaded library always gets and glibc keeps a
//! surplus of for one loaded later), read once from the GOT and then kept in a [`Tls`] (the
//! runtime keeps one in its hot line, the region ledger one beside its record path). The words
//! share the static TLS area with libc's (`errno`), which the driver touches anyway.
//!
//! Other architectures fall back to a `thread_local!` (correct, slower).

use std::sync::atomic::AtomicIsize;

mod words;

pub(crate) use words::ThreadWords;

/// Where the thread words are: their offset from the thread pointer, the same in every thread,
/// read from the GOT at the first use and kept here (0 until then). The runtime keeps its one
/// `Tls` in the line every hook reads first, so that finding the words costs no GOT line.
#[derive(Debug)]
pub(crate) struct Tls {
    /// Relaxed: every thread computes the same value.
    offset: AtomicIsize,
}

impl Tls {
    pub(crate) const fn new() -> Tls {
        Tls {
            offset: AtomicIsize::new(0),
        }
    }

    /// The calling thread's words. Valid until the thread exits (after its thread-local
    /// destructors), only on this thread.
    #[inline(always)]
    pub(crate) fn words(&self) -> &'static ThreadWords {
        // SAFETY: the words live in the thread's static TLS block for the whole life of the
        // thread, and the reference is used only on this thread (`ThreadWords` is not `Sync`, so
        // it cannot be sent to another thread; `'static` overstates only across threads, which
        // `!Sync` prevents).
        unsafe { &*imp::words(&self.offset) }
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::sync::atomic::{AtomicIsize, Ordering};

    use super::words::ThreadWords;

    // The thread's words: one zeroed line of `.tbss` (`WORDS_SIZE`; each thread starts with it
    // zeroed), hidden so it is not exported (the export allow-list test checks that).
    std::arch::global_asm!(
        ".pushsection .tbss.vgpu_thread_words,\"awT\",@nobits",
        ".p2align 6",
        ".globl vgpu_thread_words",
        ".hidden vgpu_thread_words",
        ".type vgpu_thread_words,@object",
        ".size vgpu_thread_words,64",
        "vgpu_thread_words:",
        ".zero 64",
        ".popsection",
    );

    #[inline(always)]
    pub(super) fn words(cache: &AtomicIsize) -> *const ThreadWords {
        // Relaxed: see `Tls::offset`.
        let mut offset = cache.load(Ordering::Relaxed);
        if offset == 0 {
            offset = read_offset(cache);
        }
        thread_pointer().wrapping_add_signed(offset) as *const ThreadWords
    }

    /// The thread pointer: the address of the thread's control block, whose first line every
    /// [`words`] reads.
    #[inline(always)]
    pub(super) fn thread_pointer() -> usize {
        let tp: usize;
        // SAFETY: on x86_64 Linux `fs:0` holds the thread pointer itself (the TCB's self pointer,
        // glibc's `tcbhead_t.tcb`); reading it has no other effect.
        unsafe {
            std::arch::asm!(
                "mov {tp}, qword ptr fs:[0]",
                tp = out(reg) tp,
                options(nostack, readonly, preserves_flags, pure)
            );
        }
        tp
    }

    #[cold]
    #[inline(never)]
    fn read_offset(cache: &AtomicIsize) -> isize {
        let offset: isize;
        // SAFETY: loads the GOT entry the linker made for the initial-exec reference: the words'
        // offset from the thread pointer, filled in by the dynamic loader before any code runs.
        unsafe {
            std::arch::asm!(
                "mov {o}, qword ptr [rip + vgpu_thread_words@GOTTPOFF]",
                o = out(reg) offset,
                options(nostack, readonly, preserves_flags, pure)
            );
        }
        // Relaxed: see `Tls::offset`.
        cache.store(offset, Ordering::Relaxed);
        offset
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use std::{
        cell::{Cell, UnsafeCell},
        mem::MaybeUninit,
        ptr,
        sync::atomic::AtomicIsize,
    };

    use super::words::ThreadWords;

    thread_local! {
        static WORDS: ThreadWords = const {
            ThreadWords {
                inside: Cell::new(false),
                ledger: Cell::new(ptr::null()),
                writer: UnsafeCell::new(MaybeUninit::uninit()),
                sample_countdown: Cell::new(0),
            }
        };
    }

    #[inline(always)]
    pub(super) fn words(_: &AtomicIsize) -> *const ThreadWords {
        WORDS.with(|w| w as *const ThreadWords)
    }

    #[inline(always)]
    pub(super) fn thread_pointer() -> usize {
        0
    }
}

/// The address of the thread's control block (0 where it is not known): a line every hook reads.
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    imp::thread_pointer()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_zeroed_words() {
        static TLS: Tls = Tls::new();
        let w = TLS.words();
        assert!(!w.inside.get());
        w.inside.set(true);
        w.ledger.set(8 as *const ());
        assert!(TLS.words().inside.get());
        assert!(std::ptr::eq(TLS.words(), w));
        assert_eq!(std::ptr::from_ref(w) as usize % 64, 0, "one line");
        // Another cache finds the same words.
        assert!(std::ptr::eq(Tls::new().words(), w));
        let other = std::thread::spawn(|| {
            let o = TLS.words();
            let fresh = (!o.inside.get(), o.ledger.get().is_null());
            (std::ptr::from_ref(o) as usize, fresh)
        })
        .join()
        .unwrap();
        assert_ne!(other.0, std::ptr::from_ref(w) as usize);
        assert_eq!(other.1, (true, true));
        w.inside.set(false);
        w.clear_writer();
        assert!(TLS.words().ledger.get().is_null());
        assert!(TLS.words().writer_for(std::ptr::null()).is_none());
    }
}
