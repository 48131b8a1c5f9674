//! Re-entrancy and panic guards around hook bodies.
//!
//! A hook that is entered while the same thread is already inside the limiter (the driver calling
//! one of its own exported functions through our interposed name, a `dlsym` made by the dynamic
//! loader while we load libcuda) must go straight to the real function: [`Reentry`] tracks that with
//! a flag in the thread's words (`thread_words`: initial-exec TLS, no destructor, no allocation).
//!
//! Panics never cross the FFI boundary: the accounting logic around a driver call runs inside
//! [`shield`], and a caught panic is counted and the call falls through to the driver.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::thread_words::{self, ThreadWords};

/// Whether this thread is already inside the limiter.
#[inline]
pub fn active() -> bool {
    thread_words::current().inside.get()
}

/// Marks this thread as inside the limiter until dropped. Holds this thread's words, so that
/// leaving costs no second lookup. Not `Send`: it is dropped on the thread that made it.
#[derive(Debug)]
pub struct Reentry {
    words: &'static ThreadWords,
}

impl Reentry {
    /// Enters, or returns `None` if the thread is already inside the limiter.
    #[inline(always)]
    pub fn enter() -> Option<Reentry> {
        let words = thread_words::current();
        if words.inside.get() {
            None
        } else {
            words.inside.set(true);
            Some(Reentry { words })
        }
    }

    /// This thread's words (its statistics writer is beside the flag).
    #[inline(always)]
    pub fn words(&self) -> &'static ThreadWords {
        self.words
    }
}

impl Drop for Reentry {
    #[inline(always)]
    fn drop(&mut self) {
        self.words.inside.set(false);
    }
}

/// Panics caught inside hooks since start. Relaxed: an independent counter.
static PANICS: AtomicU64 = AtomicU64::new(0);

/// Number of panics caught inside hooks.
pub fn panics() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

/// Runs `f`, turning a panic into `None` (counted).
#[inline]
pub fn shield<T>(f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            PANICS.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reentry_is_exclusive_per_thread_and_released_on_drop() {
        let outer = Reentry::enter().expect("first entry");
        assert!(active());
        assert!(Reentry::enter().is_none());
        std::thread::spawn(|| assert!(Reentry::enter().is_some()))
            .join()
            .unwrap();
        drop(outer);
        assert!(!active());
        assert!(Reentry::enter().is_some());
    }

    #[test]
    fn shield_counts_panics() {
        let before = panics();
        assert_eq!(shield(|| 7), Some(7));
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r: Option<()> = shield(|| panic!("boom"));
        std::panic::set_hook(hook);
        assert_eq!(r, None);
        assert!(panics() > before);
    }
}
