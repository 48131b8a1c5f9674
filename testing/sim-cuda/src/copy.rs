//! Copy entry points (`cuMemcpy*`): synchronous, asynchronous, peer and batched copies, which
//! check their pointers and streams and move the data between device memory (the state's
//! content) and host memory. A unified-addressing copy (`cuMemcpy`, `cuMemcpyAsync`, batches)
//! moves data only between two device ranges: a host address in one is checked (non-zero) but
//! not read or written, so a test's made-up address never faults.

use crate::runtime::{Sym, sync_device};
use crate::state::{Obj, state};
use crate::types::*;
use std::ffi::c_void;

/// Where a copy's pointers point.
#[derive(Clone, Copy)]
enum Mem {
    Device(u64),
    Host(*const c_void),
    /// Unified addressing: device memory if it is a device address, else host memory.
    Any(u64),
}

fn copy(dst: Mem, src: Mem, n: usize, stream: Option<CUstream>) -> CUresult {
    let s = state();
    let ok = |m: Mem| match m {
        Mem::Device(p) => s.valid_range(p, n as u64),
        Mem::Host(p) => n == 0 || !p.is_null(),
        Mem::Any(p) => n == 0 || p != 0,
    };
    if !ok(dst) || !ok(src) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(st) = stream
        && !s.valid_stream(st as u64)
    {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    let mut s = s;
    move_data(&mut s, dst, src, n);
    drop(s);
    if stream.is_none() {
        // A synchronous copy waits for the work launched before it.
        sync_device();
    }
    CUDA_SUCCESS
}

/// Moves the `n` bytes of a checked copy (see the module documentation for what moves).
fn move_data(s: &mut crate::state::State, dst: Mem, src: Mem, n: usize) {
    let device = |m: Mem| match m {
        Mem::Device(p) => Some(p),
        Mem::Any(p) if s.valid_range(p, n as u64) => Some(p),
        _ => None,
    };
    let (dst_dev, src_dev) = (device(dst), device(src));
    let mut buf = vec![0u8; n];
    match (src, src_dev) {
        (_, Some(p)) => s.read_content(p, &mut buf),
        (Mem::Host(p), None) if n > 0 => {
            // SAFETY: the API's contract: a host source holds `n` readable bytes (checked
            // non-null).
            unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), buf.as_mut_ptr(), n) }
        }
        _ => return,
    }
    match (dst, dst_dev) {
        (_, Some(p)) => s.write_content(p, &buf),
        (Mem::Host(p), None) if n > 0 => {
            // SAFETY: the API's contract: a host destination holds `n` writable bytes (checked
            // non-null); `buf` is ours, so the two never overlap.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p.cast::<u8>().cast_mut(), n) }
        }
        _ => {}
    }
}

fn copy_peer(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    stream: Option<CUstream>,
) -> CUresult {
    {
        let s = state();
        let is_ctx = |c: CUcontext| s.is(c as u64, |o| matches!(o, Obj::Context { .. }));
        if !is_ctx(dst_ctx) || !is_ctx(src_ctx) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
    }
    copy(Mem::Device(dst), Mem::Device(src), n, stream)
}

/// `cuMemcpyBatchAsync(_v2)`: each copy in turn; the index of a failing one goes to `fail_idx`.
fn batch_copy(
    dsts: *mut CUdeviceptr,
    srcs: *mut CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    fail_idx: *mut usize,
    stream: CUstream,
) -> CUresult {
    if count > 0 && (dsts.is_null() || srcs.is_null() || sizes.is_null()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for i in 0..count {
        // SAFETY: the caller passes arrays of `count` elements (checked non-null above).
        let (d, s, n) = unsafe { (*dsts.add(i), *srcs.add(i), *sizes.add(i)) };
        let r = copy(Mem::Any(d), Mem::Any(s), n, Some(stream));
        if r != CUDA_SUCCESS {
            if !fail_idx.is_null() {
                // SAFETY: a non-null out-pointer from the caller.
                unsafe { *fail_idx = i };
            }
            return r;
        }
    }
    CUDA_SUCCESS
}

exports! {
    // ---- Copies.
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Any(dst), Mem::Any(src), n, None)
    }
    fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Any(dst), Mem::Any(src), n, None)
    }
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Any(dst), Mem::Any(src), n, Some(stream))
    }
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Any(dst), Mem::Any(src), n, Some(stream))
    }
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        copy(Mem::Device(dst), Mem::Host(src), n, None)
    }
    fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) {
        copy(Mem::Device(dst), Mem::Host(src), n, None)
    }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        copy(Mem::Host(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        copy(Mem::Host(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Device(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        copy(Mem::Device(dst), Mem::Device(src), n, None)
    }
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Host(src), n, Some(stream))
    }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Host(src), n, Some(stream))
    }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Host(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Host(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        copy(Mem::Device(dst), Mem::Device(src), n, Some(stream))
    }
    fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, None)
    }
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, Some(stream))
    }

    fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, None)
    }
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) {
        copy_peer(dst, dst_ctx, src, src_ctx, n, Some(stream))
    }
    fn cuMemcpyBatchAsync(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, fail_idx, stream)
    }
    fn cuMemcpyBatchAsync_ptsz(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, fail_idx, stream)
    }
    fn cuMemcpyBatchAsync_v2(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, std::ptr::null_mut(), stream)
    }
    fn cuMemcpyBatchAsync_v2_ptsz(
        dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize,
        attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream,
    ) {
        batch_copy(dsts, srcs, sizes, count, std::ptr::null_mut(), stream)
    }
}
