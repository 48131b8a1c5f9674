//! `cuGetProcAddress` and `cuGetProcAddress_v2`: the path the CUDA runtime (12+) takes to every
//! driver function.
//!
//! The hook asks the real driver first, with the caller's symbol, CUDA version and flags, so the
//! driver alone decides which ABI variant answers (`_v2` or legacy, `_ptsz` for the per-thread
//! default stream) and fills `symbolStatus`. If the answer is the real address of a function we hook,
//! the caller gets our hook of exactly that variant; otherwise the driver's answer is untouched. A
//! request for `cuGetProcAddress` itself resolves to one of the two real entry points and so gets
//! our hook of it, which keeps later lookups intercepted.
//!
//! If the driver answers with an address that is not its export of the same function, the answer
//! is matched by the exported symbol at that address (`dladdr`); an answer that matches neither is
//! left alone and logged at debug level.

use std::ffi::{CStr, c_char, c_int, c_void};

use super::{
    context::*,
    gate::{Gate, address, enter, shield},
    info::*,
    init::*,
    launch::*,
    memory::*,
    passed::*,
    timed::*,
};
use crate::platform::{
    cuda::*,
    driver::{Driver, PfnGetProcAddress, PfnGetProcAddressV2, Sym, Symbol, dladdr, sym},
    log,
};

/// The address of this library's hook for `sym`, `None` for symbols that are only used.
pub(crate) fn hook_addr(sym: Sym) -> Option<*mut c_void> {
    let f: *const () = match sym {
        Sym::Init => cuInit as *const (),
        Sym::GetProcAddress => cuGetProcAddress as *const (),
        Sym::GetProcAddressV2 => cuGetProcAddress_v2 as *const (),
        Sym::MemAllocV2 => cuMemAlloc_v2 as *const (),
        Sym::MemAllocPitchV2 => cuMemAllocPitch_v2 as *const (),
        Sym::MemAllocManaged => cuMemAllocManaged as *const (),
        Sym::MemAllocAsync => cuMemAllocAsync as *const (),
        Sym::MemAllocAsyncPtsz => cuMemAllocAsync_ptsz as *const (),
        Sym::MemAllocFromPoolAsync => cuMemAllocFromPoolAsync as *const (),
        Sym::MemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz as *const (),
        Sym::MemFreeV2 => cuMemFree_v2 as *const (),
        Sym::MemFreeAsync => cuMemFreeAsync as *const (),
        Sym::MemFreeAsyncPtsz => cuMemFreeAsync_ptsz as *const (),
        Sym::MemCreate => cuMemCreate as *const (),
        Sym::MemRelease => cuMemRelease as *const (),
        Sym::MemMap => cuMemMap as *const (),
        Sym::MemUnmap => cuMemUnmap as *const (),
        Sym::MemSetAccess => cuMemSetAccess as *const (),
        Sym::MemRetainAllocationHandle => cuMemRetainAllocationHandle as *const (),
        Sym::MemGetAllocationPropertiesFromHandle => {
            cuMemGetAllocationPropertiesFromHandle as *const ()
        }
        Sym::MemExportToShareableHandle => cuMemExportToShareableHandle as *const (),
        Sym::MemMapArrayAsync => cuMemMapArrayAsync as *const (),
        Sym::MemPoolCreate => cuMemPoolCreate as *const (),
        Sym::MemPoolDestroy => cuMemPoolDestroy as *const (),
        Sym::MemPoolTrimTo => cuMemPoolTrimTo as *const (),
        Sym::MemGetInfoV2 => cuMemGetInfo_v2 as *const (),
        Sym::DeviceTotalMemV2 => cuDeviceTotalMem_v2 as *const (),
        Sym::DevicePrimaryCtxRetain => cuDevicePrimaryCtxRetain as *const (),
        Sym::CtxCreateV2 => cuCtxCreate_v2 as *const (),
        Sym::CtxCreateV3 => cuCtxCreate_v3 as *const (),
        Sym::CtxCreateV4 => cuCtxCreate_v4 as *const (),
        Sym::LaunchKernel => cuLaunchKernel as *const (),
        Sym::LaunchKernelPtsz => cuLaunchKernel_ptsz as *const (),
        Sym::LaunchKernelEx => cuLaunchKernelEx as *const (),
        Sym::LaunchKernelExPtsz => cuLaunchKernelEx_ptsz as *const (),
        Sym::LaunchCooperativeKernel => cuLaunchCooperativeKernel as *const (),
        Sym::LaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz as *const (),
        Sym::GraphLaunch => cuGraphLaunch as *const (),
        Sym::GraphLaunchPtsz => cuGraphLaunch_ptsz as *const (),
        Sym::CtxSynchronize => cuCtxSynchronize as *const (),
        Sym::CtxSynchronizeV2 => cuCtxSynchronize_v2 as *const (),
        Sym::StreamSynchronize => cuStreamSynchronize as *const (),
        Sym::StreamSynchronizePtsz => cuStreamSynchronize_ptsz as *const (),
        Sym::EventSynchronize => cuEventSynchronize as *const (),
        Sym::StreamWaitEvent => cuStreamWaitEvent as *const (),
        Sym::StreamWaitEventPtsz => cuStreamWaitEvent_ptsz as *const (),
        Sym::LaunchHostFunc => cuLaunchHostFunc as *const (),
        Sym::LaunchHostFuncPtsz => cuLaunchHostFunc_ptsz as *const (),
        Sym::Memcpy => cuMemcpy as *const (),
        Sym::MemcpyPtds => cuMemcpy_ptds as *const (),
        Sym::MemcpyAsync => cuMemcpyAsync as *const (),
        Sym::MemcpyAsyncPtsz => cuMemcpyAsync_ptsz as *const (),
        Sym::MemcpyHtoDV2 => cuMemcpyHtoD_v2 as *const (),
        Sym::MemcpyHtoDV2Ptds => cuMemcpyHtoD_v2_ptds as *const (),
        Sym::MemcpyDtoHV2 => cuMemcpyDtoH_v2 as *const (),
        Sym::MemcpyDtoHV2Ptds => cuMemcpyDtoH_v2_ptds as *const (),
        Sym::MemcpyDtoDV2 => cuMemcpyDtoD_v2 as *const (),
        Sym::MemcpyDtoDV2Ptds => cuMemcpyDtoD_v2_ptds as *const (),
        Sym::MemcpyHtoDAsyncV2 => cuMemcpyHtoDAsync_v2 as *const (),
        Sym::MemcpyHtoDAsyncV2Ptsz => cuMemcpyHtoDAsync_v2_ptsz as *const (),
        Sym::MemcpyDtoHAsyncV2 => cuMemcpyDtoHAsync_v2 as *const (),
        Sym::MemcpyDtoHAsyncV2Ptsz => cuMemcpyDtoHAsync_v2_ptsz as *const (),
        Sym::MemcpyDtoDAsyncV2 => cuMemcpyDtoDAsync_v2 as *const (),
        Sym::MemcpyDtoDAsyncV2Ptsz => cuMemcpyDtoDAsync_v2_ptsz as *const (),
        Sym::MemcpyPeer => cuMemcpyPeer as *const (),
        Sym::MemcpyPeerPtds => cuMemcpyPeer_ptds as *const (),
        Sym::MemcpyPeerAsync => cuMemcpyPeerAsync as *const (),
        Sym::MemcpyPeerAsyncPtsz => cuMemcpyPeerAsync_ptsz as *const (),
        Sym::MemcpyBatchAsync => cuMemcpyBatchAsync as *const (),
        Sym::MemcpyBatchAsyncPtsz => cuMemcpyBatchAsync_ptsz as *const (),
        Sym::MemcpyBatchAsyncV2 => cuMemcpyBatchAsync_v2 as *const (),
        Sym::MemcpyBatchAsyncV2Ptsz => cuMemcpyBatchAsync_v2_ptsz as *const (),
        Sym::Memcpy2DV2 => cuMemcpy2D_v2 as *const (),
        Sym::Memcpy2DV2Ptds => cuMemcpy2D_v2_ptds as *const (),
        Sym::Memcpy2DUnalignedV2 => cuMemcpy2DUnaligned_v2 as *const (),
        Sym::Memcpy2DUnalignedV2Ptds => cuMemcpy2DUnaligned_v2_ptds as *const (),
        Sym::Memcpy2DAsyncV2 => cuMemcpy2DAsync_v2 as *const (),
        Sym::Memcpy2DAsyncV2Ptsz => cuMemcpy2DAsync_v2_ptsz as *const (),
        Sym::Memcpy3DV2 => cuMemcpy3D_v2 as *const (),
        Sym::Memcpy3DV2Ptds => cuMemcpy3D_v2_ptds as *const (),
        Sym::Memcpy3DAsyncV2 => cuMemcpy3DAsync_v2 as *const (),
        Sym::Memcpy3DAsyncV2Ptsz => cuMemcpy3DAsync_v2_ptsz as *const (),
        Sym::Memcpy3DPeer => cuMemcpy3DPeer as *const (),
        Sym::Memcpy3DPeerPtds => cuMemcpy3DPeer_ptds as *const (),
        Sym::Memcpy3DPeerAsync => cuMemcpy3DPeerAsync as *const (),
        Sym::Memcpy3DPeerAsyncPtsz => cuMemcpy3DPeerAsync_ptsz as *const (),
        Sym::MemsetD8V2 => cuMemsetD8_v2 as *const (),
        Sym::MemsetD8V2Ptds => cuMemsetD8_v2_ptds as *const (),
        Sym::MemsetD2D8V2 => cuMemsetD2D8_v2 as *const (),
        Sym::MemsetD2D8V2Ptds => cuMemsetD2D8_v2_ptds as *const (),
        Sym::MemsetD8Async => cuMemsetD8Async as *const (),
        Sym::MemsetD8AsyncPtsz => cuMemsetD8Async_ptsz as *const (),
        Sym::MemsetD2D8Async => cuMemsetD2D8Async as *const (),
        Sym::MemsetD2D8AsyncPtsz => cuMemsetD2D8Async_ptsz as *const (),
        Sym::MemsetD16V2 => cuMemsetD16_v2 as *const (),
        Sym::MemsetD16V2Ptds => cuMemsetD16_v2_ptds as *const (),
        Sym::MemsetD2D16V2 => cuMemsetD2D16_v2 as *const (),
        Sym::MemsetD2D16V2Ptds => cuMemsetD2D16_v2_ptds as *const (),
        Sym::MemsetD16Async => cuMemsetD16Async as *const (),
        Sym::MemsetD16AsyncPtsz => cuMemsetD16Async_ptsz as *const (),
        Sym::MemsetD2D16Async => cuMemsetD2D16Async as *const (),
        Sym::MemsetD2D16AsyncPtsz => cuMemsetD2D16Async_ptsz as *const (),
        Sym::MemsetD32V2 => cuMemsetD32_v2 as *const (),
        Sym::MemsetD32V2Ptds => cuMemsetD32_v2_ptds as *const (),
        Sym::MemsetD2D32V2 => cuMemsetD2D32_v2 as *const (),
        Sym::MemsetD2D32V2Ptds => cuMemsetD2D32_v2_ptds as *const (),
        Sym::MemsetD32Async => cuMemsetD32Async as *const (),
        Sym::MemsetD32AsyncPtsz => cuMemsetD32Async_ptsz as *const (),
        Sym::MemsetD2D32Async => cuMemsetD2D32Async as *const (),
        Sym::MemsetD2D32AsyncPtsz => cuMemsetD2D32Async_ptsz as *const (),
        Sym::StreamWaitValue32 => cuStreamWaitValue32 as *const (),
        Sym::StreamWaitValue32Ptsz => cuStreamWaitValue32_ptsz as *const (),
        Sym::StreamWaitValue32V2 => cuStreamWaitValue32_v2 as *const (),
        Sym::StreamWaitValue32V2Ptsz => cuStreamWaitValue32_v2_ptsz as *const (),
        Sym::StreamWaitValue64 => cuStreamWaitValue64 as *const (),
        Sym::StreamWaitValue64Ptsz => cuStreamWaitValue64_ptsz as *const (),
        Sym::StreamWaitValue64V2 => cuStreamWaitValue64_v2 as *const (),
        Sym::StreamWaitValue64V2Ptsz => cuStreamWaitValue64_v2_ptsz as *const (),
        Sym::StreamWriteValue32 => cuStreamWriteValue32 as *const (),
        Sym::StreamWriteValue32Ptsz => cuStreamWriteValue32_ptsz as *const (),
        Sym::StreamWriteValue32V2 => cuStreamWriteValue32_v2 as *const (),
        Sym::StreamWriteValue32V2Ptsz => cuStreamWriteValue32_v2_ptsz as *const (),
        Sym::StreamWriteValue64 => cuStreamWriteValue64 as *const (),
        Sym::StreamWriteValue64Ptsz => cuStreamWriteValue64_ptsz as *const (),
        Sym::StreamWriteValue64V2 => cuStreamWriteValue64_v2 as *const (),
        Sym::StreamWriteValue64V2Ptsz => cuStreamWriteValue64_v2_ptsz as *const (),
        Sym::StreamBatchMemOp => cuStreamBatchMemOp as *const (),
        Sym::StreamBatchMemOpPtsz => cuStreamBatchMemOp_ptsz as *const (),
        Sym::StreamBatchMemOpV2 => cuStreamBatchMemOp_v2 as *const (),
        Sym::StreamBatchMemOpV2Ptsz => cuStreamBatchMemOp_v2_ptsz as *const (),
        Sym::MemcpyAtoDV2 => cuMemcpyAtoD_v2 as *const (),
        Sym::MemcpyAtoDV2Ptds => cuMemcpyAtoD_v2_ptds as *const (),
        Sym::MemcpyDtoAV2 => cuMemcpyDtoA_v2 as *const (),
        Sym::MemcpyDtoAV2Ptds => cuMemcpyDtoA_v2_ptds as *const (),
        Sym::CtxGetDevice
        | Sym::MemPoolGetAttribute
        | Sym::DeviceGetMemPool
        | Sym::DeviceGetUuidV2
        | Sym::DeviceGetCount
        | Sym::EventCreate
        | Sym::EventRecord
        | Sym::EventQuery
        | Sym::EventElapsedTime
        | Sym::EventDestroyV2
        | Sym::FuncGetName
        | Sym::KernelGetName
        | Sym::StreamIsCapturing
        | Sym::ThreadExchangeStreamCaptureMode
        | Sym::CtxGetCurrent
        | Sym::CtxSetCurrent
        | Sym::MemAddressReserve
        | Sym::MemAddressFree
        | Sym::MemGetAllocationGranularity
        | Sym::MemHostRegisterV2
        | Sym::MemHostUnregister => return None,
    };
    Some(address(f))
}

/// The hook to hand out instead of the driver's `p`, if `p` is a function we hook.
pub(crate) fn substitute(driver: &Driver, p: *mut c_void) -> Option<*mut c_void> {
    if p.is_null() {
        return None;
    }
    if let Some(s) = driver.sym_at(p).filter(|s| s.hooked()) {
        return hook_addr(s);
    }
    let s = exported_sym_at(driver, p)?;
    hook_addr(s)
}

/// The hooked symbol that the driver's library exports exactly at `p`.
fn exported_sym_at(driver: &Driver, p: *mut c_void) -> Option<Sym> {
    let info = dladdr(p)?;
    let driver_base = dladdr(driver.addr(Sym::Init) as *mut c_void)?.dli_fbase;
    if info.dli_saddr != p || info.dli_sname.is_null() || info.dli_fbase != driver_base {
        return None;
    }
    // SAFETY: `dli_sname` is non-null and points to a NUL-terminated name in the object's string
    // table, which stays mapped (the driver is opened with RTLD_NODELETE).
    let name = unsafe { CStr::from_ptr(info.dli_sname) };
    Sym::hooked_by_name(name.to_bytes())
}

fn lookup<S: Symbol>(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    call: impl FnOnce(S::Fn) -> CUresult,
) -> CUresult {
    let h = match enter::<S>() {
        Gate::Direct(f) => return call(f),
        Gate::Fail(code) => return code,
        Gate::Hook(h) => h,
    };
    let t0 = h.state.clock.now();
    let r = call(h.real);
    let t1 = h.state.clock.now();
    shield(|| {
        if r == CUDA_SUCCESS && !pfn.is_null() {
            // SAFETY: the driver succeeded and wrote the answer to the caller's `pfn`.
            let answer = unsafe { pfn.read() };
            match substitute(h.state.driver, answer) {
                // SAFETY: as above; the caller expects a function of the symbol's signature, and
                // the hook of the same variant has exactly that signature.
                Some(hook) => unsafe { pfn.write(hook) },
                None if log::enabled(h.state.log_level(), log::Level::Debug)
                    && !symbol.is_null() =>
                {
                    // SAFETY: the driver accepted `symbol` as a NUL-terminated name.
                    let name = unsafe { CStr::from_ptr(symbol) };
                    if name.to_bytes().starts_with(b"cu")
                        && Sym::ALL
                            .iter()
                            .any(|s| s.hooked() && name_base(s.name()) == name.to_bytes())
                    {
                        log::debug!(
                            h.state.log_level(),
                            "cuGetProcAddress({}): driver answer {answer:p} is not a known entry point",
                            name.to_string_lossy()
                        );
                    }
                }
                None => {}
            }
        }
        h.record(S::SYM, t0, t1, r == CUDA_SUCCESS);
    });
    r
}

/// A symbol's name without its ABI suffix (`cuMemAlloc_v2` -> `cuMemAlloc`), as requested from
/// `cuGetProcAddress`.
fn name_base(name: &CStr) -> &[u8] {
    let b = name.to_bytes();
    for suffix in [&b"_ptsz"[..], b"_ptds", b"_v2", b"_v3", b"_v4"] {
        if let Some(base) = b.strip_suffix(suffix) {
            return base;
        }
    }
    b
}

/// # Safety
/// The caller follows the contract of the driver's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: forwards the caller's arguments unchanged.
    lookup::<sym::GetProcAddress>(symbol, pfn, |real: PfnGetProcAddress| unsafe {
        real(symbol, pfn, cuda_version, flags)
    })
}

/// # Safety
/// The caller follows the contract of the driver's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    lookup::<sym::GetProcAddressV2>(symbol, pfn, |real: PfnGetProcAddressV2| {
        // SAFETY: forwards the caller's arguments unchanged.
        unsafe { real(symbol, pfn, cuda_version, flags, symbol_status) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hooked_symbol_has_a_distinct_hook() {
        let mut seen = Vec::new();
        for &s in Sym::ALL {
            let addr = hook_addr(s);
            assert_eq!(addr.is_some(), s.hooked(), "{s:?}");
            if let Some(a) = addr {
                assert!(!seen.contains(&a), "{s:?} shares a hook");
                seen.push(a);
            }
        }
    }

    #[test]
    fn base_names() {
        assert_eq!(name_base(c"cuMemAlloc_v2"), b"cuMemAlloc");
        assert_eq!(name_base(c"cuLaunchKernel_ptsz"), b"cuLaunchKernel");
        assert_eq!(name_base(c"cuLaunchKernel"), b"cuLaunchKernel");
    }
}
