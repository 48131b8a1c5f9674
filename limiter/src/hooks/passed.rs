//! Memsets and 2D/3D copies: passed on, the control block looked at when due (a limit change, a
//! freeze), as the copies' hooks do ([`super::timed`]). They are not recorded: the shared API
//! table has no room for their 38 variants (`agent_common::api::API_SLOTS`). Hooked so that a frozen container whose next call is a memset (CuPy's `zeros`, a
//! JAX zero fill) asks for its thaw before the driver holds the call, as every other kind does.

use std::ffi::{c_uint, c_void};

use super::gate::passthrough;
use crate::{
    platform::{
        cuda::*,
        driver::{
            PfnMemcpyDesc, PfnMemcpyDescAsync, PfnMemsetD2D8, PfnMemsetD2D8Async, PfnMemsetD2D16,
            PfnMemsetD2D16Async, PfnMemsetD2D32, PfnMemsetD2D32Async, PfnMemsetD8,
            PfnMemsetD8Async, PfnMemsetD16, PfnMemsetD16Async, PfnMemsetD32, PfnMemsetD32Async,
            Symbol, sym,
        },
    },
    runtime,
};

/// Looks at the control block when due, then calls the real `S` (before initialisation and
/// after a configuration error, the guarded [`passthrough`]).
#[inline(always)]
fn passed_on<S: Symbol>(call: impl FnOnce(S::Fn) -> CUresult) -> CUresult {
    let rt = runtime::get();
    let Some(state) = rt.state() else {
        return passthrough::<S>(call);
    };
    let Some(real) = state.driver.get::<S>() else {
        return passthrough::<S>(call);
    };
    // A frozen container's memset asks for its thaw here, before the driver holds the call.
    state.poll_control_due(state.clock.now());
    call(real)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD8| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD8V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD8_v2_ptds(
    dst: CUdeviceptr,
    value: u8,
    n: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD8| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD8V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D8| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D8V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D8_v2_ptds(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D8| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D8V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: u8,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD8Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD8Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    value: u8,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD8Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD8AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D8Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D8Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D8Async_ptsz(
    dst: CUdeviceptr,
    pitch: usize,
    value: u8,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D8Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D8AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD16| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD16V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD16_v2_ptds(
    dst: CUdeviceptr,
    value: u16,
    n: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD16| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD16V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D16| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D16V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D16_v2_ptds(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D16| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D16V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    value: u16,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD16Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD16Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD16Async_ptsz(
    dst: CUdeviceptr,
    value: u16,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD16Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD16AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D16Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D16Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D16Async_ptsz(
    dst: CUdeviceptr,
    pitch: usize,
    value: u16,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D16Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D16AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD32_v2(
    dst: CUdeviceptr,
    value: c_uint,
    n: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD32| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD32V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD32_v2_ptds(
    dst: CUdeviceptr,
    value: c_uint,
    n: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD32| unsafe { real(dst, value, n) };
    passed_on::<sym::MemsetD32V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D32| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D32V2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D32_v2_ptds(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD2D32| unsafe { real(dst, pitch, value, width, height) };
    passed_on::<sym::MemsetD2D32V2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    value: c_uint,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD32Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD32Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    value: c_uint,
    n: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemsetD32Async| unsafe { real(dst, value, n, stream) };
    passed_on::<sym::MemsetD32AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D32Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D32Async>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemsetD2D32Async_ptsz(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_uint,
    width: usize,
    height: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward =
        |real: PfnMemsetD2D32Async| unsafe { real(dst, pitch, value, width, height, stream) };
    passed_on::<sym::MemsetD2D32AsyncPtsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2D_v2(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy2DV2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2D_v2_ptds(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy2DV2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2DUnaligned_v2(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy2DUnalignedV2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2DUnaligned_v2_ptds(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy2DUnalignedV2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2DAsync_v2(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy2DAsyncV2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy2DAsync_v2_ptsz(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy2DAsyncV2Ptsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3D_v2(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy3DV2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3D_v2_ptds(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy3DV2Ptds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DAsync_v2(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy3DAsyncV2>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DAsync_v2_ptsz(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy3DAsyncV2Ptsz>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DPeer(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy3DPeer>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DPeer_ptds(desc: *const c_void) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDesc| unsafe { real(desc) };
    passed_on::<sym::Memcpy3DPeerPtds>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DPeerAsync(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy3DPeerAsync>(forward)
}

/// # Safety
/// The caller follows the contract of the driver function of the same name.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuMemcpy3DPeerAsync_ptsz(
    desc: *const c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged to the same variant.
    let forward = |real: PfnMemcpyDescAsync| unsafe { real(desc, stream) };
    passed_on::<sym::Memcpy3DPeerAsyncPtsz>(forward)
}
