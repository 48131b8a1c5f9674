//! The binding to the real CUDA driver: the only module that finds libcuda and its functions.
//!
//! - The real `dlsym` is found with `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`, never through the
//!   public name `dlsym`, which this library exports itself (hami-core.md §1.1, vgpu-manager PR #89).
//! - libcuda is opened with `dlopen("libcuda.so.1" | $VGPU_REAL_LIBCUDA, RTLD_NOW | RTLD_NODELETE)`
//!   and every symbol of [`Sym`] is resolved once, lazily, by the first CUDA call (or the first
//!   `dlsym`/`cuGetProcAddress` answer that needs to be compared with the driver's pointers), never
//!   in a constructor: a process that does not use CUDA never loads the driver through us.
//! - Each ABI variant (`_v2`, legacy, `_ptsz`) has its own slot, so a hook forwards to exactly the
//!   variant that was called and `cuGetProcAddress` answers can be matched by pointer.

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint, c_void},
    mem,
    os::unix::ffi::OsStrExt,
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use agent_common::api::ApiId;

use crate::{config::REAL_LIBCUDA, cuda::*, guard::Reentry};

/// glibc's `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

pub type PfnInit = unsafe extern "C" fn(c_uint) -> CUresult;
pub type PfnGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub type PfnGetProcAddressV2 = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    u64,
    *mut CUdriverProcAddressQueryResult,
) -> CUresult;
pub type PfnMemAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type PfnMemAllocPitch =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub type PfnMemAllocManaged = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub type PfnMemAllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub type PfnMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
pub type PfnMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub type PfnMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub type PfnMemCreate = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    u64,
) -> CUresult;
pub type PfnMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub type PfnMemMap =
    unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult;
pub type PfnMemPoolCreate =
    unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemPoolProps) -> CUresult;
pub type PfnMemPoolDestroy = unsafe extern "C" fn(CUmemoryPool) -> CUresult;
pub type PfnMemPoolTrimTo = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
pub type PfnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type PfnDeviceTotalMem = unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
pub type PfnLaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type PfnLaunchKernelEx = unsafe extern "C" fn(
    *const CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
pub type PfnLaunchCooperativeKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
) -> CUresult;
pub type PfnGraphLaunch = unsafe extern "C" fn(CUgraphExec, CUstream) -> CUresult;
pub type PfnCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type PfnCtxSynchronize = unsafe extern "C" fn() -> CUresult;
pub type PfnMemPoolGetAttribute =
    unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
pub type PfnDeviceGetMemPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
pub type PfnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult;
pub type PfnDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;

/// A driver symbol with its function-pointer type, so that the slot and the signature of a symbol
/// are named together once, in [`driver_symbols!`].
pub trait Symbol {
    /// The exact `cuda.h` signature of the symbol.
    type Fn: Copy;
    const SYM: Sym;
}

macro_rules! driver_symbols {
    ($($(#[$doc:meta])* $sym:ident = $name:literal: $pfn:ty, hooked: $hooked:literal;)*) => {
        /// Every driver symbol the limiter resolves, one per ABI variant.
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Sym { $($(#[$doc])* $sym,)* }

        impl Sym {
            pub const ALL: &[Sym] = &[$(Sym::$sym,)*];
            pub const COUNT: usize = Sym::ALL.len();

            /// The symbol's exported name in libcuda (and in this library, if hooked).
            pub const fn name(self) -> &'static CStr {
                match self { $(Sym::$sym => $name,)* }
            }

            /// Whether the limiter exports a hook of this name.
            pub const fn hooked(self) -> bool {
                match self { $(Sym::$sym => $hooked,)* }
            }
        }

        /// Marker types tying each [`Sym`] to its signature.
        pub mod sym {
            use super::*;
            $(
                #[derive(Debug)]
                pub struct $sym;
                impl Symbol for $sym {
                    type Fn = $pfn;
                    const SYM: Sym = Sym::$sym;
                }
                const _: () = assert!(mem::size_of::<$pfn>() == mem::size_of::<usize>());
            )*
        }
    };
}

// The order is the driver table's: the allocation and free a process makes most often first,
// so that both pointers sit in the table's first cache line.
driver_symbols! {
    MemAllocV2 = c"cuMemAlloc_v2": PfnMemAlloc, hooked: true;
    MemFreeV2 = c"cuMemFree_v2": PfnMemFree, hooked: true;
    Init = c"cuInit": PfnInit, hooked: true;
    GetProcAddress = c"cuGetProcAddress": PfnGetProcAddress, hooked: true;
    GetProcAddressV2 = c"cuGetProcAddress_v2": PfnGetProcAddressV2, hooked: true;
    MemAllocPitchV2 = c"cuMemAllocPitch_v2": PfnMemAllocPitch, hooked: true;
    MemAllocManaged = c"cuMemAllocManaged": PfnMemAllocManaged, hooked: true;
    MemAllocAsync = c"cuMemAllocAsync": PfnMemAllocAsync, hooked: true;
    MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz": PfnMemAllocAsync, hooked: true;
    MemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync": PfnMemAllocFromPoolAsync, hooked: true;
    MemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz": PfnMemAllocFromPoolAsync, hooked: true;
    MemFreeAsync = c"cuMemFreeAsync": PfnMemFreeAsync, hooked: true;
    MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz": PfnMemFreeAsync, hooked: true;
    MemCreate = c"cuMemCreate": PfnMemCreate, hooked: true;
    MemRelease = c"cuMemRelease": PfnMemRelease, hooked: true;
    MemMap = c"cuMemMap": PfnMemMap, hooked: true;
    MemPoolCreate = c"cuMemPoolCreate": PfnMemPoolCreate, hooked: true;
    MemPoolDestroy = c"cuMemPoolDestroy": PfnMemPoolDestroy, hooked: true;
    MemPoolTrimTo = c"cuMemPoolTrimTo": PfnMemPoolTrimTo, hooked: true;
    MemGetInfoV2 = c"cuMemGetInfo_v2": PfnMemGetInfo, hooked: true;
    DeviceTotalMemV2 = c"cuDeviceTotalMem_v2": PfnDeviceTotalMem, hooked: true;
    LaunchKernel = c"cuLaunchKernel": PfnLaunchKernel, hooked: true;
    LaunchKernelPtsz = c"cuLaunchKernel_ptsz": PfnLaunchKernel, hooked: true;
    LaunchKernelEx = c"cuLaunchKernelEx": PfnLaunchKernelEx, hooked: true;
    LaunchKernelExPtsz = c"cuLaunchKernelEx_ptsz": PfnLaunchKernelEx, hooked: true;
    LaunchCooperativeKernel = c"cuLaunchCooperativeKernel": PfnLaunchCooperativeKernel, hooked: true;
    LaunchCooperativeKernelPtsz = c"cuLaunchCooperativeKernel_ptsz": PfnLaunchCooperativeKernel, hooked: true;
    GraphLaunch = c"cuGraphLaunch": PfnGraphLaunch, hooked: true;
    GraphLaunchPtsz = c"cuGraphLaunch_ptsz": PfnGraphLaunch, hooked: true;
    /// Used by the hooks to find the current device; not hooked.
    CtxGetDevice = c"cuCtxGetDevice": PfnCtxGetDevice, hooked: false;
    /// Used by the SM controller to drain the device at the end of a window; not hooked.
    CtxSynchronize = c"cuCtxSynchronize": PfnCtxSynchronize, hooked: false;
    /// Used to charge pools their reserved size; not hooked.
    MemPoolGetAttribute = c"cuMemPoolGetAttribute": PfnMemPoolGetAttribute, hooked: false;
    /// Used to find the pool of `cuMemAllocAsync`; not hooked.
    DeviceGetMemPool = c"cuDeviceGetMemPool": PfnDeviceGetMemPool, hooked: false;
    /// Used to map NVML devices to CUDA ordinals by UUID; not hooked.
    DeviceGetUuidV2 = c"cuDeviceGetUuid_v2": PfnDeviceGetUuid, hooked: false;
    /// Used to map NVML devices to CUDA ordinals by UUID; not hooked.
    DeviceGetCount = c"cuDeviceGetCount": PfnDeviceGetCount, hooked: false;
}

/// An id that no API has: records against it are dropped by the backend's bounds check.
const NO_API: ApiId = ApiId(u16::MAX);

/// The shared API id of every symbol, computed at compile time (no table to load at run time).
const API_IDS: [ApiId; Sym::COUNT] = {
    let mut ids = [NO_API; Sym::COUNT];
    let mut i = 0;
    while i < Sym::COUNT {
        if let Ok(name) = Sym::ALL[i].name().to_str()
            && let Some(id) = ApiId::from_name(name)
        {
            ids[i] = id;
        }
        i += 1;
    }
    ids
};

impl Sym {
    /// The shared API id of this symbol (`agent_common::api`), or an id no API has.
    #[inline(always)]
    pub const fn api(self) -> ApiId {
        API_IDS[self as usize]
    }

    /// The hooked symbol of this exact name.
    pub fn hooked_by_name(name: &[u8]) -> Option<Sym> {
        Sym::ALL
            .iter()
            .copied()
            .find(|s| s.hooked() && s.name().to_bytes() == name)
    }
}

/// Why the real driver could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// glibc's `dlsym` could not be found with `dlvsym`.
    #[error("cannot find glibc's dlsym with dlvsym")]
    NoRealDlsym,
    /// `dlopen` of the driver failed.
    #[error("cannot open the CUDA driver {path:?}: {reason}")]
    Open { path: String, reason: String },
}

/// Converts a non-null symbol address into the symbol's function-pointer type.
///
/// # Safety
/// `p` must be the address of a function with the signature `S::Fn`.
unsafe fn typed<S: Symbol>(p: usize) -> Option<S::Fn> {
    if p == 0 {
        return None;
    }
    // SAFETY: `S::Fn` is a function-pointer type of the size of `usize` (asserted per symbol in
    // `driver_symbols!`), `p` is non-null and the caller guarantees the signature.
    Some(unsafe { mem::transmute_copy::<usize, S::Fn>(&p) })
}

/// The bound driver: one real pointer per [`Sym`] (0 where the driver lacks it) and its handle.
#[derive(Debug)]
#[repr(C)]
pub struct Driver {
    ptrs: [usize; Sym::COUNT],
    handle: usize,
}

impl Driver {
    /// The real function of `S`, if the driver exports it.
    #[inline]
    pub fn get<S: Symbol>(&self) -> Option<S::Fn> {
        // SAFETY: slot `S::SYM` was resolved by the name of `S::SYM`, whose cuda.h signature is
        // `S::Fn`.
        unsafe { typed::<S>(self.ptrs[S::SYM as usize]) }
    }

    /// The symbol whose real address is `p`.
    pub fn sym_at(&self, p: *mut c_void) -> Option<Sym> {
        let p = p as usize;
        if p == 0 {
            return None;
        }
        Sym::ALL
            .iter()
            .copied()
            .find(|&s| self.ptrs[s as usize] == p)
    }

    /// The raw real address of `sym`, 0 if absent.
    pub fn addr(&self, sym: Sym) -> usize {
        self.ptrs[sym as usize]
    }

    /// The `dlopen` handle of the driver.
    pub fn handle(&self) -> *mut c_void {
        self.handle as *mut c_void
    }
}

/// glibc's `dlsym`, resolved once. Written with Release after a successful lookup, read with
/// Acquire: the pairing makes the pointer's target (in an already-loaded libc) valid to call; a
/// racing second lookup stores the same value.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, never this library's export.
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        p = find_real_dlsym();
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's `dlsym`, found by name and version, whose signature is `DlsymFn`.
    Some(unsafe { mem::transmute::<usize, DlsymFn>(p) })
}

fn find_real_dlsym() -> usize {
    #[cfg(target_arch = "aarch64")]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
    #[cfg(not(target_arch = "aarch64"))]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
    let ours = crate::dlsym::dlsym as *const () as usize;
    let accept = |p: *mut c_void| (!p.is_null() && p as usize != ours).then_some(p as usize);
    for v in VERSIONS {
        // SAFETY: both strings are NUL-terminated; RTLD_NEXT from this library searches the
        // objects loaded after it, so it cannot return our own `dlsym`.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if let Some(p) = accept(p) {
            return p;
        }
    }
    // Fall back to libc's own handle (the limiter loaded in an unusual order).
    // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded libc, which stays loaded.
    let libc_handle =
        unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if libc_handle.is_null() {
        return 0;
    }
    for v in VERSIONS {
        // SAFETY: a valid handle and NUL-terminated strings.
        let p = unsafe { libc::dlvsym(libc_handle, c"dlsym".as_ptr(), v.as_ptr()) };
        if let Some(p) = accept(p) {
            return p;
        }
    }
    0
}

/// The bound driver, or why it could not be bound.
#[unsafe(link_section = ".data.hot.vgpu")]
static DRIVER: OnceLock<Result<Driver, BindError>> = OnceLock::new();

/// The driver if already bound, without binding.
#[inline]
pub fn bound() -> Option<&'static Driver> {
    DRIVER.get().and_then(|r| r.as_ref().ok())
}

/// Binds the driver once. The caller holds the re-entrancy guard, so a `dlsym` or hooked call that
/// libcuda's constructors make on this thread while it loads goes straight to glibc/the driver
/// instead of re-entering this initialisation.
pub fn bind(_guard: &Reentry) -> Result<&'static Driver, &'static BindError> {
    DRIVER.get_or_init(open_driver).as_ref()
}

fn open_driver() -> Result<Driver, BindError> {
    let dlsym = real_dlsym().ok_or(BindError::NoRealDlsym)?;
    let path = match std::env::var_os(REAL_LIBCUDA) {
        Some(p) if !p.is_empty() => CString::new(p.as_bytes()).map_err(|_| BindError::Open {
            path: p.to_string_lossy().into_owned(),
            reason: "path contains a NUL byte".into(),
        })?,
        _ => c"libcuda.so.1".to_owned(),
    };
    // SAFETY: a NUL-terminated path; RTLD_NODELETE keeps the driver mapped for the process's life,
    // so the pointers resolved below never dangle.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated thread-local message.
        let err = unsafe { libc::dlerror() };
        let reason = if err.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(BindError::Open {
            path: path.to_string_lossy().into_owned(),
            reason,
        });
    }
    let mut ptrs = [0usize; Sym::COUNT];
    for &s in Sym::ALL {
        // SAFETY: a valid handle and a NUL-terminated name; glibc's dlsym, not our override.
        ptrs[s as usize] = unsafe { dlsym(handle, s.name().as_ptr()) } as usize;
    }
    Ok(Driver {
        handle: handle as usize,
        ptrs,
    })
}

/// The real function of `S` for a call made while this thread is already inside the limiter: the
/// bound table if there is one, else the next definition after this library (the driver is being
/// bound on this very thread).
#[cold]
#[inline(never)]
pub fn reentrant<S: Symbol>() -> Option<S::Fn> {
    if let Some(d) = bound() {
        return d.get::<S>();
    }
    let dlsym = real_dlsym()?;
    // SAFETY: RTLD_NEXT and a NUL-terminated name; the result, if any, is the next definition of
    // `S::SYM`'s name, with its cuda.h signature.
    unsafe { typed::<S>(dlsym(libc::RTLD_NEXT, S::SYM.name().as_ptr()) as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        for &s in Sym::ALL {
            assert_eq!(
                Sym::ALL.iter().filter(|t| t.name() == s.name()).count(),
                1,
                "{:?}",
                s
            );
            if s.hooked() {
                assert_eq!(Sym::hooked_by_name(s.name().to_bytes()), Some(s));
            }
        }
        assert_eq!(Sym::hooked_by_name(b"cuCtxGetDevice"), None);
        assert_eq!(Sym::hooked_by_name(b"cuMemAlloc"), None);
    }

    #[test]
    fn real_dlsym_is_glibcs() {
        let d = real_dlsym().expect("glibc dlsym");
        assert_ne!(d as usize, crate::dlsym::dlsym as *const () as usize);
        // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
        let p = unsafe { d(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert!(!p.is_null());
    }
}
