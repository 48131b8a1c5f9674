//! Lending: a request decided from what was measured of its process, the chunks sent with the
//! reply, the loan recorded and watched on a thread of its own until it ends, and its chunks then
//! taken back.

use std::{
    os::{fd::BorrowedFd, unix::net::UnixStream},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use region::freeze_pool::{CHUNK_BYTES, REPLY_SIZE, Reply, Request, Status};

use super::{
    asker::Asked,
    chunk::Chunk,
    counters::Counters,
    decide,
    loans::{self, Book, End, Look, Process, Watch},
    pool::Pool,
};
use crate::{model::FreezePoolStatus, units};

/// The chunks and the loans out, shared by the connections' handlers and the loans' watches.
pub(super) struct Lender {
    pub pool: Arc<Pool>,
    book: Mutex<Book>,
    pub counters: Counters,
    stop: AtomicBool,
}

impl Lender {
    pub fn new(pool: Arc<Pool>) -> Lender {
        Lender {
            pool,
            book: Mutex::default(),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        }
    }

    /// Stops the loans' watches (the loans stay as they are) and the refill.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.pool.stop();
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides `pid`'s `request` from what was measured of it, and answers on `stream`: a loan's
    /// chunks go with the reply, and the loan is recorded and watched; a refusal is counted.
    pub fn lend(self: &Arc<Lender>, pid: u32, request: Request, asked: Asked, stream: &UnixStream) {
        let Asked {
            start,
            container,
            freezing,
            gpu,
        } = asked;
        let (freezing, watch) = match freezing {
            Some((f, w)) => (Some(f), Some(w)),
            None => (None, None),
        };
        let mut book = self.book();
        // A loan whose end its process shows now (a thaw answered, an earlier process of the
        // pid) ends before the next freeze asks again, whether or not its watch saw it yet.
        let mut over = None;
        let held = book.get(pid).map(|l| (l.id, l.generation, l.start));
        let holds = match (held, freezing) {
            (Some((id, generation, since)), Some(f)) => {
                let look = Look {
                    process: Process::Started(start),
                    answer: f.answer,
                };
                match loans::ended(generation, since, &look) {
                    Some(end) => {
                        over = book.remove(pid, id).map(|l| (l, end));
                        false
                    }
                    None => true,
                }
            }
            (held, _) => held.is_some(),
        };
        let decided = decide::decide(request, freezing, holds, gpu).and_then(|n| {
            self.pool
                .take(n as usize)
                .map(|chunks| (n, chunks))
                .ok_or(Status::Empty)
        });
        let lent = match decided {
            Err(status) => {
                drop(book);
                self.counters.refused(status);
                log::debug!("freeze pool: pid {pid}: {}", status.reason());
                let _ = send(stream, Reply::refused(status), &[]);
                None
            }
            Ok((n, chunks)) => {
                let fds: Vec<BorrowedFd<'_>> = chunks.iter().map(Chunk::fd).collect();
                match send(stream, Reply::lent(n), &fds) {
                    Ok(()) => {
                        let generation = freezing.map_or(0, |f| f.generation);
                        let id = book.insert(pid, start, container.clone(), generation, chunks);
                        self.counters.lent();
                        drop(book);
                        log::info!(
                            "freeze pool: lent {} to pid {pid}{} for its in-process freeze \
                             (mark generation {generation})",
                            units::bytes(u64::from(n) * CHUNK_BYTES),
                            shown(container.as_deref())
                        );
                        Some((id, start, generation))
                    }
                    Err(e) => {
                        drop(book);
                        log::debug!("freeze pool: pid {pid}: the loan was not sent: {e}");
                        self.pool.take_back(chunks);
                        None
                    }
                }
            }
        };
        if let Some((loan, end)) = over {
            self.returned(pid, loan, end);
        }
        if let (Some((id, start, generation)), Some(watch)) = (lent, watch) {
            self.watch(pid, id, start, generation, watch);
        }
    }

    /// Watches loan `id` of `pid` on a thread of its own (a read that blocks holds only that
    /// loan) until it ends or the pool stops.
    fn watch(
        self: &Arc<Lender>,
        pid: u32,
        id: u64,
        start: u64,
        generation: u64,
        mut watch: Box<dyn Watch>,
    ) {
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("fpool-loan".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(loans::WATCH_PERIOD);
                    if shared.stopped() {
                        return;
                    }
                    let end = loans::ended(generation, start, &watch.look());
                    let mut book = shared.book();
                    if book.get(pid).is_none_or(|l| l.id != id) {
                        return; // ended by a request of the same pid
                    }
                    if let Some(end) = end {
                        let loan = book.remove(pid, id);
                        drop(book);
                        if let Some(loan) = loan {
                            shared.returned(pid, loan, end);
                        }
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            // It ends when the same process asks again and shows its end.
            log::warn!("freeze pool: pid {pid}: no thread to watch its loan: {e}");
        }
    }

    /// A loan ended: its chunks taken back.
    fn returned(&self, pid: u32, loan: loans::Loan, end: End) {
        log::info!(
            "freeze pool: {} back from pid {pid}{} after {:.1}s: {}",
            units::bytes(loan.chunks.len() as u64 * CHUNK_BYTES),
            shown(loan.container.as_deref()),
            loan.since.elapsed().as_secs_f64(),
            end.said()
        );
        self.pool.take_back(loan.chunks);
    }

    pub fn status(&self) -> FreezePoolStatus {
        let figures = self.pool.figures();
        let (loans, _) = self.book().out();
        let (loans_total, refusals) = self.counters.now();
        FreezePoolStatus {
            size_bytes: figures.target as u64 * CHUNK_BYTES,
            ready_bytes: figures.ready as u64 * CHUNK_BYTES,
            lent_bytes: figures.lent as u64 * CHUNK_BYTES,
            loans: loans as u64,
            loans_total,
            refusals,
            kept_bytes: figures.kept,
            problem: figures.problem,
        }
    }
}

/// ` of container ID`, or nothing.
fn shown(container: Option<&str>) -> String {
    container.map_or_else(String::new, |c| format!(" of container {c}"))
}

/// Sends `reply` with `fds` in one `sendmsg` that never waits (the client sent its request and
/// reads nothing else: the socket's buffer has room for the reply).
pub(super) fn send(
    stream: &UnixStream,
    reply: Reply,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    let sent = crate::sys::socket::send_with_fds(stream, &reply.encode(), fds)?;
    if sent != REPLY_SIZE {
        return Err(std::io::Error::other(format!(
            "{sent} of the reply's {REPLY_SIZE} bytes sent"
        )));
    }
    Ok(())
}
