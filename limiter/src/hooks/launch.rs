//! Kernel and graph launches, the hot path: counted, timed and (under an SM limit) paced. No lock,
//! allocation, system call or environment access when no SM limit is set: once initialised, two
//! acquire loads (the state and this process's accounting), two relaxed loads for run-time limit
//! changes (the control block's generation) and one for the SM controller's switch, two clock
//! reads (`rdtsc` where the TSC is invariant), one thread-local access for the cached shard writer
//! and one seqlock section of plain stores. No hook self-time is recorded for launches (it would
//! take a third clock read); `cargo xtask bench limiter` measures it instead. Under an SM limit
//! the controller (`limiter_core::sm`) may hold the launch back before it reaches the driver; that time is
//! recorded as throttled, not as launch latency.
//!
//! Sampled GPU time (`runtime::gpu_time`) adds one decrement and one branch of the thread's
//! countdown per launch; at a sample point (about 200 a second per launching thread by default)
//! an out-of-line call records an event before and one after the launch on its stream.

use std::ffi::{c_uint, c_void};

use limiter_core::gpu_time::{Shape, StreamRef};

use limiter_core::accounting::Accounting as _;

use super::gate::{admit, passthrough, shield};
use crate::{
    platform::{
        clock::Clock,
        cuda::*,
        driver::{
            DriverEnv, PfnGraphLaunch, PfnLaunchCooperativeKernel, PfnLaunchKernel,
            PfnLaunchKernelEx, Symbol, sym,
        },
    },
    runtime::{
        self,
        gpu_time::{Launched, Target},
    },
};

/// A launch hook. Once the state exists, launches skip the re-entrancy guard (two thread-local
/// accesses through `__tls_get_addr` in a shared library): a launch hook calls nothing but the real
/// function and the counters, so a launch the driver might make from inside another hook is simply
/// counted as well. Before initialisation, after a configuration error, and in a forked child
/// before its first other CUDA call, the guarded path runs.
#[inline(always)]
fn launch<S: Symbol>(
    target: impl Fn() -> Target + Copy,
    call: impl FnOnce(S::Fn) -> CUresult,
) -> CUresult {
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
    let _admitted = admit(state, process);
    let mut throttled = state.sm.admit(|| DriverEnv {
        driver: state.driver,
        windows: state.sm_windows(),
        latency: &state.qos.latency,
    });
    // The launch's stream and shape (`target`) are worked out only where needed: at a sample
    // point, or after the launch of a best-effort thread beside a latency tenant.
    let gated = if state.sm.gating() {
        let (gated, waited) = shield(|| runtime::backlog::before(state)).unwrap_or((false, 0));
        throttled += waited;
        gated
    } else {
        false
    };
    if throttled != 0 {
        shield(|| {
            process
                .ledger
                .record_throttled(state.api(S::SYM), throttled)
        });
    }
    let words = rt.words();
    let sampled = if words.sample_due() {
        shield(|| runtime::gpu_time::begin(state, process, words, target)).flatten()
    } else {
        None
    };
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
    if let Some(s) = sampled {
        shield(|| runtime::gpu_time::end(process, s, r == CUDA_SUCCESS));
    }
    if gated && r == CUDA_SUCCESS {
        shield(|| runtime::backlog::after(state, target().stream));
    }
    r
}

/// The target of a kernel launch on `stream` with `geometry` (grid, block, dynamic shared
/// memory).
#[inline(always)]
fn kernel(
    f: CUfunction,
    stream: CUstream,
    per_thread: bool,
    (grid, block, shared_bytes): ([u32; 3], [u32; 3], u32),
) -> Target {
    Target {
        launched: Launched::Kernel(f),
        stream: StreamRef {
            handle: stream as u64,
            per_thread,
        },
        shape: Shape::kernel(f as u64, grid, block, shared_bytes),
    }
}

/// `CUlaunchConfig::hStream`'s offset: after seven `unsigned int`s, aligned to a pointer.
const LAUNCH_CONFIG_STREAM: usize = 32;

/// The stream and geometry of a `cuLaunchKernelEx` configuration (read at sample points only).
fn config_target(f: CUfunction, config: *const CUlaunchConfig, per_thread: bool) -> Target {
    if config.is_null() {
        return kernel(f, std::ptr::null_mut(), per_thread, ([0; 3], [0; 3], 0));
    }
    // SAFETY: a non-null configuration the application passed, a `CUlaunchConfig` that starts
    // with seven `unsigned int`s (grid x, y, z, block x, y, z, shared memory bytes) and has
    // `hStream` at its offset (cuda.h); read unaligned in case it is packed.
    let (dims, stream) = unsafe {
        let bytes = config.cast::<u8>();
        (
            bytes.cast::<[c_uint; 7]>().read_unaligned(),
            bytes
                .add(LAUNCH_CONFIG_STREAM)
                .cast::<CUstream>()
                .read_unaligned(),
        )
    };
    kernel(
        f,
        stream,
        per_thread,
        (
            [dims[0], dims[1], dims[2]],
            [dims[3], dims[4], dims[5]],
            dims[6],
        ),
    )
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
    ($name:ident, $sym:ty, $per_thread:literal) => {
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
            launch::<$sym>(
                || {
                    kernel(
                        f,
                        stream,
                        $per_thread,
                        (
                            [grid_x, grid_y, grid_z],
                            [block_x, block_y, block_z],
                            shared_mem_bytes,
                        ),
                    )
                },
                |real: PfnLaunchKernel| {
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
                },
            )
        }
    };
}

launch_kernel!(cuLaunchKernel, sym::LaunchKernel, false);
launch_kernel!(cuLaunchKernel_ptsz, sym::LaunchKernelPtsz, true);

macro_rules! launch_kernel_ex {
    ($name:ident, $sym:ty, $per_thread:literal) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            config: *const CUlaunchConfig,
            f: CUfunction,
            kernel_params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            launch::<$sym>(
                || config_target(f, config, $per_thread),
                // SAFETY: forwards the caller's arguments unchanged to the same variant.
                |real: PfnLaunchKernelEx| unsafe { real(config, f, kernel_params, extra) },
            )
        }
    };
}

launch_kernel_ex!(cuLaunchKernelEx, sym::LaunchKernelEx, false);
launch_kernel_ex!(cuLaunchKernelEx_ptsz, sym::LaunchKernelExPtsz, true);

macro_rules! launch_cooperative {
    ($name:ident, $sym:ty, $per_thread:literal) => {
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
            launch::<$sym>(
                || {
                    kernel(
                        f,
                        stream,
                        $per_thread,
                        (
                            [grid_x, grid_y, grid_z],
                            [block_x, block_y, block_z],
                            shared_mem_bytes,
                        ),
                    )
                },
                |real: PfnLaunchCooperativeKernel| {
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
                },
            )
        }
    };
}

launch_cooperative!(
    cuLaunchCooperativeKernel,
    sym::LaunchCooperativeKernel,
    false
);
launch_cooperative!(
    cuLaunchCooperativeKernel_ptsz,
    sym::LaunchCooperativeKernelPtsz,
    true
);

macro_rules! graph_launch {
    ($name:ident, $sym:ty, $per_thread:literal) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(graph: CUgraphExec, stream: CUstream) -> CUresult {
            launch::<$sym>(
                || Target {
                    launched: Launched::Graph,
                    stream: StreamRef {
                        handle: stream as u64,
                        per_thread: $per_thread,
                    },
                    shape: Shape::graph(graph as u64),
                },
                // SAFETY: forwards the caller's arguments unchanged to the same variant.
                |real: PfnGraphLaunch| unsafe { real(graph, stream) },
            )
        }
    };
}

graph_launch!(cuGraphLaunch, sym::GraphLaunch, false);
graph_launch!(cuGraphLaunch_ptsz, sym::GraphLaunchPtsz, true);
