//! Memsets, 2D/3D copies, copies between arrays and linear memory, and stream memory operations:
//! passed on, the control block looked at when due (a limit change, a freeze), as the copies'
//! hooks do ([`super::timed`]). They are not recorded: the shared API table has no room for their
//! 62 variants (`agent_common::api::API_SLOTS`). Hooked so that a frozen container whose next
//! call is one of them (CuPy's `zeros`, a JAX zero fill, a pitched copy, NCCL's stream
//! write) asks for its thaw before the driver holds the call, and so that the in-process
//! freeze's gate holds it while the memory is away, as every other kind is.

use std::ffi::{c_uint, c_void};

use super::gate::{admit, passthrough};
use crate::{
    platform::{
        cuda::*,
        driver::{Symbol, sym},
    },
    runtime,
};

/// Looks at the control block when due, then calls the real `S` (before initialisation and
/// after a configuration error, the guarded [`passthrough`]).
#[inline(always)]
fn passed_on<S: Symbol>(call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    let rt = runtime::get();
    let (Some(state), Some(process)) = (rt.state(), rt.process()) else {
        return passthrough::<S>(call);
    };
    let Some(real) = state.driver.get::<S>() else {
        return passthrough::<S>(call);
    };
    // A frozen container's call asks for its thaw here, before the driver holds it.
    state.poll_control_due(state.clock.now());
    let _admitted = admit(state, process);
    call(real)
}

/// One hook per line: `name(args) = Sym`, each forwarding its arguments unchanged to the real
/// function of the same name through [`passed_on`].
macro_rules! passed_on_hooks {
    ($($name:ident($($arg:ident: $ty:ty),*) = $sym:ident;)*) => {
        $(
            /// # Safety
            /// The caller follows the contract of the driver function of the same name.
            #[unsafe(no_mangle)]
            pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                passed_on::<sym::$sym>(|real| {
                    // SAFETY: forwards the caller's arguments unchanged to the same variant,
                    // whose signature `sym::$sym` names.
                    unsafe { real($($arg),*) }
                })
            }
        )*
    };
}

passed_on_hooks! {
    cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) = MemsetD8V2;
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, n: usize) = MemsetD8V2Ptds;
    cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) = MemsetD2D8V2;
    cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) = MemsetD2D8V2Ptds;
    cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) = MemsetD8Async;
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) = MemsetD8AsyncPtsz;
    cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream) = MemsetD2D8Async;
    cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream) = MemsetD2D8AsyncPtsz;
    cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) = MemsetD16V2;
    cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, n: usize) = MemsetD16V2Ptds;
    cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) = MemsetD2D16V2;
    cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) = MemsetD2D16V2Ptds;
    cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, stream: CUstream) = MemsetD16Async;
    cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, n: usize, stream: CUstream) = MemsetD16AsyncPtsz;
    cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: CUstream) = MemsetD2D16Async;
    cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: CUstream) = MemsetD2D16AsyncPtsz;
    cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) = MemsetD32V2;
    cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, n: usize) = MemsetD32V2Ptds;
    cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) = MemsetD2D32V2;
    cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) = MemsetD2D32V2Ptds;
    cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) = MemsetD32Async;
    cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) = MemsetD32AsyncPtsz;
    cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) = MemsetD2D32Async;
    cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream) = MemsetD2D32AsyncPtsz;
    cuMemcpy2D_v2(desc: *const c_void) = Memcpy2DV2;
    cuMemcpy2D_v2_ptds(desc: *const c_void) = Memcpy2DV2Ptds;
    cuMemcpy2DUnaligned_v2(desc: *const c_void) = Memcpy2DUnalignedV2;
    cuMemcpy2DUnaligned_v2_ptds(desc: *const c_void) = Memcpy2DUnalignedV2Ptds;
    cuMemcpy2DAsync_v2(desc: *const c_void, stream: CUstream) = Memcpy2DAsyncV2;
    cuMemcpy2DAsync_v2_ptsz(desc: *const c_void, stream: CUstream) = Memcpy2DAsyncV2Ptsz;
    cuMemcpy3D_v2(desc: *const c_void) = Memcpy3DV2;
    cuMemcpy3D_v2_ptds(desc: *const c_void) = Memcpy3DV2Ptds;
    cuMemcpy3DAsync_v2(desc: *const c_void, stream: CUstream) = Memcpy3DAsyncV2;
    cuMemcpy3DAsync_v2_ptsz(desc: *const c_void, stream: CUstream) = Memcpy3DAsyncV2Ptsz;
    cuMemcpy3DPeer(desc: *const c_void) = Memcpy3DPeer;
    cuMemcpy3DPeer_ptds(desc: *const c_void) = Memcpy3DPeerPtds;
    cuMemcpy3DPeerAsync(desc: *const c_void, stream: CUstream) = Memcpy3DPeerAsync;
    cuMemcpy3DPeerAsync_ptsz(desc: *const c_void, stream: CUstream) = Memcpy3DPeerAsyncPtsz;
    cuStreamWaitValue32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWaitValue32;
    cuStreamWaitValue32_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWaitValue32Ptsz;
    cuStreamWaitValue32_v2(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWaitValue32V2;
    cuStreamWaitValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWaitValue32V2Ptsz;
    cuStreamWaitValue64(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWaitValue64;
    cuStreamWaitValue64_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWaitValue64Ptsz;
    cuStreamWaitValue64_v2(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWaitValue64V2;
    cuStreamWaitValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWaitValue64V2Ptsz;
    cuStreamWriteValue32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWriteValue32;
    cuStreamWriteValue32_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWriteValue32Ptsz;
    cuStreamWriteValue32_v2(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWriteValue32V2;
    cuStreamWriteValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) = StreamWriteValue32V2Ptsz;
    cuStreamWriteValue64(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWriteValue64;
    cuStreamWriteValue64_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWriteValue64Ptsz;
    cuStreamWriteValue64_v2(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWriteValue64V2;
    cuStreamWriteValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) = StreamWriteValue64V2Ptsz;
    cuStreamBatchMemOp(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) = StreamBatchMemOp;
    cuStreamBatchMemOp_ptsz(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) = StreamBatchMemOpPtsz;
    cuStreamBatchMemOp_v2(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) = StreamBatchMemOpV2;
    cuStreamBatchMemOp_v2_ptsz(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) = StreamBatchMemOpV2Ptsz;
    cuMemcpyAtoD_v2(dst: CUdeviceptr, src: *mut c_void, offset: usize, n: usize) = MemcpyAtoDV2;
    cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: *mut c_void, offset: usize, n: usize) = MemcpyAtoDV2Ptds;
    cuMemcpyDtoA_v2(dst: *mut c_void, offset: usize, src: CUdeviceptr, n: usize) = MemcpyDtoAV2;
    cuMemcpyDtoA_v2_ptds(dst: *mut c_void, offset: usize, src: CUdeviceptr, n: usize) = MemcpyDtoAV2Ptds;
}
