//! Synchronisations, copies and host-function launches: counted and timed, copies with their
//! bytes, and the control block looked at when due (a limit change, a freeze), nothing else. Recording them here, exactly, is what lets the agent leave these calls of
//! a process under the limiter unprobed (a uprobe hit costs microseconds; this costs a clock
//! pair and one seqlock section).
//!
//! The path is the launch hook's (see `launch`): once initialised, no re-entrancy guard, no lock,
//! allocation or system call: the state and this process's accounting, two clock reads and one
//! record. A copy's record also touches the word of its bytes. Before initialisation, after a
//! configuration error, and in a forked child before its first other CUDA call, the guarded
//! [`passthrough`] runs.

use std::ffi::{c_uint, c_void};

use limiter_core::accounting::{Accounting as _, Call};

use super::gate::{admit, passthrough, shield};
use crate::{
    platform::{
        cuda::*,
        driver::{
            PfnCtxSynchronize, PfnCtxSynchronizeV2, PfnEventSynchronize, PfnLaunchHostFunc,
            PfnMemcpy, PfnMemcpyAsync, PfnMemcpyBatchAsync, PfnMemcpyBatchAsyncV2, PfnMemcpyDtoH,
            PfnMemcpyDtoHAsync, PfnMemcpyHtoD, PfnMemcpyHtoDAsync, PfnMemcpyPeer,
            PfnMemcpyPeerAsync, PfnStreamSynchronize, PfnStreamWaitEvent, Symbol, sym,
        },
    },
    runtime,
};

/// Calls the real `S` and records the call and the bytes it copied (`bytes` is given whether the
/// call succeeded).
#[inline(always)]
fn timed<S: Symbol>(
    bytes: impl FnOnce(bool) -> u64,
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
    let t0 = clock.now();
    // Copies and synchronisations notice limit changes and a freeze too (a process that only
    // waits on its streams), before the driver holds the call.
    state.poll_control_due(t0);
    let _admitted = admit(state, process);
    let r = call(real);
    let t1 = clock.now();
    shield(|| {
        let ok = r == CUDA_SUCCESS;
        let c = Call {
            latency_ns: clock.get().ns_between(t0, t1),
            ok,
            bytes_moved: bytes(ok),
            ..Call::default()
        };
        process.ledger.record(state.api(S::SYM), c, || 0)
    });
    r
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    // SAFETY: the same function, no arguments.
    timed::<sym::CtxSynchronize>(|_| 0, |real: PfnCtxSynchronize| unsafe { real() })
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnCtxSynchronizeV2| unsafe { real(ctx) };
    timed::<sym::CtxSynchronizeV2>(|_| 0, forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnEventSynchronize| unsafe { real(event) };
    timed::<sym::EventSynchronize>(|_| 0, forward)
}

macro_rules! stream_synchronize {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(stream: CUstream) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnStreamSynchronize| unsafe { real(stream) };
            timed::<$sym>(|_| 0, forward)
        }
    };
}

stream_synchronize!(cuStreamSynchronize, sym::StreamSynchronize);
stream_synchronize!(cuStreamSynchronize_ptsz, sym::StreamSynchronizePtsz);

macro_rules! stream_wait_event {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            stream: CUstream,
            event: CUevent,
            flags: c_uint,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnStreamWaitEvent| unsafe { real(stream, event, flags) };
            timed::<$sym>(|_| 0, forward)
        }
    };
}

stream_wait_event!(cuStreamWaitEvent, sym::StreamWaitEvent);
stream_wait_event!(cuStreamWaitEvent_ptsz, sym::StreamWaitEventPtsz);

macro_rules! launch_host_func {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            stream: CUstream,
            func: CUhostFn,
            user_data: *mut c_void,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnLaunchHostFunc| unsafe { real(stream, func, user_data) };
            timed::<$sym>(|_| 0, forward)
        }
    };
}

launch_host_func!(cuLaunchHostFunc, sym::LaunchHostFunc);
launch_host_func!(cuLaunchHostFunc_ptsz, sym::LaunchHostFuncPtsz);

/// A copy of `(destination, source, bytes)`, synchronous.
macro_rules! copy {
    ($name:ident, $sym:ty, $pfn:ty, $dst:ty, $src:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(dst: $dst, src: $src, bytes: usize) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: $pfn| unsafe { real(dst, src, bytes) };
            timed::<$sym>(|_| bytes as u64, forward)
        }
    };
}

/// A copy of `(destination, source, bytes)` on a stream.
macro_rules! copy_async {
    ($name:ident, $sym:ty, $pfn:ty, $dst:ty, $src:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            dst: $dst,
            src: $src,
            bytes: usize,
            stream: CUstream,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: $pfn| unsafe { real(dst, src, bytes, stream) };
            timed::<$sym>(|_| bytes as u64, forward)
        }
    };
}

type Dev = CUdeviceptr;
type Host = *const c_void;
type HostMut = *mut c_void;

copy!(cuMemcpy, sym::Memcpy, PfnMemcpy, Dev, Dev);
copy!(cuMemcpy_ptds, sym::MemcpyPtds, PfnMemcpy, Dev, Dev);
copy!(cuMemcpyHtoD_v2, sym::MemcpyHtoDV2, PfnMemcpyHtoD, Dev, Host);
copy!(
    cuMemcpyHtoD_v2_ptds,
    sym::MemcpyHtoDV2Ptds,
    PfnMemcpyHtoD,
    Dev,
    Host
);
copy!(
    cuMemcpyDtoH_v2,
    sym::MemcpyDtoHV2,
    PfnMemcpyDtoH,
    HostMut,
    Dev
);
copy!(
    cuMemcpyDtoH_v2_ptds,
    sym::MemcpyDtoHV2Ptds,
    PfnMemcpyDtoH,
    HostMut,
    Dev
);
copy!(cuMemcpyDtoD_v2, sym::MemcpyDtoDV2, PfnMemcpy, Dev, Dev);
copy!(
    cuMemcpyDtoD_v2_ptds,
    sym::MemcpyDtoDV2Ptds,
    PfnMemcpy,
    Dev,
    Dev
);
copy_async!(cuMemcpyAsync, sym::MemcpyAsync, PfnMemcpyAsync, Dev, Dev);
copy_async!(
    cuMemcpyAsync_ptsz,
    sym::MemcpyAsyncPtsz,
    PfnMemcpyAsync,
    Dev,
    Dev
);
copy_async!(
    cuMemcpyHtoDAsync_v2,
    sym::MemcpyHtoDAsyncV2,
    PfnMemcpyHtoDAsync,
    Dev,
    Host
);
copy_async!(
    cuMemcpyHtoDAsync_v2_ptsz,
    sym::MemcpyHtoDAsyncV2Ptsz,
    PfnMemcpyHtoDAsync,
    Dev,
    Host
);
copy_async!(
    cuMemcpyDtoHAsync_v2,
    sym::MemcpyDtoHAsyncV2,
    PfnMemcpyDtoHAsync,
    HostMut,
    Dev
);
copy_async!(
    cuMemcpyDtoHAsync_v2_ptsz,
    sym::MemcpyDtoHAsyncV2Ptsz,
    PfnMemcpyDtoHAsync,
    HostMut,
    Dev
);
copy_async!(
    cuMemcpyDtoDAsync_v2,
    sym::MemcpyDtoDAsyncV2,
    PfnMemcpyAsync,
    Dev,
    Dev
);
copy_async!(
    cuMemcpyDtoDAsync_v2_ptsz,
    sym::MemcpyDtoDAsyncV2Ptsz,
    PfnMemcpyAsync,
    Dev,
    Dev
);

macro_rules! copy_peer {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnMemcpyPeer| unsafe { real(dst, dst_ctx, src, src_ctx, bytes) };
            timed::<$sym>(|_| bytes as u64, forward)
        }
    };
}

copy_peer!(cuMemcpyPeer, sym::MemcpyPeer);
copy_peer!(cuMemcpyPeer_ptds, sym::MemcpyPeerPtds);

macro_rules! copy_peer_async {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
            stream: CUstream,
        ) -> CUresult {
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnMemcpyPeerAsync| unsafe {
                real(dst, dst_ctx, src, src_ctx, bytes, stream)
            };
            timed::<$sym>(|_| bytes as u64, forward)
        }
    };
}

copy_peer_async!(cuMemcpyPeerAsync, sym::MemcpyPeerAsync);
copy_peer_async!(cuMemcpyPeerAsync_ptsz, sym::MemcpyPeerAsyncPtsz);

/// The bytes a batch of copies moved: the sum of its `count` sizes (0 where `sizes` is null).
///
/// # Safety
/// `sizes` is null or points to `count` readable `size_t`: read only after the driver accepted
/// the batch, which it read them for.
unsafe fn batch_bytes(sizes: *const usize, count: usize) -> u64 {
    if sizes.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract, above.
    let sizes = unsafe { std::slice::from_raw_parts(sizes, count) };
    sizes
        .iter()
        .fold(0u64, |sum, &n| sum.wrapping_add(n as u64))
}

macro_rules! copy_batch {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut CUmemcpyAttributes,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            fail_idx: *mut usize,
            stream: CUstream,
        ) -> CUresult {
            let bytes = |ok: bool| {
                if ok {
                    // SAFETY: read only once the driver accepted the batch, which it read
                    // `count` sizes of.
                    unsafe { batch_bytes(sizes, count) }
                } else {
                    0
                }
            };
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnMemcpyBatchAsync| unsafe {
                real(
                    dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream,
                )
            };
            timed::<$sym>(bytes, forward)
        }
    };
}

copy_batch!(cuMemcpyBatchAsync, sym::MemcpyBatchAsync);
copy_batch!(cuMemcpyBatchAsync_ptsz, sym::MemcpyBatchAsyncPtsz);

macro_rules! copy_batch_v2 {
    ($name:ident, $sym:ty) => {
        /// # Safety
        /// The caller follows the contract of the driver function of the same name.
        #[unsafe(no_mangle)]
        pub(crate) unsafe extern "C" fn $name(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut CUmemcpyAttributes,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            stream: CUstream,
        ) -> CUresult {
            let bytes = |ok: bool| {
                if ok {
                    // SAFETY: read only once the driver accepted the batch, which it read
                    // `count` sizes of.
                    unsafe { batch_bytes(sizes, count) }
                } else {
                    0
                }
            };
            // SAFETY: forwards the caller's arguments unchanged to the same variant.
            let forward = |real: PfnMemcpyBatchAsyncV2| unsafe {
                real(
                    dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream,
                )
            };
            timed::<$sym>(bytes, forward)
        }
    };
}

copy_batch_v2!(cuMemcpyBatchAsync_v2, sym::MemcpyBatchAsyncV2);
copy_batch_v2!(cuMemcpyBatchAsync_v2_ptsz, sym::MemcpyBatchAsyncV2Ptsz);
