//! How every hook starts and records.
//!
//! Every hook starts with [`enter`], which decides between three paths:
//! - [`Gate::Direct`]: the thread is already inside the limiter (the driver calling back into an
//!   interposed name): call the real function and nothing else;
//! - [`Gate::Fail`]: the limiter is misconfigured or the driver lacks the symbol: return the code
//!   without calling the driver;
//! - [`Gate::Hook`]: run the limiter's logic around the real call. That logic runs inside
//!   [`shield`] so a panic is counted and the call still reaches the driver; the
//!   driver call itself is never inside a `catch_unwind` and never made twice.

use std::ffi::c_void;

use limiter_core::accounting::{Accounting as _, Call};

use crate::{
    platform::{
        cuda::{CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CUresult},
        driver::{Sym, Symbol, next_definition},
        guard::Reentry,
        nvml::Nvml,
    },
    runtime::{self, Runtime, own_freeze::Admitted, process::Process, state::State},
};

/// How a hook proceeds.
pub(crate) enum Gate<F> {
    Direct(F),
    Fail(CUresult),
    Hook(Hooked<F>),
}

/// A call that runs the limiter's logic. The re-entrancy guard is held until this is dropped, so
/// driver callbacks made during the real call go straight to the driver.
pub(crate) struct Hooked<F> {
    pub(crate) real: F,
    pub(crate) state: &'static State,
    /// This process's accounting (created at its first hooked call).
    pub(crate) process: &'static Process,
    /// Clock reading at entry, for the hook's self-time.
    pub(crate) entered: u64,
    /// Counted in the in-process freeze's gate until the call ends (`VGPU_FREEZE_IN_PROCESS`).
    _admitted: Option<Admitted<'static>>,
    _guard: Reentry,
}

impl<F> Hooked<F> {
    /// Records a call that spent `t0..t1` in the driver, and the rest since entry in the limiter.
    #[inline]
    pub(crate) fn record(&self, sym: Sym, t0: u64, t1: u64, ok: bool) {
        self.record_bytes(sym, t0, t1, ok, (0, 0));
    }

    /// [`Hooked::record`] of a call that allocated and freed `(allocated, freed)` bytes, in one
    /// record. The self-time runs from entry to the driver call and from its return to the end
    /// of the record itself.
    #[inline(always)]
    pub(crate) fn record_bytes(&self, sym: Sym, t0: u64, t1: u64, ok: bool, bytes: (u64, u64)) {
        // The API id is a constant where `sym` is (every hook): one shared, non-generic body.
        let times = [self.entered, t0, t1];
        record_call(self.state, self.process, sym.api(), times, ok, bytes);
    }
}

/// The body of [`Hooked::record_bytes`], once per module of hooks, not once per hook signature
/// (`#[inline]` makes a local copy per codegen unit, called directly rather than through the GOT;
/// in `.text.hot`: see `hints`).
#[inline]
#[unsafe(link_section = ".text.hot.vgpu")]
fn record_call(
    state: &State,
    process: &Process,
    api: agent_common::api::ApiId,
    [entered, t0, t1]: [u64; 3],
    ok: bool,
    (allocated, freed): (u64, u64),
) {
    let clock = state.clock.get();
    let call = Call {
        latency_ns: clock.ns_between(t0, t1),
        ok,
        bytes_allocated: allocated,
        bytes_freed: freed,
        bytes_moved: 0,
    };
    process.ledger.record(api, call, || {
        clock.ns_between(entered, t0) + clock.ns_between(t1, clock.now())
    });
}

/// Runs `f`, turning a panic into `None` (counted in the runtime).
#[inline]
pub(crate) fn shield<T>(f: impl FnOnce() -> T) -> Option<T> {
    runtime::get().shield(f)
}

impl<F> Hooked<F> {
    /// A hooked call with `real` under `state` and `process`, from now on. For the hooks'
    /// in-process tests, which build their own state, process and driver table.
    #[cfg(test)]
    pub(crate) fn new(real: F, state: &'static State, process: &'static Process) -> Hooked<F> {
        Hooked {
            real,
            state,
            process,
            entered: state.clock.now(),
            _admitted: None,
            _guard: Reentry::enter(state.tls.words()).expect("a test enters once"),
        }
    }
}

/// How every hook starts: see the module documentation.
#[inline]
pub(crate) fn enter<S: Symbol>() -> Gate<S::Fn> {
    let rt = runtime::get();
    let Some(guard) = rt.enter() else {
        return reentered::<S>(rt);
    };
    // The common case, once the state and this process exist: two loads of the hot line, nothing
    // that can panic (so no unwinding landing pad in every hook's hot code).
    let (Some(state), Some(process)) = (rt.state(), rt.process()) else {
        return enter_slow::<S>(rt, guard);
    };
    hooked::<S>(state, process, guard)
}

/// Counts the call in the in-process freeze's gate, if the path is on (thawing the process
/// first if it is frozen): every hook that calls the driver holds this until the driver
/// returns. Off, one predictable branch on a field of the state's first line.
#[inline(always)]
pub(crate) fn admit(state: &'static State, process: &'static Process) -> Option<Admitted<'static>> {
    state
        .own_freeze
        .map(|own| own.admit(|| runtime::own_freeze_tenant(state, process)))
}

/// The rest of [`enter`] once the state and the process are at hand.
#[inline(always)]
fn hooked<S: Symbol>(
    state: &'static State,
    process: &'static Process,
    guard: Reentry,
) -> Gate<S::Fn> {
    // While the process is frozen in-process, the call thaws it here, before it is timed.
    let admitted = admit(state, process);
    let entered = state.clock.now();
    // Allocations and other calls notice limit changes too (a process that does not launch).
    state.poll_control_due(entered);
    match state.driver.get::<S>() {
        Some(real) => Gate::Hook(Hooked {
            real,
            state,
            process,
            entered,
            _admitted: admitted,
            _guard: guard,
        }),
        None => Gate::Fail(CUDA_ERROR_NOT_FOUND),
    }
}

/// [`enter`] on a thread already inside the limiter: straight to the driver (the bound table if
/// there is one, else the next definition after this library: the driver is being bound on this
/// very thread).
#[cold]
#[inline(never)]
fn reentered<S: Symbol>(rt: &'static Runtime) -> Gate<S::Fn> {
    let real = match rt.bound_driver() {
        Some(d) => d.get::<S>(),
        None => rt.real_dlsym().and_then(next_definition::<S>),
    };
    match real {
        Some(f) => Gate::Direct(f),
        None => Gate::Fail(CUDA_ERROR_NOT_FOUND),
    }
}

/// [`enter`] before the state or this process exists (the first calls, or the first in a
/// forked child): initialises them, inside [`shield`].
#[cold]
#[inline(never)]
fn enter_slow<S: Symbol>(rt: &'static Runtime, guard: Reentry) -> Gate<S::Fn> {
    let ready = rt.shield(|| {
        rt.state_or_init(&guard)
            .map(|s| (s, rt.process_or_create(s)))
    });
    let (state, process) = match ready {
        Some(Ok(s)) => s,
        Some(Err(code)) => return Gate::Fail(code),
        // A panic while initialising: fall through to the driver if it is bound.
        None => {
            return match rt.bound_driver().and_then(|d| d.get::<S>()) {
                Some(f) => Gate::Direct(f),
                None => Gate::Fail(CUDA_ERROR_NOT_INITIALIZED),
            };
        }
    };
    hooked::<S>(state, process, guard)
}

/// A pass-through hook: the call is counted and timed, nothing else.
#[inline]
pub(crate) fn passthrough<S: Symbol>(call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    match enter::<S>() {
        Gate::Direct(f) => call(f),
        Gate::Fail(code) => code,
        Gate::Hook(h) => {
            let t0 = h.state.clock.now();
            let r = call(h.real);
            let t1 = h.state.clock.now();
            shield(|| h.record(S::SYM, t0, t1, r == 0));
            r
        }
    }
}

/// Runs `f` with the state, this process's accounting (if it exists yet) and the bound NVML,
/// unless the thread is already inside the limiter or the state or NVML is unavailable (then
/// `None`: the caller passes the call through). For the NVML hooks.
pub(crate) fn with_nvml<T>(
    f: impl FnOnce(&'static State, Option<&'static Process>, &'static Nvml) -> T,
) -> Option<T> {
    let rt = runtime::get();
    let guard = rt.enter()?;
    shield(|| {
        let state = match rt.state() {
            Some(s) => s,
            None => rt.state_or_init(&guard).ok()?,
        };
        Some(f(state, rt.process(), rt.nvml()?))
    })
    .flatten()
}

/// A hook's address as the C ABI sees it.
pub(crate) fn address(f: *const ()) -> *mut c_void {
    f.cast_mut().cast()
}
