//! Copy entry points (`cuMemcpy*`): synchronous, asynchronous, peer and batched copies, which
//! check their pointers and streams and move the data between device memory (the state's
//! content) and host memory. A unified-addressing copy (`cuMemcpy`, `cuMemcpyAsync`, batches)
//! moves data only between two device ranges: a host address in one is checked (non-zero) but
//! not read or written, so a test's made-up address never faults.

use crate::runtime::{Sym, sync_device};
use crate::state::{Obj, state};
use crate::types::*;
use std::ffi::{c_uint, c_void};

/// Where a copy's pointers point.
#[derive(Clone, Copy)]
enum Mem {
    Device(u64),
    Host(*const c_void),
    /// Unified addressing: device memory if it is a device address, else host memory.
    Any(u64),
}

fn copy(dst: Mem, src: Mem, n: usize, stream: Option<CUstream>) -> CUresult {
    // Before the state's lock: the registrations have their own.
    for m in [dst, src] {
        if let Mem::Host(p) = m
            && !crate::memory::host_range_ok(p, n)
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
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

/// `CUDA_MEMCPY2D`.
#[repr(C)]
pub struct Memcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// `CUmemorytype`: host, device, array, unified.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_ARRAY: c_uint = 3;
const MEMORYTYPE_UNIFIED: c_uint = 4;

/// Where row `row` of one side of a 2D copy starts.
fn side_row(
    kind: c_uint,
    host: *const c_void,
    device: CUdeviceptr,
    (x, y, pitch): (usize, usize, usize),
    row: usize,
) -> Result<Mem, CUresult> {
    let offset = y
        .checked_add(row)
        .and_then(|r| r.checked_mul(pitch))
        .and_then(|o| o.checked_add(x))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match kind {
        MEMORYTYPE_HOST if !host.is_null() => {
            Ok(Mem::Host(host.cast::<u8>().wrapping_add(offset).cast()))
        }
        CU_MEMORYTYPE_DEVICE => device
            .checked_add(offset as u64)
            .map(Mem::Device)
            .ok_or(CUDA_ERROR_INVALID_VALUE),
        MEMORYTYPE_UNIFIED => device
            .checked_add(offset as u64)
            .map(Mem::Any)
            .ok_or(CUDA_ERROR_INVALID_VALUE),
        // The simulated device has no arrays.
        MEMORYTYPE_ARRAY => Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemcpy2D*`: the copy row by row (host, device and unified memory; arrays are not
/// supported), each row checked and moved as a 1D copy is.
fn copy_2d(desc: *const Memcpy2D, stream: Option<CUstream>) -> CUresult {
    if desc.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the API's contract: a non-null descriptor points to a readable `CUDA_MEMCPY2D`.
    let d = unsafe { &*desc };
    for row in 0..d.height {
        let rows = side_row(
            d.src_memory_type,
            d.src_host,
            d.src_device,
            (d.src_x_in_bytes, d.src_y, d.src_pitch),
            row,
        )
        .and_then(|src| {
            let dst = side_row(
                d.dst_memory_type,
                d.dst_host,
                d.dst_device,
                (d.dst_x_in_bytes, d.dst_y, d.dst_pitch),
                row,
            )?;
            Ok((dst, src))
        });
        let (dst, src) = match rows {
            Ok(r) => r,
            Err(e) => return e,
        };
        let r = copy(dst, src, d.width_in_bytes, stream);
        if r != CUDA_SUCCESS {
            return r;
        }
    }
    CUDA_SUCCESS
}

exports! {
    // ---- 2D copies.
    fn cuMemcpy2D_v2(desc: *const Memcpy2D) {
        copy_2d(desc, None)
    }
    fn cuMemcpy2D_v2_ptds(desc: *const Memcpy2D) {
        copy_2d(desc, None)
    }
    fn cuMemcpy2DUnaligned_v2(desc: *const Memcpy2D) {
        copy_2d(desc, None)
    }
    fn cuMemcpy2DUnaligned_v2_ptds(desc: *const Memcpy2D) {
        copy_2d(desc, None)
    }
    fn cuMemcpy2DAsync_v2(desc: *const Memcpy2D, stream: CUstream) {
        copy_2d(desc, Some(stream))
    }
    fn cuMemcpy2DAsync_v2_ptsz(desc: *const Memcpy2D, stream: CUstream) {
        copy_2d(desc, Some(stream))
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(
        src: (c_uint, *const c_void, u64, usize),
        dst: (c_uint, *mut c_void, u64, usize),
        w: usize,
        h: usize,
    ) -> Memcpy2D {
        Memcpy2D {
            src_x_in_bytes: 0,
            src_y: 0,
            src_memory_type: src.0,
            src_host: src.1,
            src_device: src.2,
            src_array: std::ptr::null_mut(),
            src_pitch: src.3,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: dst.0,
            dst_host: dst.1,
            dst_device: dst.2,
            dst_array: std::ptr::null_mut(),
            dst_pitch: dst.3,
            width_in_bytes: w,
            height: h,
        }
    }

    /// Rows of 8 bytes, 16 apart on the host, go 32 apart on the device and come back packed;
    /// what lies between the rows is not touched; arrays and a null descriptor are refused.
    #[test]
    fn a_2d_copy_moves_each_row_at_its_pitch() {
        let mut dev: CUdeviceptr = 0;
        // SAFETY: out-pointers and buffers that live through each call; sizes within them.
        unsafe {
            assert_eq!(crate::device::cuInit(0), CUDA_SUCCESS);
            assert_eq!(crate::memory::cuMemAlloc_v2(&mut dev, 4 * 32), CUDA_SUCCESS);
            let host: Vec<u8> = (0..64).collect();
            let up = desc(
                (MEMORYTYPE_HOST, host.as_ptr().cast(), 0, 16),
                (CU_MEMORYTYPE_DEVICE, std::ptr::null_mut(), dev, 32),
                8,
                4,
            );
            assert_eq!(cuMemcpy2D_v2(&up), CUDA_SUCCESS);
            let mut back = vec![0xffu8; 32];
            let down = desc(
                (CU_MEMORYTYPE_DEVICE, std::ptr::null(), dev, 32),
                (MEMORYTYPE_HOST, back.as_mut_ptr().cast(), 0, 8),
                8,
                4,
            );
            assert_eq!(
                cuMemcpy2DAsync_v2(&down, std::ptr::null_mut()),
                CUDA_SUCCESS
            );
            let want: Vec<u8> = (0..4u8).flat_map(|r| r * 16..r * 16 + 8).collect();
            assert_eq!(back, want);
            let mut gap = [0xffu8; 8];
            assert_eq!(
                cuMemcpyDtoH_v2(gap.as_mut_ptr().cast(), dev + 8, 8),
                CUDA_SUCCESS
            );
            assert_eq!(gap, [0; 8], "between the rows: never written");
            let array = desc(
                (MEMORYTYPE_ARRAY, std::ptr::null(), 0, 8),
                (CU_MEMORYTYPE_DEVICE, std::ptr::null_mut(), dev, 32),
                8,
                1,
            );
            assert_eq!(cuMemcpy2D_v2(&array), CUDA_ERROR_NOT_SUPPORTED);
            assert_eq!(cuMemcpy2D_v2(std::ptr::null()), CUDA_ERROR_INVALID_VALUE);
        }
    }

    /// Two adjacent registrations: a copy within either moves, one across both is refused as
    /// the real driver refuses it; memory never registered is not checked.
    #[test]
    fn a_copy_may_not_span_two_registrations() {
        let mut dev: CUdeviceptr = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut host = vec![7u8; 8192];
        let (lo, hi) = (host.as_mut_ptr(), host.as_mut_ptr().wrapping_add(4096));
        // SAFETY: out-pointers and buffers that live through each call; sizes within them.
        unsafe {
            assert_eq!(crate::device::cuInit(0), CUDA_SUCCESS);
            assert_eq!(crate::device::cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
            assert_eq!(crate::memory::cuMemAlloc_v2(&mut dev, 8192), CUDA_SUCCESS);
            for half in [lo, hi] {
                assert_eq!(
                    crate::memory::cuMemHostRegister_v2(half.cast(), 4096, 1),
                    CUDA_SUCCESS
                );
            }
            assert_eq!(cuMemcpyHtoD_v2(dev, lo.cast(), 4096), CUDA_SUCCESS);
            assert_eq!(cuMemcpyDtoH_v2(hi.cast(), dev, 4096), CUDA_SUCCESS);
            assert_eq!(
                cuMemcpyHtoD_v2(dev, lo.add(2048).cast(), 4096),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuMemcpyDtoH_v2(lo.cast(), dev, 8192),
                CUDA_ERROR_INVALID_VALUE
            );
            for half in [lo, hi] {
                assert_eq!(
                    crate::memory::cuMemHostUnregister(half.cast()),
                    CUDA_SUCCESS
                );
            }
            assert_eq!(
                cuMemcpyDtoH_v2(lo.cast(), dev, 8192),
                CUDA_SUCCESS,
                "unregistered"
            );
            assert_eq!(crate::device::cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
        }
    }
}
