//! The pool's Unix socket: one exchange per connection (`region::freeze_pool`), every step
//! bounded. A thread accepts; each connection is handled on a thread of its own, at most
//! [`MAX_CONNECTIONS`] at once and [`MAX_PER_TENANT`] per tenant (container) at once, counting
//! the tenant's inspections still running; more are closed at once. A handler reads the request
//! within [`Limits::exchange`], waits for the asking process's inspection (which reads what the
//! tenant controls, on a thread of its own) at most [`Limits::inspect`], and sends the reply,
//! with the loan's descriptors, in one `sendmsg` that never waits. A silent, slow or garbled
//! client holds one handler for at most the exchange's time, and never another tenant's.

use std::{
    collections::HashMap,
    io::Read,
    os::{
        fd::AsRawFd,
        unix::{
            fs::{DirBuilderExt, PermissionsExt},
            net::{UnixListener, UnixStream},
        },
    },
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use region::freeze_pool::{REQUEST_SIZE, Reply, Request, Status};

use super::{
    asker::Inspect,
    counters::Dropped,
    error::FreezePoolError,
    lender::{Lender, send},
};

/// Connections handled at once, at most.
pub(super) const MAX_CONNECTIONS: usize = 8;
/// Connections (and their inspections still running) of one tenant at once, at most.
pub(super) const MAX_PER_TENANT: usize = 2;

/// How long each step of an exchange may take.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// The time a client has to send its whole request.
    pub exchange: Duration,
    /// How long a handler waits for what the agent measures of the asking process.
    pub inspect: Duration,
}

impl Limits {
    /// 500 ms for the request; 2 s for the inspection (a read of the process's maps and of a
    /// region within its budget, and NVML's lists: milliseconds when nothing blocks).
    pub const DEFAULT: Limits = Limits {
        exchange: Duration::from_millis(500),
        inspect: Duration::from_secs(2),
    };
}
/// How often the accepting thread looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// Binds the pool's socket at `path`: its directory made (`0755`) if missing, a stale socket
/// replaced, refused if a live agent answers there; mode `0666` (tenants of any uid connect).
pub(super) fn bind(path: &Path) -> Result<UnixListener, FreezePoolError> {
    let socket_error = |what: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| FreezePoolError::Socket { what, path, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(socket_error("creating", dir))?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if UnixStream::connect(path).is_ok() {
            return Err(FreezePoolError::AlreadyRunning(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(socket_error("removing the stale socket", path))?;
    }
    let listener = UnixListener::bind(path).map_err(socket_error("binding", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(socket_error("setting permissions of", path))?;
    listener
        .set_nonblocking(true)
        .map_err(socket_error("setting up", path))?;
    Ok(listener)
}

/// The connections under way, in all and per tenant.
#[derive(Default)]
struct Gate {
    handlers: AtomicUsize,
    tenants: Mutex<HashMap<String, usize>>,
}

/// What the connections' handlers share.
pub(super) struct Server {
    pub lender: Arc<Lender>,
    pub inspect: Box<dyn Inspect>,
    pub limits: Limits,
    gate: Gate,
}

impl Server {
    pub fn new(lender: Arc<Lender>, inspect: Box<dyn Inspect>, limits: Limits) -> Server {
        Server {
            lender,
            inspect,
            limits,
            gate: Gate::default(),
        }
    }
}

/// A handler's place under [`MAX_CONNECTIONS`], given back when it ends.
struct HandlerSlot(Arc<Server>);

impl Drop for HandlerSlot {
    fn drop(&mut self) {
        self.0.gate.handlers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A tenant's place under [`MAX_PER_TENANT`], held by its handler and its inspection, and given
/// back once both have ended.
struct TenantSlot {
    shared: Arc<Server>,
    tenant: String,
}

impl TenantSlot {
    fn take(shared: &Arc<Server>, tenant: String) -> Option<TenantSlot> {
        let mut tenants = shared
            .gate
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = tenants.entry(tenant.clone()).or_default();
        if *n >= MAX_PER_TENANT {
            return None;
        }
        *n += 1;
        Some(TenantSlot {
            shared: Arc::clone(shared),
            tenant,
        })
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut tenants = self
            .shared
            .gate
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = tenants.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}

/// Accepts connections until the pool stops.
pub(super) fn serve(listener: UnixListener, shared: Arc<Server>) {
    while !shared.lender.stopped() {
        crate::sys::fd::wait_readable(listener.as_raw_fd(), ACCEPT_POLL);
        match listener.accept() {
            Ok((stream, _)) => admit(stream, &shared),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // Out of descriptors, or the like: the client sees its connection closed.
                log::debug!("freeze pool: accepting a connection: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Starts a handler for `stream`, or closes it at once at the cap.
fn admit(stream: UnixStream, shared: &Arc<Server>) {
    if shared.gate.handlers.fetch_add(1, Ordering::Relaxed) >= MAX_CONNECTIONS {
        shared.gate.handlers.fetch_sub(1, Ordering::Relaxed);
        shared.lender.counters.dropped(Dropped::Busy);
        return;
    }
    let slot = HandlerSlot(Arc::clone(shared));
    let spawned = std::thread::Builder::new()
        .name("fpool-conn".into())
        .spawn(move || handle(stream, slot));
    if let Err(e) = spawned {
        log::warn!("freeze pool: no thread for a connection: {e}");
    }
}

/// One exchange.
fn handle(stream: UnixStream, slot: HandlerSlot) {
    let shared = &slot.0;
    let refuse = |status: Status| {
        shared.lender.counters.refused(status);
        let _ = send(&stream, Reply::refused(status), &[]);
    };
    // Accepted sockets do not take the listener's non-blocking mode; the reads below time out.
    let _ = stream.set_nonblocking(false);
    let Ok(Some(pid)) = crate::sys::socket::peer_pid(&stream) else {
        return refuse(Status::Unknown);
    };
    let Some(tenant) = TenantSlot::take(shared, shared.inspect.tenant(pid)) else {
        shared.lender.counters.dropped(Dropped::Busy);
        return;
    };
    let request = match read_request(&stream, Instant::now() + shared.limits.exchange) {
        Ok(buf) => Request::decode(&buf),
        Err(why) => return shared.lender.counters.dropped(why),
    };
    let Ok(request) = request else {
        shared.lender.counters.dropped(Dropped::BadRequest);
        // An answer it can decode says why (another version of the protocol, garbage).
        let _ = send(&stream, Reply::refused(Status::Unknown), &[]);
        return;
    };
    let (tx, rx) = mpsc::sync_channel(1);
    let inspecting = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("fpool-ask".into())
        .spawn(move || {
            // The tenant's place is held until the inspection returns, however late.
            let _tenant = tenant;
            let _ = tx.send(inspecting.inspect.inspect(pid));
        });
    if spawned.is_err() {
        return refuse(Status::Unknown);
    }
    match rx.recv_timeout(shared.limits.inspect) {
        Ok(Ok(asked)) => shared.lender.lend(pid, request, asked, &stream),
        Ok(Err(status)) => refuse(status),
        Err(_) => {
            log::debug!(
                "freeze pool: pid {pid}: not measured within {:?}",
                shared.limits.inspect
            );
            refuse(Status::Unknown)
        }
    }
}

/// Reads exactly one request by `deadline`.
fn read_request(mut stream: &UnixStream, deadline: Instant) -> Result<[u8; REQUEST_SIZE], Dropped> {
    let mut buf = [0u8; REQUEST_SIZE];
    let mut got = 0;
    while got < REQUEST_SIZE {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(Dropped::Timeout);
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(Dropped::BadRequest),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Dropped::Timeout);
            }
            Err(_) => return Err(Dropped::BadRequest),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::{io::Write, sync::atomic::AtomicUsize};

    use region::freeze_pool::POOL_VERSION;

    use super::{
        super::{
            asker::testing::{FakeAsker, FakeInspect},
            testing::Served,
        },
        *,
    };

    const GIB: u64 = 1 << 30;

    fn reply_of(mut s: &UnixStream) -> Option<Reply> {
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        (!buf.is_empty()).then(|| Reply::decode(&buf).unwrap())
    }

    fn refusals(served: &Served, reason: &str) -> u64 {
        served.status().refusals.get(reason).copied().unwrap_or(0)
    }

    /// Bytes that are not a request (garbage, another version, a request cut short) get no
    /// loan: a refusal the client can decode where it sent 16 bytes, a closed connection where
    /// it sent fewer; each counted as a bad request. A whole request is answered after them.
    #[test]
    fn garbage_short_and_foreign_requests_are_refused_and_counted() {
        let served = Served::unprivileged(
            FakeInspect::new(FakeAsker::freezing(4 * GIB)),
            Limits::DEFAULT,
        );
        let mut garbage = served.connect();
        garbage.write_all(&[0xa5; REQUEST_SIZE]).unwrap();
        assert_eq!(reply_of(&garbage), Some(Reply::refused(Status::Unknown)));
        let mut foreign = Request { bytes: GIB }.encode();
        foreign[4..6].copy_from_slice(&(POOL_VERSION + 1).to_le_bytes());
        let mut other = served.connect();
        other.write_all(&foreign).unwrap();
        assert_eq!(reply_of(&other), Some(Reply::refused(Status::Unknown)));
        let mut short = served.connect();
        short.write_all(&foreign[..5]).unwrap();
        short.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(reply_of(&short), None, "closed without a reply");
        assert_eq!(refusals(&served, "bad_request"), 3);
        // The pool has no chunk: a whole request is decided and refused as empty.
        assert_eq!(served.ask(GIB).0, Reply::refused(Status::Empty));
        assert_eq!(refusals(&served, "empty"), 1);
    }

    /// A client that connects and sends nothing (or half a request) holds its handler until
    /// the exchange's deadline, then is closed and counted; another client is answered
    /// meanwhile at once.
    #[test]
    fn a_silent_client_is_closed_at_the_deadline_while_another_is_served() {
        let mut inspect = FakeInspect::new(FakeAsker::freezing(4 * GIB));
        let n = AtomicUsize::new(0);
        inspect.tenant = Box::new(move |_| format!("t{}", n.fetch_add(1, Ordering::Relaxed)));
        let served = Served::unprivileged(inspect, Limits::DEFAULT);
        let started = Instant::now();
        let silent = served.connect();
        let mut half = served.connect();
        half.write_all(&Request { bytes: GIB }.encode()[..8])
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let asked = Instant::now();
        assert_eq!(served.ask(GIB).0, Reply::refused(Status::Empty));
        let answered = asked.elapsed();
        assert!(answered < Duration::from_millis(250), "{answered:?}");
        assert_eq!(reply_of(&silent), None);
        assert_eq!(reply_of(&half), None);
        let closed = started.elapsed();
        assert!(
            closed >= Duration::from_millis(450) && closed < Duration::from_millis(1500),
            "{closed:?}"
        );
        assert!(served.until(Duration::from_secs(1), |s| {
            s.refusals.get("timeout") == Some(&2)
        }));
    }

    /// Past 8 connections at once, or 2 of one tenant, a new connection is closed at once and
    /// counted; once the silent ones are closed at their deadline, requests are answered again.
    #[test]
    fn connections_past_the_caps_are_closed_at_once() {
        let mut inspect = FakeInspect::new(FakeAsker::freezing(4 * GIB));
        let n = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&n);
        // Each connection a tenant of its own, until the test makes them one tenant.
        inspect.tenant = Box::new(move |_| {
            let i = counted.fetch_add(1, Ordering::Relaxed);
            if i < 1000 {
                format!("t{i}")
            } else {
                "one".to_owned()
            }
        });
        let served = Served::unprivileged(inspect, Limits::DEFAULT);
        let silent: Vec<UnixStream> = (0..MAX_CONNECTIONS).map(|_| served.connect()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let at = Instant::now();
        let refused = served.connect();
        assert_eq!(reply_of(&refused), None);
        assert!(
            at.elapsed() < Duration::from_millis(300),
            "{:?}",
            at.elapsed()
        );
        assert_eq!(refusals(&served, "busy"), 1);
        drop(silent);
        // Their handlers end at their deadline at the latest.
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(served.ask(GIB).0, Reply::refused(Status::Empty));
        // One tenant: two connections at once, a third closed at once.
        n.store(1000, Ordering::Relaxed);
        let two: Vec<UnixStream> = (0..MAX_PER_TENANT).map(|_| served.connect()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let at = Instant::now();
        let third = served.connect();
        assert_eq!(reply_of(&third), None);
        assert!(
            at.elapsed() < Duration::from_millis(300),
            "{:?}",
            at.elapsed()
        );
        assert_eq!(refusals(&served, "busy"), 2);
        drop(two);
    }

    /// An inspection that does not return (a tenant's file that blocks its read) is answered
    /// `Unknown` at the inspection's deadline; it keeps its tenant's place while it runs, so
    /// that tenant's further connections are closed at once, and another tenant is answered.
    #[test]
    fn an_inspection_that_does_not_return_holds_its_tenants_place_only() {
        let mut inspect = FakeInspect::new(FakeAsker::freezing(4 * GIB));
        let slow = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&slow);
        inspect.tenant = Box::new(move |_| {
            if counted.fetch_add(1, Ordering::Relaxed) < 3 {
                "slow".to_owned()
            } else {
                "fast".to_owned()
            }
        });
        let delays = Arc::clone(&inspect.delays);
        delays
            .lock()
            .unwrap()
            .extend([Duration::from_secs(3), Duration::from_secs(3)]);
        let limits = Limits {
            exchange: Duration::from_millis(500),
            inspect: Duration::from_millis(300),
        };
        let served = Served::unprivileged(inspect, limits);
        let at = Instant::now();
        let asks: Vec<_> = (0..2)
            .map(|_| {
                let mut s = served.connect();
                s.write_all(&Request { bytes: GIB }.encode()).unwrap();
                s
            })
            .collect();
        for s in &asks {
            assert_eq!(reply_of(s), Some(Reply::refused(Status::Unknown)));
        }
        let waited = at.elapsed();
        assert!(waited < Duration::from_millis(1500), "{waited:?}");
        // Their inspections still run: the tenant's third connection is closed at once.
        let third = served.connect();
        assert_eq!(reply_of(&third), None);
        assert_eq!(refusals(&served, "busy"), 1);
        assert_eq!(
            served.ask(GIB).0,
            Reply::refused(Status::Empty),
            "another tenant"
        );
        assert_eq!(refusals(&served, "unknown"), 2);
    }
}
