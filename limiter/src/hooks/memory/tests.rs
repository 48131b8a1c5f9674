//! The allocation and free hooks in process, over the fake driver of `test_support`: what is
//! reserved, kept, returned and recorded for each outcome of the driver call.

use super::*;
use crate::{
    runtime,
    test_support::{Cx, DEVICE_POOL, config, device},
};

const MIB: u64 = 1 << 20;

fn alloc(cx: &Cx, bytes: u64) -> (CUresult, u64) {
    let mut addr = 0u64;
    let out: *mut u64 = &mut addr;
    let n = bytes as usize;
    let r = allocate_hooked::<sym::MemAllocV2>(
        cx.hooked::<sym::MemAllocV2>(),
        out,
        Space::Ptr,
        on_current(n),
        // SAFETY: the fake driver's function with a valid out-pointer.
        |real| unsafe { real(out, n) },
    );
    (r, addr)
}

fn free(cx: &Cx, addr: u64) -> CUresult {
    free_hooked::<sym::MemFreeV2>(
        cx.hooked::<sym::MemFreeV2>(),
        addr,
        Space::Ptr,
        // SAFETY: the fake driver's function.
        |real| unsafe { real(addr) },
    )
}

fn alloc_async(cx: &Cx, bytes: u64) -> (CUresult, u64) {
    let mut addr = 0u64;
    let out: *mut u64 = &mut addr;
    let n = bytes as usize;
    let r = allocate_hooked::<sym::MemAllocAsync>(
        cx.hooked::<sym::MemAllocAsync>(),
        out,
        Space::Ptr,
        from_pool(n, None),
        // SAFETY: the fake driver's function with a valid out-pointer.
        |real| unsafe { real(out, n, std::ptr::null_mut()) },
    );
    (r, addr)
}

fn free_async(cx: &Cx, addr: u64) -> CUresult {
    free_hooked::<sym::MemFreeAsync>(
        cx.hooked::<sym::MemFreeAsync>(),
        addr,
        Space::Ptr,
        // SAFETY: the fake driver's function.
        |real| unsafe { real(addr, std::ptr::null_mut()) },
    )
}

fn used(cx: &Cx) -> u64 {
    cx.process.ledger.used(0)
}

fn driver_calls() -> Vec<&'static str> {
    device(|d| d.calls.clone())
}

#[test]
fn an_allocation_is_reserved_kept_and_returned_by_its_free() {
    let cx = Cx::new(config(64 * MIB), "mem1");
    let (r, addr) = alloc(&cx, 3 * MIB);
    assert_eq!(r, CUDA_SUCCESS);
    // 3 MiB rounds up to the 2 MiB granule.
    assert_eq!(used(&cx), 4 * MIB);
    assert_eq!(free(&cx, addr), CUDA_SUCCESS);
    assert_eq!(used(&cx), 0);
    assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 0, 4 * MIB, 0, 0]);
    assert_eq!(cx.recorded("cuMemFree_v2"), [1, 0, 0, 4 * MIB, 0]);
    assert_eq!(driver_calls(), ["cuMemAlloc_v2", "cuMemFree_v2"]);
}

#[test]
fn an_allocation_past_the_limit_is_denied_without_calling_the_driver() {
    let cx = Cx::new(config(8 * MIB), "mem2");
    assert_eq!(alloc(&cx, 6 * MIB).0, CUDA_SUCCESS);
    assert_eq!(alloc(&cx, 4 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(driver_calls(), ["cuMemAlloc_v2"]);
    assert_eq!(used(&cx), 6 * MIB);
    let [calls, errors, _, _, denied] = cx.recorded("cuMemAlloc_v2");
    assert_eq!((calls, errors, denied), (2, 1, 1));
}

#[test]
fn a_failed_allocation_returns_its_reservation() {
    let cx = Cx::new(config(64 * MIB), "mem3");
    device(|d| d.failing.push("cuMemAlloc_v2"));
    assert_eq!(alloc(&cx, 2 * MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(used(&cx), 0);
    assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 0]);
}

#[test]
fn a_failed_free_keeps_the_charge_and_an_unknown_free_still_reaches_the_driver() {
    let cx = Cx::new(config(64 * MIB), "mem4");
    let (_, addr) = alloc(&cx, 2 * MIB);
    device(|d| d.failing.push("cuMemFree_v2"));
    assert_ne!(free(&cx, addr), CUDA_SUCCESS);
    assert_eq!(used(&cx), 2 * MIB, "the address is still allocated");
    device(|d| d.failing.clear());
    assert_eq!(free(&cx, addr), CUDA_SUCCESS);
    assert_eq!(used(&cx), 0);
    // Freed again: not ours any more, but the driver answers it.
    assert_ne!(free(&cx, addr), CUDA_SUCCESS);
    assert_eq!(
        driver_calls(),
        [
            "cuMemAlloc_v2",
            "cuMemFree_v2",
            "cuMemFree_v2",
            "cuMemFree_v2"
        ]
    );
    assert_eq!(cx.recorded("cuMemFree_v2"), [3, 2, 0, 2 * MIB, 0]);
}

#[test]
fn the_context_is_charged_once_and_held_and_refuses_what_does_not_fit() {
    let mut c = config(64 * MIB);
    c.context_bytes = 16 * MIB;
    let cx = Cx::new(c, "mem5");
    let (_, a) = alloc(&cx, 2 * MIB);
    let (_, b) = alloc(&cx, 2 * MIB);
    assert_eq!(used(&cx), 20 * MIB);
    free(&cx, a);
    free(&cx, b);
    assert_eq!(used(&cx), 16 * MIB, "the context stays charged");
    // A context larger than the limit: the allocation is refused before the driver.
    let mut c = config(8 * MIB);
    c.context_bytes = 16 * MIB;
    let small = Cx::new(c, "mem6");
    device(|d| d.calls.clear());
    assert_eq!(alloc(&small, MIB).0, CUDA_ERROR_OUT_OF_MEMORY);
    assert!(driver_calls().is_empty());
    assert_eq!(used(&small), 0);
}

#[test]
fn a_panic_in_the_logic_falls_through_to_the_driver_and_is_counted() {
    let mut c = config(64 * MIB);
    c.debug_panic_in = Some("cuMemAlloc_v2".into());
    let cx = Cx::new(c, "mem7");
    let before = runtime::get().panics();
    let (r, _) = alloc(&cx, 2 * MIB);
    assert_eq!(r, CUDA_SUCCESS, "the call still reaches the driver, once");
    assert_eq!(driver_calls(), ["cuMemAlloc_v2"]);
    assert_eq!(used(&cx), 0, "unaccounted");
    assert_eq!(cx.recorded("cuMemAlloc_v2"), [1, 1, 0, 0, 0]);
    assert!(runtime::get().panics() > before);
}

#[test]
fn a_reused_address_returns_the_stale_charge() {
    let cx = Cx::new(config(64 * MIB), "mem8");
    let (_, addr) = alloc(&cx, 2 * MIB);
    // The driver freed it without the limiter seeing it, and hands it out again.
    device(|d| {
        d.live.clear();
        d.failing.clear();
    });
    let mut again = 0;
    let out: *mut u64 = &mut again;
    let r = allocate_hooked::<sym::MemAllocV2>(
        cx.hooked::<sym::MemAllocV2>(),
        out,
        Space::Ptr,
        on_current(2 << 20),
        // SAFETY: writes the reused address to the valid out-pointer.
        |_| unsafe {
            out.write(addr);
            CUDA_SUCCESS
        },
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(used(&cx), 2 * MIB, "one charge for one live address");
}

#[test]
fn a_pool_is_charged_what_it_holds_until_trimmed() {
    let cx = Cx::new(config(64 * MIB), "mem9");
    let (r, addr) = alloc_async(&cx, MIB);
    assert_eq!(r, CUDA_SUCCESS);
    // The pool grew by its 2 MiB granule, not the 1 MiB asked.
    assert_eq!(used(&cx), 2 * MIB);
    assert_eq!(free_async(&cx, addr), CUDA_SUCCESS);
    assert_eq!(used(&cx), 2 * MIB, "freed memory stays in the pool");
    let pool = DEVICE_POOL as CUmemoryPool;
    let r = pool_op_hooked::<sym::MemPoolTrimTo>(
        cx.hooked::<sym::MemPoolTrimTo>(),
        // SAFETY: the fake driver's function.
        |real| unsafe { real(pool, 0) },
        trimmed(pool),
    );
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(used(&cx), 0);
    // Grown again, then destroyed: its charge goes.
    alloc_async(&cx, 3 * MIB);
    assert_eq!(used(&cx), 4 * MIB);
    pool_op_hooked::<sym::MemPoolDestroy>(
        cx.hooked::<sym::MemPoolDestroy>(),
        // SAFETY: the fake driver's function.
        |real| unsafe { real(pool) },
        destroyed(pool),
    );
    assert_eq!(used(&cx), 0);
}

#[test]
fn a_denial_settles_the_pools_and_retries_once() {
    let cx = Cx::new(config(8 * MIB), "mem10");
    let (_, addr) = alloc_async(&cx, 6 * MIB);
    free_async(&cx, addr);
    assert_eq!(used(&cx), 6 * MIB);
    // A synchronisation trimmed the pool: the limiter does not know yet.
    device(|d| d.pools.insert(DEVICE_POOL, 0));
    let (r, _) = alloc(&cx, 4 * MIB);
    assert_eq!(
        r, CUDA_SUCCESS,
        "the pool's cached memory does not block it"
    );
    assert_eq!(used(&cx), 4 * MIB);
}

fn alloc_pitched(cx: &Cx, width: usize, height: usize) -> (CUresult, u64, usize) {
    let (mut addr, mut pitch) = (0u64, 0usize);
    let (out, p): (*mut u64, *mut usize) = (&mut addr, &mut pitch);
    let r = allocate_pitched(
        cx.hooked::<sym::MemAllocPitchV2>(),
        out,
        p,
        width,
        height,
        // SAFETY: the fake driver's function with valid out-pointers.
        |real| unsafe { real(out, p, width, height, 4) },
    );
    (r, addr, pitch)
}

#[test]
fn a_pitched_allocation_is_corrected_to_its_pitch_or_refused() {
    let cx = Cx::new(config(64 * MIB), "mem11");
    device(|d| d.pitch_align = 2048);
    // Estimated as 1536-byte rows (153,600), the driver chose 2048 (204,800).
    let (r, addr, pitch) = alloc_pitched(&cx, 1100, 100);
    assert_eq!((r, pitch), (CUDA_SUCCESS, 2048));
    assert_eq!(used(&cx), 204_800);
    free(&cx, addr);
    assert_eq!(used(&cx), 0);
    // Room for the estimate, not for the pitch the driver chose: freed and refused.
    let tight = Cx::new(config(160_000), "mem12");
    device(|d| d.calls.clear());
    let (r, _, _) = alloc_pitched(&tight, 1100, 100);
    assert_eq!(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(driver_calls(), ["cuMemAllocPitch_v2", "cuMemFree_v2"]);
    assert!(device(|d| d.live.is_empty()));
    assert_eq!(used(&tight), 0);
}

fn create(cx: &Cx, size: usize, kind: i32) -> (CUresult, u64) {
    let prop = CUmemAllocationProp {
        kind: 1,
        requested_handle_types: 0,
        location: CUmemLocation { kind, id: 0 },
    };
    let mut handle = 0u64;
    let out: *mut u64 = &mut handle;
    let r = allocate_hooked::<sym::MemCreate>(
        cx.hooked::<sym::MemCreate>(),
        out,
        Space::Handle,
        at_location(size, &prop),
        // SAFETY: the fake driver's function with valid pointers.
        |real| unsafe { real(out, size, &prop, 0) },
    );
    (r, handle)
}

#[test]
fn created_memory_is_charged_on_devices_and_released_by_its_handle() {
    let cx = Cx::new(config(64 * MIB), "mem13");
    let (r, on_device) = create(&cx, 4 << 20, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_eq!(r, CUDA_SUCCESS);
    assert_eq!(used(&cx), 4 * MIB);
    // A host location is not the device's memory.
    let (_, on_host) = create(&cx, 4 << 20, 2);
    assert_eq!(used(&cx), 4 * MIB);
    for handle in [on_device, on_host] {
        let r = free_hooked::<sym::MemRelease>(
            cx.hooked::<sym::MemRelease>(),
            handle,
            Space::Handle,
            // SAFETY: the fake driver's function.
            |real| unsafe { real(handle) },
        );
        assert_eq!(r, CUDA_SUCCESS);
    }
    assert_eq!(used(&cx), 0);
    // A handle is not an address: freeing it as one releases nothing.
    let (_, h) = create(&cx, 2 << 20, CU_MEM_LOCATION_TYPE_DEVICE);
    free(&cx, h);
    assert_eq!(used(&cx), 2 * MIB);
}
