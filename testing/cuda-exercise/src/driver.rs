//! Loading a driver library with `dlopen`, resolving entry points with `dlsym` and calling them
//! with the C signatures of CUDA 12's `cuda.h`: the typed calls every command uses. The
//! benchmarks (`bench.rs`), NCCL (`nccl.rs`), `latency` (`timing.rs`) and the SIGTERM handler
//! (`memory.rs`) have a few `unsafe` blocks of their own, each with its SAFETY comment.

use std::ffi::{CStr, CString, c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type Handle = *mut c_void;

/// `CUmemAllocationProp` (CUDA 12).
#[repr(C)]
#[derive(Clone, Copy)]
struct MemAllocationProp {
    type_: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

impl MemAllocationProp {
    /// Pinned device memory on `device`.
    fn device(device: c_int) -> MemAllocationProp {
        MemAllocationProp {
            type_: 1,
            requested_handle_types: 0,
            location_type: 1,
            location_id: device,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// Granularity used for `cuMemCreate`, `cuMemMap` and `cuMemUnmap` sizes in default calls.
pub const DEFAULT_GRANULARITY: usize = 2 << 20;

/// A loaded driver library. The handle is never closed: entry points stay valid for the life of
/// the process.
pub struct Driver {
    handle: *mut c_void,
    /// The stream [`Driver::call_default`] passes to APIs that take one (NULL unless
    /// [`Driver::create_stream`] made one).
    stream: Handle,
}

/// Calls the entry point `$name` with signature `fn($t...) -> CUresult`; `None` if the library
/// does not export it.
macro_rules! call {
    ($self:expr, $name:expr, fn($($t:ty),* $(,)?) $(, $a:expr)* $(,)?) => {{
        match $self.symbol($name) {
            None => None,
            Some(p) => {
                // SAFETY: `p` is the address of the exported function `$name` of a CUDA driver
                // library, whose C signature in cuda.h (CUDA 12) is the one given here.
                let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p) };
                // SAFETY: every pointer argument passed at the call sites of this macro points to
                // live memory of the type and size the API reads or writes (or is NULL where the
                // API allows it), and handles are NULL or were returned by the same library.
                Some(unsafe { f($($a),*) })
            }
        }
    }};
}

// The typed wrappers: declared after `call!` so that they can use it (a macro_rules macro is
// in scope only below its definition).
mod checkpoint;
mod context;
mod defaults;
mod memory;

impl Driver {
    /// Loads `path` (a file path or a soname searched the normal way) with `RTLD_NOW | RTLD_LOCAL`.
    pub fn open(path: &str) -> Result<Driver, String> {
        let c = CString::new(path).map_err(|_| format!("library path {path:?} contains NUL"))?;
        // SAFETY: `c` is a valid NUL-terminated string; dlopen runs the library's initialisers,
        // which is what loading a driver library means.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns NULL or a valid C string owned by libc.
            let err = unsafe { libc::dlerror() };
            let msg = if err.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: non-null C string from dlerror, copied before any other dl call.
                unsafe { CStr::from_ptr(err) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("dlopen({path}): {msg}"));
        }
        Ok(Driver {
            handle,
            stream: std::ptr::null_mut(),
        })
    }

    /// The address of an exported entry point.
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: `handle` is a live dlopen handle and `c` a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// Creates a stream with `cuStreamCreate` for later calls to use; returns its handle.
    pub fn create_stream(&mut self) -> Result<u64, String> {
        let mut h: Handle = std::ptr::null_mut();
        match call!(self, "cuStreamCreate", fn(*mut Handle, c_uint), &mut h, 0) {
            Some(0) => {
                self.stream = h;
                Ok(h as u64)
            }
            r => Err(format!("cuStreamCreate: {r:?}")),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.symbol(name).is_some()
    }
}
