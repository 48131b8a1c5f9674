//! The `dlsym` override.
//!
//! `dlsym(handle_of_libcuda, "cuMemAlloc_v2")` searches libcuda's own scope and so bypasses
//! `LD_PRELOAD` interposition; the CUDA runtime, ctypes and most frameworks find the driver this
//! way. This library therefore exports `dlsym` and answers lookups of the names it hooks with its
//! hooks:
//!
//! - `RTLD_DEFAULT`/`RTLD_NEXT` and a hooked name: the hook.
//! - Any other handle and a hooked name: glibc's answer for that handle, replaced by the hook only
//!   when it is the bound driver's function of that name (so a library that merely defines a
//!   function of the same name keeps its own, and a handle without the name still gets NULL).
//! - Everything else, and every lookup made while the thread is inside the limiter (the driver
//!   resolving its own functions while we call it, hami-core.md §1.1 / HAMi-core PR #326), goes to
//!   glibc's `dlsym` untouched and without allocation.
//!
//! glibc defines `RTLD_NEXT` relative to the *caller's* return address, so forwarding with a normal
//! call would make every `dlsym(RTLD_NEXT, ...)` in the process resolve relative to this library
//! (HAMi #2903: LLVM OpenMP found itself and spun). On x86_64 the export is therefore a naked
//! function that asks [`dlsym_decide`] and then *tail-jumps* into glibc with the caller's return
//! address still on the stack. Elsewhere a plain forwarder is used, with that caveat.
//!
//! The real `dlsym` comes from `dlvsym` (`platform::driver::find_real_dlsym`, kept by the
//! runtime); this crate never calls the public name `dlsym` (clippy's `disallowed-methods`
//! forbids `libc::dlsym` here).

use std::ffi::{CStr, c_char, c_void};

use super::{lookup::hook_addr, nvml::hook_for};
use crate::{platform::driver::Sym, runtime};

/// What the naked `dlsym` does: return `hook` if it is non-null, else tail-jump to `real` (glibc's
/// `dlsym`) with the original arguments, else return NULL. Returned in `rax:rdx` (SysV: a 16-byte
/// struct of two INTEGER eightbytes).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Decision {
    hook: *mut c_void,
    real: *mut c_void,
}

/// Decides a `dlsym` lookup. Never unwinds: a panic while deciding means "untouched".
extern "C" fn dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> Decision {
    let rt = runtime::get();
    let real = rt
        .real_dlsym()
        .map_or(std::ptr::null_mut(), |f| f as *mut c_void);
    let hook = rt
        .shield(|| decide_hook(handle, symbol))
        .flatten()
        .unwrap_or(std::ptr::null_mut());
    Decision { hook, real }
}

/// Our hook for this lookup, or `None` to leave it to glibc.
fn decide_hook(handle: *mut c_void, symbol: *const c_char) -> Option<*mut c_void> {
    if symbol.is_null() {
        return None;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if name.starts_with(b"nvml") {
        return decide_nvml(handle, symbol, name);
    }
    if !name.starts_with(b"cu") {
        return None;
    }
    let sym = Sym::hooked_by_name(name)?;
    let hook = hook_addr(sym)?;
    let rt = runtime::get();
    // Inside the limiter (our own initialisation, or the driver while we call it): untouched.
    let guard = rt.enter()?;
    if handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return Some(hook);
    }
    let real = rt.real_dlsym()?;
    // SAFETY: the caller's handle and NUL-terminated name, passed to glibc's dlsym. A normal call is
    // fine here: the handle is not RTLD_NEXT, so the caller's identity does not matter.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() {
        return None;
    }
    if found == hook {
        return Some(hook);
    }
    let driver = rt.driver(&guard).ok()?;
    (driver.addr(sym) == found as usize).then_some(hook)
}

/// NVML names: the hook when glibc's answer is the function of that name in a `libnvidia-ml`
/// library (the real NVML, or a stand-in installed under that name).
fn decide_nvml(handle: *mut c_void, symbol: *const c_char, name: &[u8]) -> Option<*mut c_void> {
    let hook = hook_for(name)?;
    let rt = runtime::get();
    let _guard = rt.enter()?;
    if handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return Some(hook);
    }
    let real = rt.real_dlsym()?;
    // SAFETY: the caller's handle and NUL-terminated name, passed to glibc's dlsym.
    let found = unsafe { real(handle, symbol) };
    if found.is_null() || found == hook {
        return (!found.is_null()).then_some(hook);
    }
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `found` is an address glibc returned; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(found, &mut info) } == 0
        || info.dli_fname.is_null()
        || info.dli_sname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr filled both with NUL-terminated strings owned by the loader.
    let (file, sname) = unsafe {
        (
            CStr::from_ptr(info.dli_fname).to_bytes(),
            CStr::from_ptr(info.dli_sname).to_bytes(),
        )
    };
    let base = file.rsplit(|&b| b == b'/').next().unwrap_or(file);
    (base.starts_with(b"libnvidia-ml") && sname == name).then_some(hook)
}

/// The exported `dlsym` (x86_64): see the module documentation.
///
/// # Safety
/// dlsym's contract: `handle` is a handle from `dlopen`, `RTLD_DEFAULT` or `RTLD_NEXT`, and
/// `symbol` a NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // On entry rsp = 8 (mod 16). Two pushes and 8 bytes of padding make it 0 (mod 16) for the call,
    // as the SysV ABI requires; rdi/rsi are restored for the tail jump.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "test rdx, rdx",
        "jz 2f",
        "jmp rdx",
        "2:",
        "ret",
        decide = sym dlsym_decide,
    )
}

/// The exported `dlsym` on targets without the tail-jump forwarder: `dlsym(RTLD_NEXT, ...)` from
/// other libraries resolves relative to this library there.
///
/// # Safety
/// dlsym's contract, as above.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let d = dlsym_decide(handle, symbol);
    if !d.hook.is_null() || d.real.is_null() {
        return d.hook;
    }
    // SAFETY: `d.real` is glibc's dlsym.
    let real =
        unsafe { std::mem::transmute::<*mut c_void, crate::platform::driver::DlsymFn>(d.real) };
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real(handle, symbol) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhooked_names_go_to_glibc() {
        // SAFETY: RTLD_DEFAULT and NUL-terminated names.
        unsafe {
            assert!(!dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()).is_null());
            assert!(dlsym(libc::RTLD_DEFAULT, c"no_such_symbol_anywhere".as_ptr()).is_null());
        }
    }

    #[test]
    fn hooked_names_under_default_handles_are_hooks() {
        for (handle, name) in [
            (libc::RTLD_DEFAULT, c"cuMemAlloc_v2"),
            (libc::RTLD_NEXT, c"cuLaunchKernel_ptsz"),
        ] {
            // SAFETY: a pseudo-handle and a NUL-terminated name.
            let p = unsafe { dlsym(handle, name.as_ptr()) };
            let sym = Sym::hooked_by_name(name.to_bytes()).unwrap();
            assert_eq!(Some(p), hook_addr(sym), "{name:?}");
        }
    }

    #[test]
    fn lookups_inside_the_limiter_are_untouched() {
        let _g = runtime::get().enter().unwrap();
        // SAFETY: RTLD_DEFAULT and a NUL-terminated name.
        let p = unsafe { dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2".as_ptr()) };
        // In the test binary glibc finds the test binary's own (non-dynamic) symbol or nothing,
        // never a substituted answer from us.
        let hook = hook_addr(Sym::MemAllocV2).unwrap();
        assert!(p.is_null() || p == hook);
    }
}
