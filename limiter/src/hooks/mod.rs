//! The exported hooks: one `extern "C"` function per hooked driver symbol and ABI variant, each
//! forwarding to the real function of exactly the same name.
//!
//! Every hook starts with [`enter`], which decides between three paths:
//! - [`Gate::Direct`]: the thread is already inside the limiter (the driver calling back into an
//!   interposed name): call the real function and nothing else;
//! - [`Gate::Fail`]: the limiter is misconfigured or the driver lacks the symbol: return the code
//!   without calling the driver;
//! - [`Gate::Hook`]: run the limiter's logic around the real call. That logic runs inside
//!   [`crate::guard::shield`] so a panic is counted and the call still reaches the driver; the
//!   driver call itself is never inside a `catch_unwind` and never made twice.

pub mod info;
pub mod init;
pub mod launch;
pub mod memory;
pub mod procaddress;

use std::ffi::c_void;

use crate::{
    accounting::{Accounting as _, Call},
    cuda::{CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CUresult},
    guard::{self, Reentry},
    process::{self, Process},
    real_driver::{self, Sym, Symbol},
    state::{self, State},
};

/// How a hook proceeds.
pub enum Gate<F> {
    Direct(F),
    Fail(CUresult),
    Hook(Hooked<F>),
}

/// A call that runs the limiter's logic. The re-entrancy guard is held until this is dropped, so
/// driver callbacks made during the real call go straight to the driver.
pub struct Hooked<F> {
    pub real: F,
    pub state: &'static State,
    /// This process's accounting (created at its first hooked call).
    pub process: &'static Process,
    /// Clock reading at entry, for the hook's self-time.
    pub entered: u64,
    _guard: Reentry,
}

impl<F> Hooked<F> {
    /// Records a call that spent `t0..t1` in the driver, and the rest since entry in the limiter.
    #[inline]
    pub fn record(&self, sym: Sym, t0: u64, t1: u64, ok: bool) {
        self.record_bytes(sym, t0, t1, ok, (0, 0));
    }

    /// [`Hooked::record`] of a call that allocated and freed `(allocated, freed)` bytes, in one
    /// record. The self-time runs from entry to the driver call and from its return to the end
    /// of the record itself.
    #[inline(always)]
    pub fn record_bytes(&self, sym: Sym, t0: u64, t1: u64, ok: bool, bytes: (u64, u64)) {
        // The API id is a constant where `sym` is (every hook): one shared, non-generic body.
        let times = [self.entered, t0, t1];
        record_call(self.state, self.process, sym.api(), times, ok, bytes);
    }
}

/// The body of [`Hooked::record_bytes`], once per module of hooks, not once per hook signature
/// (`#[inline]` makes a local copy per codegen unit, called directly rather than through the GOT).
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
    };
    process.ledger.record(api, call, || {
        clock.ns_between(entered, t0) + clock.ns_between(t1, clock.now())
    });
}

#[inline]
pub fn enter<S: Symbol>() -> Gate<S::Fn> {
    let Some(guard) = Reentry::enter() else {
        return reentered::<S>();
    };
    // The common case, once the state and this process exist: two loads of the hot line, nothing
    // that can panic (so no unwinding landing pad in every hook's hot code).
    let (Some(state), Some(process)) = (state::ready_fast(), process::ready()) else {
        return enter_slow::<S>(guard);
    };
    hooked::<S>(state, process, guard)
}

/// The rest of [`enter`] once the state and the process are at hand.
#[inline(always)]
fn hooked<S: Symbol>(
    state: &'static State,
    process: &'static Process,
    guard: Reentry,
) -> Gate<S::Fn> {
    let entered = state.clock.now();
    // Allocations and other calls notice limit changes too (a process that does not launch).
    state.poll_control_due(entered);
    match state.driver.get::<S>() {
        Some(real) => Gate::Hook(Hooked {
            real,
            state,
            process,
            entered,
            _guard: guard,
        }),
        None => Gate::Fail(CUDA_ERROR_NOT_FOUND),
    }
}

/// [`enter`] on a thread already inside the limiter: straight to the driver.
#[cold]
#[inline(never)]
fn reentered<S: Symbol>() -> Gate<S::Fn> {
    match real_driver::reentrant::<S>() {
        Some(f) => Gate::Direct(f),
        None => Gate::Fail(CUDA_ERROR_NOT_FOUND),
    }
}

/// [`enter`] before the state or this process exists (the first calls, or the first in a
/// forked child): initialises them, inside [`guard::shield`].
#[cold]
#[inline(never)]
fn enter_slow<S: Symbol>(guard: Reentry) -> Gate<S::Fn> {
    let state = match guard::shield(|| state::get(&guard).map(|s| (s, process::current(s)))) {
        Some(Ok(s)) => s,
        Some(Err(code)) => return Gate::Fail(code),
        // A panic while initialising: fall through to the driver if it is bound.
        None => {
            return match real_driver::bound().and_then(|d| d.get::<S>()) {
                Some(f) => Gate::Direct(f),
                None => Gate::Fail(CUDA_ERROR_NOT_INITIALIZED),
            };
        }
    };
    let (state, process) = state;
    hooked::<S>(state, process, guard)
}

/// A pass-through hook: the call is counted and timed, nothing else.
#[inline]
pub fn passthrough<S: Symbol>(call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    match enter::<S>() {
        Gate::Direct(f) => call(f),
        Gate::Fail(code) => code,
        Gate::Hook(h) => {
            let t0 = h.state.clock.now();
            let r = call(h.real);
            let t1 = h.state.clock.now();
            guard::shield(|| h.record(S::SYM, t0, t1, r == 0));
            r
        }
    }
}

/// The address of this library's hook for `sym`, `None` for symbols that are only used.
pub fn hook_addr(sym: Sym) -> Option<*mut c_void> {
    use self::{info::*, init::*, launch::*, memory::*, procaddress::*};
    let f: *const () = match sym {
        Sym::Init => cuInit as *const (),
        Sym::GetProcAddress => cuGetProcAddress as *const (),
        Sym::GetProcAddressV2 => cuGetProcAddress_v2 as *const (),
        Sym::MemAllocV2 => cuMemAlloc_v2 as *const (),
        Sym::MemAllocPitchV2 => cuMemAllocPitch_v2 as *const (),
        Sym::MemAllocManaged => cuMemAllocManaged as *const (),
        Sym::MemAllocAsync => cuMemAllocAsync as *const (),
        Sym::MemAllocAsyncPtsz => cuMemAllocAsync_ptsz as *const (),
        Sym::MemAllocFromPoolAsync => cuMemAllocFromPoolAsync as *const (),
        Sym::MemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz as *const (),
        Sym::MemFreeV2 => cuMemFree_v2 as *const (),
        Sym::MemFreeAsync => cuMemFreeAsync as *const (),
        Sym::MemFreeAsyncPtsz => cuMemFreeAsync_ptsz as *const (),
        Sym::MemCreate => cuMemCreate as *const (),
        Sym::MemRelease => cuMemRelease as *const (),
        Sym::MemMap => cuMemMap as *const (),
        Sym::MemPoolCreate => cuMemPoolCreate as *const (),
        Sym::MemPoolDestroy => cuMemPoolDestroy as *const (),
        Sym::MemPoolTrimTo => cuMemPoolTrimTo as *const (),
        Sym::MemGetInfoV2 => cuMemGetInfo_v2 as *const (),
        Sym::DeviceTotalMemV2 => cuDeviceTotalMem_v2 as *const (),
        Sym::LaunchKernel => cuLaunchKernel as *const (),
        Sym::LaunchKernelPtsz => cuLaunchKernel_ptsz as *const (),
        Sym::LaunchKernelEx => cuLaunchKernelEx as *const (),
        Sym::LaunchKernelExPtsz => cuLaunchKernelEx_ptsz as *const (),
        Sym::LaunchCooperativeKernel => cuLaunchCooperativeKernel as *const (),
        Sym::LaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz as *const (),
        Sym::GraphLaunch => cuGraphLaunch as *const (),
        Sym::GraphLaunchPtsz => cuGraphLaunch_ptsz as *const (),
        Sym::CtxGetDevice
        | Sym::CtxSynchronize
        | Sym::MemPoolGetAttribute
        | Sym::DeviceGetMemPool
        | Sym::DeviceGetUuidV2
        | Sym::DeviceGetCount => return None,
    };
    Some(f.cast_mut().cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hooked_symbol_has_a_distinct_hook() {
        let mut seen = Vec::new();
        for &s in Sym::ALL {
            let addr = hook_addr(s);
            assert_eq!(addr.is_some(), s.hooked(), "{s:?}");
            if let Some(a) = addr {
                assert!(!seen.contains(&a), "{s:?} shares a hook");
                seen.push(a);
            }
        }
    }
}
