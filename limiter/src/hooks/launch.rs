//! Kernel and graph launches, the hot path: counted, timed and (under an SM limit) paced. No lock,
//! allocation, system call or environment access when no SM limit is set: once initialised, two
//! acquire loads (the state and this process's accounting), two relaxed loads for run-time limit
//! changes (the control block's generation) and one for the SM controller's switch, two clock
//! reads (`rdtsc` where the TSC is invariant), one thread-local access for the cached shard writer
//! and one seqlock section of plain stores. No hook self-time is recorded for launches (it would
//! take a third clock read); `cargo xtask bench limiter` measures it instead. Under an SM limit
//! the controller (`limiter_core::sm`) may hold the launch back before it reaches the driver; that time is
//! recorded as throttled, not as launch latency.

use std::ffi::{c_uint, c_void};

use limiter_core::accounting::Accounting as _;

use super::gate::{passthrough, shield};
use crate::{
    platform::{
        clock::Clock,
        cuda::*,
        driver::{
            DriverEnv, PfnGraphLaunch, PfnLaunchCooperativeKernel, PfnLaunchKernel,
            PfnLaunchKernelEx, Symbol, sym,
        },
    },
    runtime,
};

/// A launch hook. Once the state exists, launches skip the re-entrancy guard (two thread-local
/// accesses through `__tls_get_addr` in a shared library): a launch hook calls nothing but the real
/// function and the counters, so a launch the driver might make from inside another hook is simply
/// counted as well. Before initialisation, after a configuration error, and in a forked child
/// before its first other CUDA call, the guarded path runs.
#[inline(always)]
fn launch<S: Symbol>(call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    let rt = runtime::get();
    let (Some(state), Some(process)) = (rt.state(), rt.process()) else {
        return passthrough::<S>(call);
    };
    let Some(real) = state.driver.get::<S>() else {
        return passthrough::<S>(call);
    };
    let clock = &state.clock;
    // Off (0) in production: one predictable branch on a field already loaded.
    let hook_ns = if state.hook_delay_ns != 0 {
        debug_hook_delay(clock.get(), state.hook_delay_ns)
    } else {
        0
    };
    state.poll_control();
    let throttled = state.sm.admit(|| DriverEnv {
        driver: state.driver,
        windows: state.sm_windows(),
    });
    if throttled != 0 {
        shield(|| {
            process
                .ledger
                .record_throttled(state.api(S::SYM), throttled)
        });
    }
    let t0 = clock.now();
    let r = call(real);
    let t1 = clock.now();
    shield(|| {
        process.ledger.record_call(
            state.api(S::SYM),
            clock.get().ns_between(t0, t1),
            hook_ns,
            r == CUDA_SUCCESS,
        )
    });
    r
}

/// `VGPU_DEBUG_HOOK_DELAY_NS`: busy-waits `ns` and returns the time actually spent, which is
/// recorded as the hook's self-time.
#[cold]
#[inline(never)]
fn debug_hook_delay(clock: Clock, ns: u64) -> u64 {
    let start = clock.now();
    loop {
        let spent = clock.ns_between(start, clock.now());
        if spent >= ns {
            return spent;
        }
        std::hint::spin_loop();
    }
}

macro_rules! launch_kernel {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            stream: CUstream,
            kernel_params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            launch::<$sym>(|real: PfnLaunchKernel| {
                // SAFETY: forwards the caller's arguments unchanged to the same variant.
                unsafe {
                    real(
                        f,
                        grid_x,
                        grid_y,
                        grid_z,
                        block_x,
                        block_y,
                        block_z,
                        shared_mem_bytes,
                        stream,
                        kernel_params,
                        extra,
                    )
                }
            })
        }
    };
}

launch_kernel!(cuLaunchKernel, sym::LaunchKernel);
launch_kernel!(cuLaunchKernel_ptsz, sym::LaunchKernelPtsz);

macro_rules! launch_kernel_ex {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            kernel_params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            launch::<$sym>(|real: PfnLaunchKernelEx| unsafe {
                real(config, f, kernel_params, extra)
            })
        }
    };
}

launch_kernel_ex!(cuLaunchKernelEx, sym::LaunchKernelEx);
launch_kernel_ex!(cuLaunchKernelEx_ptsz, sym::LaunchKernelExPtsz);

macro_rules! launch_cooperative {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            stream: CUstream,
            kernel_params: *mut *mut c_void,
        ) -> CUresult {
            launch::<$sym>(|real: PfnLaunchCooperativeKernel| {
                // SAFETY: forwards the caller's arguments unchanged to the same variant.
                unsafe {
                    real(
                        f,
                        grid_x,
                        grid_y,
                        grid_z,
                        block_x,
                        block_y,
                        block_z,
                        shared_mem_bytes,
                        stream,
                        kernel_params,
                    )
                }
            })
        }
    };
}

launch_cooperative!(cuLaunchCooperativeKernel, sym::LaunchCooperativeKernel);
launch_cooperative!(
    cuLaunchCooperativeKernel_ptsz,
    sym::LaunchCooperativeKernelPtsz
);

macro_rules! graph_launch {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(graph: CUgraphExec, stream: CUstream) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            launch::<$sym>(|real: PfnGraphLaunch| unsafe { real(graph, stream) })
        }
    };
}

graph_launch!(cuGraphLaunch, sym::GraphLaunch);
graph_launch!(cuGraphLaunch_ptsz, sym::GraphLaunchPtsz);
