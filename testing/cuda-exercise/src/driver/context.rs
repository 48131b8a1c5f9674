//! Typed wrappers for setting up and running work: cuInit, the primary context, a module's
//! function, a kernel launch, cuCtxSynchronize, and cuGetProcAddress(_v2).

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use super::{CUresult, Driver, Handle};

impl Driver {
    pub fn init(&self) -> Option<CUresult> {
        call!(self, "cuInit", fn(c_uint), 0)
    }

    /// `cuDeviceGet` + `cuDevicePrimaryCtxRetain` + `cuCtxSetCurrent` for device 0.
    pub fn primary_context(
        &self,
        rec: &mut impl FnMut(&str, Option<CUresult>, u64),
    ) -> Result<(), CUresult> {
        self.primary_context_on(0, rec)
    }

    /// The same for device `ordinal`: later calls of this thread work on that device.
    pub fn primary_context_on(
        &self,
        ordinal: c_int,
        rec: &mut impl FnMut(&str, Option<CUresult>, u64),
    ) -> Result<(), CUresult> {
        let mut dev: c_int = 0;
        let r = call!(
            self,
            "cuDeviceGet",
            fn(*mut c_int, c_int),
            &mut dev,
            ordinal
        );
        rec("cuDeviceGet", r, 0);
        ok(r)?;
        let mut ctx: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Handle, c_int),
            &mut ctx,
            dev
        );
        rec("cuDevicePrimaryCtxRetain", r, 0);
        ok(r)?;
        let r = call!(self, "cuCtxSetCurrent", fn(Handle), ctx);
        rec("cuCtxSetCurrent", r, 0);
        ok(r)
    }

    /// `cuModuleLoadData(image)` + `cuModuleGetFunction(name)`: the result of the last call
    /// made and the function.
    pub fn function_from_image(&self, image: &[u8], name: &str) -> (Option<CUresult>, Handle) {
        let Ok(cname) = CString::new(name) else {
            return (Some(1), std::ptr::null_mut());
        };
        let mut module: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuModuleLoadData",
            fn(*mut Handle, *const c_void),
            &mut module,
            image.as_ptr().cast()
        );
        if r != Some(0) {
            return (r, std::ptr::null_mut());
        }
        let mut f: Handle = std::ptr::null_mut();
        let r = call!(
            self,
            "cuModuleGetFunction",
            fn(*mut Handle, Handle, *const c_char),
            &mut f,
            module,
            cname.as_ptr()
        );
        (r, f)
    }

    /// `cuLaunchKernel(f)` with a 1x1x1 grid and block on the NULL stream, no parameters.
    pub fn launch_kernel(&self, f: Handle) -> Option<CUresult> {
        let null: Handle = std::ptr::null_mut();
        let none: *mut Handle = std::ptr::null_mut();
        call!(
            self,
            "cuLaunchKernel",
            fn(
                Handle,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Handle,
                *mut Handle,
                *mut Handle,
            ),
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null,
            none,
            none
        )
    }

    pub fn ctx_synchronize(&self) -> Option<CUresult> {
        call!(self, "cuCtxSynchronize", fn())
    }

    /// `cuGetProcAddress_v2` (or `cuGetProcAddress` when `v2` is false): result, address,
    /// symbol status (v2 only).
    pub fn get_proc_address(
        &self,
        symbol: &str,
        version: c_int,
        flags: u64,
        v2: bool,
    ) -> Result<(Option<CUresult>, usize, c_int), String> {
        let c = CString::new(symbol).map_err(|_| format!("symbol {symbol:?} contains NUL"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        let r = if v2 {
            call!(
                self,
                "cuGetProcAddress_v2",
                fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int),
                c.as_ptr(),
                &mut p,
                version,
                flags,
                &mut status
            )
        } else {
            call!(
                self,
                "cuGetProcAddress",
                fn(*const c_char, *mut *mut c_void, c_int, u64),
                c.as_ptr(),
                &mut p,
                version,
                flags
            )
        };
        Ok((r, p as usize, status))
    }
}

fn ok(r: Option<CUresult>) -> Result<(), CUresult> {
    match r {
        Some(0) => Ok(()),
        Some(e) => Err(e),
        None => Err(-1),
    }
}
