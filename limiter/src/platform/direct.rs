//! Direct (PC-relative) addresses of the runtime's static, which the hooks read on every call.
//!
//! Rust's x86_64 Linux targets do not emit relaxable GOT relocations, so in this shared library
//! every use of a static compiles to a load of its address from the GOT first: on a call that
//! finds its caches cold, one more dependent cache miss and a page of GOT per static, before
//! the static itself. [`direct!`] computes the address with one `lea` instead (the statics are
//! private to the library, so the linker resolves it at link time).

/// `&'static` reference to the private static `$s`, its address computed PC-relative.
#[cfg(target_arch = "x86_64")]
macro_rules! direct {
    ($s:path) => {{
        let addr: *const u8;
        // SAFETY: `lea` of a static's address reads no memory and has no other effect.
        #[allow(unused_unsafe)]
        unsafe {
            ::std::arch::asm!(
                "lea {addr}, [rip + {s}]",
                addr = out(reg) addr,
                s = sym $s,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        $crate::platform::direct::typed(&$s, addr)
    }};
}

#[cfg(not(target_arch = "x86_64"))]
macro_rules! direct {
    ($s:path) => {
        &$s
    };
}

/// `addr`, the address of `_witness`, as a reference of its type. The witness only names the type:
/// its own address (a GOT load) is dead code and optimised away.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn typed<T>(_witness: &'static T, addr: *const u8) -> &'static T {
    // SAFETY: the caller passes the address of the static `_witness` refers to: valid, aligned,
    // initialised (statics are), and alive for the whole program.
    unsafe { &*addr.cast::<T>() }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    static PROBE: AtomicU64 = AtomicU64::new(7);

    #[test]
    fn direct_address_is_the_static() {
        let d: &'static AtomicU64 = direct!(PROBE);
        assert!(std::ptr::eq(d, &PROBE));
        d.store(9, Ordering::Relaxed);
        assert_eq!(PROBE.load(Ordering::Relaxed), 9);
    }
}
