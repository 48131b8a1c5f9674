//! Re-entrancy and panic guards around hook bodies.
//!
//! A hook that is entered while the same thread is already inside the limiter (the driver calling
//! one of its own exported functions through our interposed name, a `dlsym` made by the dynamic
//! loader while we load libcuda) must go straight to the real function: [`Reentry`] tracks that with
//! a flag in the thread's words (`thread_words`: initial-exec TLS, no destructor, no allocation).
//!
//! Panics never cross the FFI boundary: the accounting logic around a driver call runs inside
//! [`Panics::shield`], and a caught panic is counted and the call falls through to the driver.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::atomic::{AtomicU64, Ordering},
};

use super::thread_words::ThreadWords;

/// Marks this thread as inside the limiter until dropped. Holds this thread's words, so that
/// leaving costs no second lookup. Not `Send`: it is dropped on the thread that made it.
#[derive(Debug)]
pub(crate) struct Reentry {
    words: &'static ThreadWords,
}

impl Reentry {
    /// Enters with this thread's `words`, or returns `None` if the thread is already inside the
    /// limiter.
    #[inline(always)]
    pub(crate) fn enter(words: &'static ThreadWords) -> Option<Reentry> {
        if words.inside.get() {
            None
        } else {
            words.inside.set(true);
            Some(Reentry { words })
        }
    }
}

impl Drop for Reentry {
    #[inline(always)]
    fn drop(&mut self) {
        self.words.inside.set(false);
    }
}

/// Panics caught inside hooks. Relaxed: an independent counter.
#[derive(Debug)]
pub(crate) struct Panics(AtomicU64);

impl Panics {
    pub(crate) const fn new() -> Panics {
        Panics(AtomicU64::new(0))
    }

    /// Number of panics caught.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Runs `f`, turning a panic into `None` (counted).
    #[inline]
    pub(crate) fn shield<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(_) => {
                self.0.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::thread_words::Tls;

    #[test]
    fn reentry_is_exclusive_per_thread_and_released_on_drop() {
        let tls = Tls::new();
        let outer = Reentry::enter(tls.words()).expect("first entry");
        assert!(tls.words().inside.get());
        assert!(Reentry::enter(tls.words()).is_none());
        std::thread::spawn(|| assert!(Reentry::enter(Tls::new().words()).is_some()))
            .join()
            .unwrap();
        drop(outer);
        assert!(!tls.words().inside.get());
        assert!(Reentry::enter(tls.words()).is_some());
    }

    #[test]
    fn shield_counts_panics() {
        let panics = Panics::new();
        assert_eq!(panics.shield(|| 7), Some(7));
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r: Option<()> = panics.shield(|| panic!("boom"));
        std::panic::set_hook(hook);
        assert_eq!(r, None);
        assert_eq!(panics.count(), 1);
    }
}
