//! Entry points for the driver's lifecycle, device information and contexts, and for error
//! strings and symbol lookup (`cuGetProcAddress`).

use crate::config::config;
use crate::runtime::{Sym, set_initialized};
use crate::state::{Obj, current_ctx, set_current_ctx, state};
use crate::types::*;
use crate::{destroy, proc_address, put};
use std::ffi::{c_char, c_int, c_uint, c_void};

fn ctx_create(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut s = state();
    if !s.valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let c = s.new_object(Obj::Context {
        device: dev,
        primary: false,
    });
    drop(s);
    set_current_ctx(c);
    out!(pctx, c as CUcontext);
    CUDA_SUCCESS
}

fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut s = state();
    if !s.valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let p = &mut s.primary[dev as usize];
    p.1 += 1;
    let c = p.0;
    drop(s);
    out!(pctx, c as CUcontext);
    CUDA_SUCCESS
}

fn uuid(out: *mut CUuuid, dev: CUdevice) -> CUresult {
    if !state().valid_device(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let mut bytes = *b"simcuda-device\0\0";
    bytes[15] = dev as u8;
    out!(out, CUuuid { bytes });
    CUDA_SUCCESS
}

fn error_text(err: CUresult, pstr: *mut *const c_char, name: bool) -> CUresult {
    match ERRORS.iter().find(|e| e.0 == err) {
        Some((_, n, s)) => {
            out!(pstr, if name { n.as_ptr() } else { s.as_ptr() });
            CUDA_SUCCESS
        }
        None => {
            // SAFETY: NULL or a valid out-pointer per the API; `put` checks NULL.
            unsafe { put(pstr, std::ptr::null()) };
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

exports! {
    // ---- Lifecycle and device information.
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if config().devices == 0 {
            return CUDA_ERROR_NO_DEVICE;
        }
        crate::checkpoint::start();
        set_initialized();
        CUDA_SUCCESS
    }
    fn cuDriverGetVersion(version: *mut c_int) {
        out!(version, config().driver_version);
        CUDA_SUCCESS
    }
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        if !state().valid_device(ordinal) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        out!(device, ordinal);
        CUDA_SUCCESS
    }
    fn cuDeviceGetCount(count: *mut c_int) {
        out!(count, state().devices());
        CUDA_SUCCESS
    }
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let text = format!("NVIDIA H100 (simcuda {dev})");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` is non-null and valid for `len` bytes per the API; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        CUDA_SUCCESS
    }
    fn cuDeviceGetUuid(out: *mut CUuuid, dev: CUdevice) {
        uuid(out, dev)
    }
    fn cuDeviceGetUuid_v2(out: *mut CUuuid, dev: CUdevice) {
        uuid(out, dev)
    }
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if attrib <= 0 || attrib >= DEVICE_ATTRIBUTE_MAX {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut v = DEVICE_ATTRIBUTES.iter().find(|a| a.0 == attrib).map_or(0, |a| a.1);
        if attrib == 33 {
            v += dev; // PCI bus id: one bus per device
        }
        out!(pi, v);
        CUDA_SUCCESS
    }
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        if !state().valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        out!(bytes, config().capacity as usize);
        CUDA_SUCCESS
    }
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let s = state();
        let d = match s.current_device() {
            Ok(d) => d,
            Err(e) => return e,
        };
        let cap = config().capacity;
        let used = s.device_used(d);
        drop(s);
        out!(free, cap.saturating_sub(used) as usize);
        out!(total, cap as usize);
        CUDA_SUCCESS
    }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint, dev: CUdevice) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        ctx_create(pctx, dev)
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    fn cuCtxDestroy_v2(ctx: CUcontext) {
        let c = ctx as u64;
        let r = destroy(c, |o| matches!(o, Obj::Context { primary: false, .. }));
        if r != CUDA_SUCCESS {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        if current_ctx() == c {
            set_current_ctx(0);
        }
        CUDA_SUCCESS
    }
    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        out!(pctx, current_ctx() as CUcontext);
        CUDA_SUCCESS
    }
    fn cuCtxSetCurrent(ctx: CUcontext) {
        let c = ctx as u64;
        if c != 0 && !state().is(c, |o| matches!(o, Obj::Context { .. })) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        set_current_ctx(c);
        CUDA_SUCCESS
    }
    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = match state().objects.get(&current_ctx()) {
            Some(Obj::Context { device, .. }) => *device,
            _ => return CUDA_ERROR_INVALID_CONTEXT,
        };
        out!(dev, d);
        CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        primary_retain(pctx, dev)
    }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let mut s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        let p = &mut s.primary[dev as usize];
        if p.1 == 0 {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        p.1 -= 1;
        CUDA_SUCCESS
    }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let mut s = state();
        if !s.valid_device(dev) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        s.primary[dev as usize].1 = 0;
        CUDA_SUCCESS
    }

    // ---- Errors and symbol lookup.
    fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) {
        error_text(error, pstr, false)
    }
    fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) {
        error_text(error, pstr, true)
    }
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        CUDA_ERROR_NOT_SUPPORTED
    }
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t) {
        proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
    }
    fn cuGetProcAddress_v2(
        symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t, status: *mut c_int,
    ) {
        proc_address(symbol, pfn, cuda_version, flags, status)
    }
}
