//! A small pool of worker threads for reads that may block on what a tenant controls (a FUSE
//! file, a process holding its memory map's lock). The caller sends each read as a job and waits
//! for its answer until a deadline of its own; a job that blocks holds one worker until it
//! returns, never the caller. The pool grows to its bound when every idle worker has a job
//! waiting for it already; past the bound, jobs wait in the queue.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering::Relaxed},
    mpsc::{self, Receiver, Sender},
};

type Job = Box<dyn FnOnce() + Send>;

pub struct Pool {
    /// The workers' thread name.
    name: &'static str,
    max_workers: usize,
    tx: Sender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    /// Workers waiting for a job.
    idle: Arc<AtomicUsize>,
    /// Jobs sent and not taken yet.
    queued: Arc<AtomicUsize>,
    threads: usize,
}

impl Pool {
    /// A pool of at most `max_workers` threads named `name`; none starts before a job comes.
    pub fn new(name: &'static str, max_workers: usize) -> Pool {
        let (tx, rx) = mpsc::channel();
        Pool {
            name,
            max_workers,
            tx,
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            queued: Arc::new(AtomicUsize::new(0)),
            threads: 0,
        }
    }

    /// Whether a job sent now would start at once (an idle worker waits for it, or a worker can
    /// be started) rather than wait in the queue behind jobs that may block.
    pub fn has_room(&self) -> bool {
        // Relaxed: an estimate; a worker that becomes idle meanwhile only makes it pessimistic.
        self.idle.load(Relaxed) > self.queued.load(Relaxed) || self.threads < self.max_workers
    }

    pub fn run(&mut self, job: impl FnOnce() + Send + 'static) {
        // Relaxed: the counts only decide whether to start a worker; a race starts one too many.
        if self.idle.load(Relaxed) <= self.queued.load(Relaxed) && self.threads < self.max_workers {
            let (rx, idle, queued) = (
                Arc::clone(&self.rx),
                Arc::clone(&self.idle),
                Arc::clone(&self.queued),
            );
            let spawned = std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || {
                    loop {
                        idle.fetch_add(1, Relaxed);
                        let job = rx
                            .lock()
                            .map_err(|_| ())
                            .and_then(|r| r.recv().map_err(|_| ()));
                        idle.fetch_sub(1, Relaxed);
                        match job {
                            Ok(job) => {
                                queued.fetch_sub(1, Relaxed);
                                job()
                            }
                            Err(()) => return,
                        }
                    }
                });
            match spawned {
                Ok(_) => self.threads += 1,
                Err(e) => log::warn!("starting a {} thread: {e}", self.name),
            }
        }
        self.queued.fetch_add(1, Relaxed);
        // The workers hold the receiver for as long as the pool lives.
        let _ = self.tx.send(Box::new(job));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Jobs that block hold their workers: the pool grows to its bound, then has no room and
    /// queues; a job sent while there is room runs although the others block.
    #[test]
    fn blocked_jobs_hold_workers_up_to_the_bound() {
        let mut pool = Pool::new("pool-test", 2);
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let (done_tx, done) = mpsc::channel::<u32>();
        assert!(pool.has_room());
        let g = Arc::clone(&gate);
        pool.run(move || {
            let _ = g.lock().unwrap().recv();
        });
        assert!(pool.has_room(), "a second worker can start");
        let tx = done_tx.clone();
        pool.run(move || tx.send(1).unwrap());
        assert_eq!(done.recv_timeout(Duration::from_secs(30)), Ok(1));
        // Both workers started; one is blocked, the other idle once it took its job.
        let g = Arc::clone(&gate);
        pool.run(move || {
            let _ = g.lock().unwrap().recv();
        });
        let tx = done_tx.clone();
        pool.run(move || tx.send(2).unwrap());
        assert!(!pool.has_room(), "both workers blocked or taken");
        release.send(()).unwrap();
        assert_eq!(done.recv_timeout(Duration::from_secs(30)), Ok(2));
        release.send(()).unwrap();
    }
}
