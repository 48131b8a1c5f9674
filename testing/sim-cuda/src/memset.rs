//! Memset entry points (`cuMemsetD8/16/32`, their 2D forms, asynchronous and per-thread-stream
//! variants): they check their range and stream and fill device memory (the state's content),
//! element by element, row by row. The stream writes of one value (`cuStreamWriteValue32/64`)
//! are one-element memsets on a stream.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use crate::runtime::{Sym, sync_device};
use crate::state::state;
use crate::types::*;

/// Fills `height` rows of `width` elements of `value` (`value.len()` bytes each), rows `pitch`
/// bytes apart, from `dst`. A synchronous memset (`stream` `None`) waits for the work launched
/// before it.
fn memset(
    dst: CUdeviceptr,
    pitch: usize,
    value: &[u8],
    width: usize,
    height: usize,
    stream: Option<CUstream>,
) -> CUresult {
    let row = match width.checked_mul(value.len()) {
        Some(r) => r,
        None => return CUDA_ERROR_INVALID_VALUE,
    };
    let mut s = state();
    if let Some(st) = stream
        && !s.valid_stream(st as u64)
    {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    for r in 0..height {
        let Some(at) = (r as u64)
            .checked_mul(pitch as u64)
            .and_then(|o| dst.checked_add(o))
        else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if !s.valid_range(at, row as u64) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    let line: Vec<u8> = value.iter().copied().cycle().take(row).collect();
    for r in 0..height {
        s.write_content(dst + (r * pitch) as u64, &line);
    }
    drop(s);
    if stream.is_none() {
        sync_device();
    }
    CUDA_SUCCESS
}

exports! {
    fn cuStreamWriteValue32_v2(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) {
        memset(addr, 0, &value.to_le_bytes(), 1, 1, Some(stream))
    }
    fn cuStreamWriteValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint) {
        memset(addr, 0, &value.to_le_bytes(), 1, 1, Some(stream))
    }
    fn cuStreamWriteValue64_v2(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) {
        memset(addr, 0, &value.to_le_bytes(), 1, 1, Some(stream))
    }
    fn cuStreamWriteValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) {
        memset(addr, 0, &value.to_le_bytes(), 1, 1, Some(stream))
    }
    fn cuMemsetD8_v2(dst: CUdeviceptr, uc: c_uchar, n: usize) {
        memset(dst, 0, &[uc], n, 1, None)
    }
    fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, uc: c_uchar, n: usize) {
        memset(dst, 0, &[uc], n, 1, None)
    }
    fn cuMemsetD16_v2(dst: CUdeviceptr, us: c_ushort, n: usize) {
        memset(dst, 0, &us.to_le_bytes(), n, 1, None)
    }
    fn cuMemsetD16_v2_ptds(dst: CUdeviceptr, us: c_ushort, n: usize) {
        memset(dst, 0, &us.to_le_bytes(), n, 1, None)
    }
    fn cuMemsetD32_v2(dst: CUdeviceptr, ui: c_uint, n: usize) {
        memset(dst, 0, &ui.to_le_bytes(), n, 1, None)
    }
    fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, ui: c_uint, n: usize) {
        memset(dst, 0, &ui.to_le_bytes(), n, 1, None)
    }
    fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, uc: c_uchar, w: usize, h: usize) {
        memset(dst, pitch, &[uc], w, h, None)
    }
    fn cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, uc: c_uchar, w: usize, h: usize) {
        memset(dst, pitch, &[uc], w, h, None)
    }
    fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, us: c_ushort, w: usize, h: usize) {
        memset(dst, pitch, &us.to_le_bytes(), w, h, None)
    }
    fn cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, us: c_ushort, w: usize, h: usize) {
        memset(dst, pitch, &us.to_le_bytes(), w, h, None)
    }
    fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize) {
        memset(dst, pitch, &ui.to_le_bytes(), w, h, None)
    }
    fn cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize) {
        memset(dst, pitch, &ui.to_le_bytes(), w, h, None)
    }
    fn cuMemsetD8Async(dst: CUdeviceptr, uc: c_uchar, n: usize, stream: CUstream) {
        memset(dst, 0, &[uc], n, 1, Some(stream))
    }
    fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, uc: c_uchar, n: usize, stream: CUstream) {
        memset(dst, 0, &[uc], n, 1, Some(stream))
    }
    fn cuMemsetD16Async(dst: CUdeviceptr, us: c_ushort, n: usize, stream: CUstream) {
        memset(dst, 0, &us.to_le_bytes(), n, 1, Some(stream))
    }
    fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, us: c_ushort, n: usize, stream: CUstream) {
        memset(dst, 0, &us.to_le_bytes(), n, 1, Some(stream))
    }
    fn cuMemsetD32Async(dst: CUdeviceptr, ui: c_uint, n: usize, stream: CUstream) {
        memset(dst, 0, &ui.to_le_bytes(), n, 1, Some(stream))
    }
    fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, ui: c_uint, n: usize, stream: CUstream) {
        memset(dst, 0, &ui.to_le_bytes(), n, 1, Some(stream))
    }
    fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, uc: c_uchar, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &[uc], w, h, Some(stream))
    }
    fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, uc: c_uchar, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &[uc], w, h, Some(stream))
    }
    fn cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, us: c_ushort, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &us.to_le_bytes(), w, h, Some(stream))
    }
    fn cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, us: c_ushort, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &us.to_le_bytes(), w, h, Some(stream))
    }
    fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &ui.to_le_bytes(), w, h, Some(stream))
    }
    fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize, stream: CUstream) {
        memset(dst, pitch, &ui.to_le_bytes(), w, h, Some(stream))
    }
}
