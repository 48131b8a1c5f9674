//! The words of one thread as a hook uses them; where they are is the parent's business.

use std::{
    cell::{Cell, UnsafeCell},
    mem::MaybeUninit,
    ptr,
};

use region::ShardWriter;

/// The words of one thread, one cache line. Zero-initialised: outside the limiter, no writer.
#[repr(C, align(64))]
pub(crate) struct ThreadWords {
    /// Whether this thread is inside the limiter (see `guard::Reentry`).
    pub(crate) inside: Cell<bool>,
    /// The ledger (the runtime's region ledger) that [`ThreadWords::writer`] records for; null
    /// until the thread's first record, and again once its thread-local destructors have run.
    pub(crate) ledger: Cell<*const ()>,
    /// A bitwise copy of this thread's statistics writer, valid while `ledger` is non-null, so
    /// that a record reads this one line and nothing else of the thread's. The original lives in
    /// the ledger's thread-local, whose destructor frees the shard (and clears `ledger` first);
    /// the copy is never dropped. A writer is plain data used through `&self` only, so the copy
    /// is an alias that does nothing the original would not.
    pub(crate) writer: UnsafeCell<MaybeUninit<ShardWriter<'static>>>,
    /// Launches until (and including) this thread's next launch timed on the GPU; 0 before its
    /// first launch (which is a sample point: see `runtime::gpu_time`).
    pub(crate) sample_countdown: Cell<u32>,
}

impl std::fmt::Debug for ThreadWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadWords")
            .field("inside", &self.inside.get())
            .field("ledger", &self.ledger.get())
            .finish_non_exhaustive()
    }
}

/// Bytes reserved for the words in `.tbss` (the assembly of the parent's `imp`): one line.
const WORDS_SIZE: usize = 64;
const _: () = assert!(size_of::<ThreadWords>() <= WORDS_SIZE);
const _: () = assert!(align_of::<ThreadWords>() == 64);

impl ThreadWords {
    /// The writer for `ledger`, if this thread's copy is one.
    #[inline(always)]
    pub(crate) fn writer_for(
        &'static self,
        ledger: *const (),
    ) -> Option<&'static ShardWriter<'static>> {
        if self.ledger.get() == ledger && !ledger.is_null() {
            // SAFETY: a non-null `ledger` means `writer` holds a copy made by `set_writer` of
            // the thread-local writer, which is still alive (its destructor clears `ledger`).
            Some(unsafe { (*self.writer.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// Keeps a copy of `writer` (this thread's, owned by a thread-local that calls
    /// [`ThreadWords::clear_writer`] before dropping it) as the writer for `ledger`.
    pub(crate) fn set_writer(&self, writer: &ShardWriter<'static>, ledger: *const ()) {
        self.ledger.set(ptr::null());
        // SAFETY: no reference to the copy is alive (records do not nest, and the copy is only
        // handed out by `writer_for` for the duration of one record); the bitwise copy is never
        // dropped, see the field's documentation.
        unsafe { (*self.writer.get()).write(ptr::read(writer)) };
        self.ledger.set(ledger);
    }

    /// Counts a launch down to the next sample point: whether this launch is one. The only cost
    /// sampling adds to a launch that is not sampled.
    #[inline(always)]
    pub(crate) fn sample_due(&self) -> bool {
        let left = self.sample_countdown.get();
        if left > 1 {
            self.sample_countdown.set(left - 1);
            false
        } else {
            true
        }
    }

    /// Forgets the thread's writer (its owner is being dropped).
    #[inline]
    pub(crate) fn clear_writer(&self) {
        self.ledger.set(ptr::null());
    }
}
