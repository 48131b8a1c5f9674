//! Releasing uprobe links without stalling the agent.
//!
//! Dropping a uprobe link detaches it, and the kernel makes each release wait for a grace period
//! (`bpf_uprobe_multi_link_release` -> `synchronize_rcu_tasks_trace`): about 40 ms a link on the
//! CI VM, one after another on the thread that closes them. A library has two links per probed
//! kind (14 for a libcuda), so forgetting one cost the collector half a second, and the agent's
//! exit with its libraries at their caps (hundreds of links) took tens of seconds. Waits that
//! overlap share a grace period, so links are released on threads of their own: a forgotten
//! library's on one thread in the background, everything at exit spread over many threads at
//! once and waited for.

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::programs::uprobe::UProbeLink;

/// Threads that release links at exit at most (each then releases its share one by one).
const EXIT_THREADS: usize = 128;

/// Links being released in the background, and the threads releasing them.
#[derive(Default)]
pub(super) struct Releaser {
    pending: Vec<JoinHandle<()>>,
}

impl Releaser {
    /// Releases `links` on a thread of their own (inline if no thread can be started).
    pub(super) fn release_in_background(&mut self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        self.pending.retain(|h| !h.is_finished());
        // A closure that cannot run is dropped here, and the links with it: released inline.
        match std::thread::Builder::new()
            .name("link-release".into())
            .spawn(move || drop(links))
        {
            Ok(h) => self.pending.push(h),
            Err(e) => log::warn!("starting a thread to release probe links: {e}"),
        }
    }

    /// Releases `links` now, spread over up to [`EXIT_THREADS`] threads, and waits for them
    /// only (a sampling window's edge, or a change of scope: the probes must be off when this
    /// returns).
    pub(super) fn release_now(&mut self, links: Vec<UProbeLink>) {
        if links.len() <= 1 {
            drop(links);
            return;
        }
        let threads = links.len().min(EXIT_THREADS);
        let mut shares: Vec<Vec<UProbeLink>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, link) in links.into_iter().enumerate() {
            shares[i % threads].push(link);
        }
        std::thread::scope(|s| {
            for share in shares {
                // A thread that cannot start drops its share here: released inline.
                let _ = std::thread::Builder::new()
                    .name("link-release".into())
                    .spawn_scoped(s, move || drop(share));
            }
        });
    }

    /// Releases `links` spread over up to [`EXIT_THREADS`] threads at once, and waits for them
    /// and for the background releases still running. Returns how long it took.
    pub(super) fn release_all(&mut self, links: Vec<UProbeLink>) -> Duration {
        let started = Instant::now();
        let n = links.len();
        let threads = n.clamp(1, EXIT_THREADS);
        let mut shares: Vec<Vec<UProbeLink>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, link) in links.into_iter().enumerate() {
            shares[i % threads].push(link);
        }
        for share in shares.into_iter().filter(|s| !s.is_empty()) {
            self.release_in_background(share);
        }
        for h in self.pending.drain(..) {
            let _ = h.join();
        }
        let took = started.elapsed();
        log::debug!("released {n} probe links in {took:?}");
        took
    }
}
