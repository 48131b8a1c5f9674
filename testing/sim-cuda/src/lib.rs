//! A simulated CUDA driver (`libsimcuda.so`, soname `libcuda.so.1`) for machines without a GPU.
//!
//! Every entry point has the real driver's name and C ABI (CUDA 12 `cuda.h`), so programs, the
//! eBPF probes (which read arguments by ABI position) and the preloaded limiter see a driver.
//! Memory is fake: addresses name nothing, copies move no data, launches run nothing; what is
//! simulated is the accounting (capacity, live bytes, pools), timing (per-call delays, launch time
//! that later synchronisation waits for) and failures. See `testing/README.md` for the knobs.
//!
//! Each exported symbol is its own function with its own address. On x86-64 it is a naked
//! four-instruction trampoline, `push %rbp; mov %rsp,%rbp; pop %rbp; jmp <impl>`, so that:
//! - no two symbols are folded to one address (by LLVM's function merging or a linker's ICF),
//! - every symbol starts with `push %rbp`, which uprobes emulate instead of single-stepping
//!   (like the 580 drivers; the 535 driver starts with a RIP-relative `cmpl`),
//! - the stack and argument registers are untouched when `<impl>` runs, so stack-passed
//!   arguments (`cuLaunchKernel` has 11) and return probes work as for a plain function.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. base: `config`, `types`. The configuration from the environment and the CUDA types.
//! 2. state: `procaddr`, `shared`, `state`, `runtime`. The simulated device's state, the file that
//!    processes share and the symbol lookup.
//! 3. entry points: `copy`, `device`, `launch`, `memory`, `memset`, `checkpoint`. The exported driver
//!    functions.

mod config;
mod procaddr;
mod runtime;
mod shared;
mod state;
mod types;

use state::{Obj, state};
use std::ffi::{CStr, c_char, c_int, c_void};
use types::*;

/// Writes `v` through the out-pointer `p`; false if `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T` (the caller's side of the API contract).
unsafe fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null and valid for writes per this function's contract; unaligned writes are
    // allowed because C callers may pass packed storage.
    unsafe { p.write_unaligned(v) };
    true
}

/// Reads a `T` from the in-pointer `p`; `None` if `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a read of `T`.
unsafe fn get<T>(p: *const T) -> Option<T> {
    // SAFETY: non-null and valid for reads per this function's contract.
    (!p.is_null()).then(|| unsafe { p.read_unaligned() })
}

/// Writes an out-pointer argument or returns `CUDA_ERROR_INVALID_VALUE` from the entry point.
macro_rules! out {
    ($p:expr, $v:expr) => {{
        // SAFETY: the CUDA API contract makes this argument NULL or a valid out-pointer of its
        // type; NULL is checked by `put`.
        if !unsafe { put($p, $v) } {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }};
}

/// Reads an in-pointer argument or returns `CUDA_ERROR_INVALID_VALUE` from the entry point.
macro_rules! input {
    ($p:expr) => {{
        // SAFETY: the CUDA API contract makes this argument NULL or a valid pointer to its type;
        // NULL is checked by `get`.
        match unsafe { get($p) } {
            Some(v) => v,
            None => return CUDA_ERROR_INVALID_VALUE,
        }
    }};
}

/// Declares the exported entry points: for each, an implementation in `imp` (wrapped in the
/// common prologue of [`Sym::call`](runtime::Sym::call)) and the exported symbol. Invoked once in
/// each entry-point module; the crate's [`EXPORTED`] and [`export_address`] gather the modules'
/// lists.
macro_rules! exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        mod imp {
            #![allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
            use super::*;
            $(
                #[inline(never)]
                pub(super) unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                    static SYM: Sym = Sym::new(stringify!($name));
                    SYM.call(|| $body)
                }
            )*
        }
        $(
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                core::arch::naked_asm!(
                    "push rbp",
                    "mov rbp, rsp",
                    "pop rbp",
                    "jmp {imp}",
                    imp = sym imp::$name,
                )
            }
            #[cfg(not(target_arch = "x86_64"))]
            #[unsafe(no_mangle)]
            #[inline(never)]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                // SAFETY: the same signature; the arguments are passed on unchanged.
                unsafe { imp::$name($($arg),*) }
            }
        )*

        /// Every entry point this module exports.
        pub(crate) const EXPORTED: &[&str] = &[$(stringify!($name)),*];

        /// The address of the exported entry point `name`, if this module exports it.
        pub(crate) fn export_address(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($name) => Some($name as *mut c_void),)*
                _ => None,
            }
        }

        /// The address of the implementation behind the exported entry point `name`: not
        /// exported, so no preloaded library's symbol of the same name stands in for it (the
        /// exported name's address, taken in this library, resolves to a preloaded limiter's
        /// hook), and no probe on the entry point sees a call to it.
        pub(crate) fn own_address(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($name) => Some(imp::$name as *mut c_void),)*
                _ => None,
            }
        }
    };
}

// The entry points, by what they do. Declared after the macros above, which they use.
mod checkpoint;
mod copy;
mod device;
mod launch;
mod memory;
mod memset;

/// Creates an object of kind `o` and writes its handle (converted by `make`) to `p`.
fn create<T>(p: *mut T, o: Obj, make: impl FnOnce(u64) -> T) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = state().new_object(o);
    out!(p, make(h));
    CUDA_SUCCESS
}

fn destroy(h: u64, f: impl Fn(&Obj) -> bool) -> CUresult {
    let mut s = state();
    if !s.is(h, f) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    s.objects.remove(&h);
    CUDA_SUCCESS
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `symbol` is a non-null NUL-terminated C string per the API contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let found = procaddr::resolve(&name, version, flags, |n| EXPORTED.contains(&n))
        .and_then(|n| export_address(&n));
    out!(pfn, found.unwrap_or(std::ptr::null_mut()));
    let (code, st) = match found {
        Some(_) => (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS),
        None => (CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    };
    // SAFETY: `status` is NULL or a valid out-pointer per the API; `put` checks NULL.
    unsafe { put(status, st) };
    code
}

/// Every entry-point module's list of its exports.
const EXPORTED_BY_MODULE: &[&[&str]] = &[
    device::EXPORTED,
    launch::EXPORTED,
    memory::EXPORTED,
    copy::EXPORTED,
    memset::EXPORTED,
    checkpoint::EXPORTED,
];

/// Every exported entry point.
pub const EXPORTED: &[&str] = &concat::<{ count(EXPORTED_BY_MODULE) }>(EXPORTED_BY_MODULE);

/// The address of the exported entry point `name`.
fn export_address(name: &str) -> Option<*mut c_void> {
    device::export_address(name)
        .or_else(|| launch::export_address(name))
        .or_else(|| memory::export_address(name))
        .or_else(|| copy::export_address(name))
        .or_else(|| memset::export_address(name))
        .or_else(|| checkpoint::export_address(name))
}

/// The implementation behind the exported entry point `name` (see each module's `own_address`).
fn own_address(name: &str) -> Option<*mut c_void> {
    device::own_address(name)
        .or_else(|| launch::own_address(name))
        .or_else(|| memory::own_address(name))
        .or_else(|| copy::own_address(name))
        .or_else(|| memset::own_address(name))
        .or_else(|| checkpoint::own_address(name))
}

/// The number of names in `lists`.
const fn count(lists: &[&[&str]]) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < lists.len() {
        n += lists[i].len();
        i += 1;
    }
    n
}

/// The names of `lists`, one list after another, as one array of `N` (their [`count`]).
const fn concat<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let mut all = [""; N];
    let (mut n, mut i) = (0, 0);
    while i < lists.len() {
        let mut j = 0;
        while j < lists[i].len() {
            all[n] = lists[i][j];
            n += 1;
            j += 1;
        }
        i += 1;
    }
    all
}

/// Not a driver API: the duration of this thread's last call of a symbol that sweeps
/// (`SIMCUDA_SWEEP`), ns, for benchmarks that subtract the driver's time from a call's.
// SAFETY: an exported name no driver or other library of the process defines (`simcuda_`).
#[unsafe(no_mangle)]
pub extern "C" fn simcuda_last_call_ns() -> u64 {
    runtime::last_call_ns()
}

/// Not a driver API: the implementation behind this library's entry point `name` (a
/// NUL-terminated C string), or null where it exports none. Calling through it reaches the
/// simulated driver past a preloaded limiter, which answers `dlsym` and `cuGetProcAddress` with
/// its hooks, and past any probe on the entry point: a benchmark times such direct calls beside
/// hooked ones, as `scripts/gpu/attribute_micro.cu` does with libcuda's own `cuLaunchKernel`.
///
/// # Safety
/// `name` is null or points to a NUL-terminated string.
// SAFETY: an exported name no driver or other library of the process defines (`simcuda_`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn simcuda_own_symbol(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    own_address(&name).unwrap_or(std::ptr::null_mut())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::api::APIS;

    #[test]
    fn own_symbols_are_the_implementations_behind_the_entry_points() {
        // SAFETY: NUL-terminated literals, and a null.
        unsafe {
            let own = simcuda_own_symbol(c"cuLaunchKernel".as_ptr());
            assert_eq!(own, own_address("cuLaunchKernel").unwrap());
            assert!(!own.is_null() && own != export_address("cuLaunchKernel").unwrap());
            assert!(simcuda_own_symbol(c"cuNoSuchThing".as_ptr()).is_null());
            assert!(simcuda_own_symbol(std::ptr::null()).is_null());
        }
    }

    #[test]
    fn every_traced_api_is_exported() {
        // NCCL entry points live in libnccl, not in the driver.
        for a in APIS.iter().filter(|a| !a.kind.is_nccl()) {
            assert!(EXPORTED.contains(&a.name), "{} is not exported", a.name);
        }
    }

    #[test]
    fn export_addresses_are_distinct() {
        let mut addrs: Vec<usize> = EXPORTED
            .iter()
            .map(|n| export_address(n).unwrap() as usize)
            .collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), EXPORTED.len());
    }
}
