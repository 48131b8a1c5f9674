//! The memory-pattern commands (`alloc-free`, `hold`, `pressure`): a random sequence of
//! allocations and frees, one held allocation, and allocating until the memory limit refuses.

use serde_json::json;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cli::Mix;
use crate::driver::{self, CUresult, Driver};
use crate::record::{Recorder, print};

/// splitmix64: a small deterministic generator (the sequence depends only on the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `1..=max` (max >= 1).
    fn size(&mut self, max: u64) -> u64 {
        1 + self.next() % max.max(1)
    }
}

/// A live allocation made by alloc-free.
enum Live {
    /// Freed with cuMemFree_v2.
    Ptr { ptr: u64, size: u64 },
    /// From a pool: freed with cuMemFreeAsync or its `_ptsz` form.
    Async { ptr: u64, size: u64 },
    /// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess.
    Mapped { handle: u64, va: u64, size: u64 },
}

impl Live {
    fn size(&self) -> u64 {
        match self {
            Live::Ptr { size, .. } | Live::Async { size, .. } | Live::Mapped { size, .. } => *size,
        }
    }
}

pub fn alloc_free(
    drv: &Driver,
    ops: u64,
    seed: u64,
    max_size: u64,
    mix: Mix,
) -> Result<ExitCode, String> {
    let mut rec = Recorder::default();
    let r = drv.init();
    rec.record("cuInit", r, 0);
    if r != Some(0) {
        return Err(format!(
            "cuInit returned {r:?}: alloc-free needs a driver with a device (the sim)"
        ));
    }
    drv.primary_context(&mut |n, r, s| rec.record(n, r, s))
        .map_err(|e| format!("setting up a context: {e}"))?;
    let (r, pool) = drv.default_mem_pool();
    rec.record("cuDeviceGetDefaultMemPool", r, 0);
    let (r, gran) = drv.allocation_granularity();
    rec.record("cuMemGetAllocationGranularity", r, 0);
    let gran = if r == Some(0) && gran > 0 {
        gran as u64
    } else {
        driver::DEFAULT_GRANULARITY as u64
    };

    let ptr_apis = [
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
    ];
    let mut choices: Vec<&str> = Vec::new();
    if mix != Mix::Handle {
        choices.extend(ptr_apis.iter().filter(|n| drv.has(n)));
    }
    if mix != Mix::Ptr && drv.has("cuMemCreate") {
        choices.push("cuMemCreate");
    }
    if choices.is_empty() {
        return Err("the library exports none of the allocation APIs".into());
    }

    let mut rng = Rng(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut failed_allocs = 0u64;
    for _ in 0..ops {
        if live.is_empty() || rng.next() % 100 < 60 {
            let api = choices[(rng.next() % choices.len() as u64) as usize];
            let size = rng.size(max_size);
            let made = match api {
                "cuMemAlloc_v2" => {
                    let (r, p) = drv.mem_alloc(size as usize);
                    rec.record(api, r, size);
                    (r == Some(0)).then_some(Live::Ptr { ptr: p, size })
                }
                "cuMemAllocManaged" => {
                    let (r, p) = drv.mem_alloc_managed(size as usize);
                    rec.record(api, r, size);
                    (r == Some(0)).then_some(Live::Ptr { ptr: p, size })
                }
                "cuMemAllocPitch_v2" => {
                    let width = rng.size(size.min(1 << 16));
                    let height = (size / width).max(1);
                    let (r, p, pitch) = drv.mem_alloc_pitch(width as usize, height as usize);
                    rec.record(api, r, 0);
                    (r == Some(0)).then_some(Live::Ptr {
                        ptr: p,
                        size: pitch as u64 * height,
                    })
                }
                "cuMemAllocAsync" | "cuMemAllocAsync_ptsz" => {
                    let (r, p) = drv.mem_alloc_async(api, size as usize);
                    rec.record(api, r, size);
                    (r == Some(0)).then_some(Live::Async { ptr: p, size })
                }
                "cuMemAllocFromPoolAsync" | "cuMemAllocFromPoolAsync_ptsz" => {
                    let (r, p) = drv.mem_alloc_from_pool(api, size as usize, pool);
                    rec.record(api, r, size);
                    (r == Some(0)).then_some(Live::Async { ptr: p, size })
                }
                _ => map_new(drv, &mut rec, size.div_ceil(gran) * gran),
            };
            match made {
                Some(l) => live.push(l),
                None => failed_allocs += 1,
            }
        } else {
            let l = live.swap_remove((rng.next() % live.len() as u64) as usize);
            match l {
                Live::Ptr { ptr, .. } => rec.record("cuMemFree_v2", drv.mem_free(ptr), 0),
                Live::Async { ptr, .. } => {
                    let api = if rng.next().is_multiple_of(2) {
                        "cuMemFreeAsync"
                    } else {
                        "cuMemFreeAsync_ptsz"
                    };
                    let api = if drv.has(api) { api } else { "cuMemFreeAsync" };
                    rec.record(api, drv.mem_free_async(api, ptr), 0);
                }
                Live::Mapped { handle, va, size } => {
                    rec.record("cuMemUnmap", drv.mem_unmap(va, size as usize), size);
                    rec.record("cuMemAddressFree", drv.address_free(va, size as usize), 0);
                    rec.record("cuMemRelease", drv.mem_release(handle), 0);
                }
            }
        }
    }
    // A synchronisation point: pools give back cached memory above their release threshold.
    rec.record("cuCtxSynchronize", drv.ctx_synchronize(), 0);
    let (r, free, total) = drv.mem_get_info();
    rec.record("cuMemGetInfo_v2", r, 0);
    let live_bytes: u64 = live.iter().map(Live::size).sum();
    print(json!({
        "pid": std::process::id(),
        "ops": ops,
        "seed": seed,
        "live_bytes": live_bytes,
        "live_allocations": live.len(),
        "failed_allocations": failed_allocs,
        "mem_info": {"result": r, "free": free, "total": total, "used": total.saturating_sub(free)},
        "calls": rec.calls,
        "missing": rec.missing,
    }));
    Ok(ExitCode::SUCCESS)
}

/// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess; undone on failure.
fn map_new(drv: &Driver, rec: &mut Recorder, size: u64) -> Option<Live> {
    let (r, handle) = drv.mem_create(size as usize);
    rec.record("cuMemCreate", r, size);
    if r != Some(0) {
        return None;
    }
    let (r, va) = drv.address_reserve(size as usize);
    rec.record("cuMemAddressReserve", r, 0);
    if r == Some(0) {
        let r = drv.mem_map(va, size as usize, handle);
        rec.record("cuMemMap", r, size);
        if r == Some(0) {
            let r = drv.mem_set_access(va, size as usize);
            rec.record("cuMemSetAccess", r, 0);
            if r == Some(0) {
                return Some(Live::Mapped { handle, va, size });
            }
            rec.record("cuMemUnmap", drv.mem_unmap(va, size as usize), size);
        }
        rec.record("cuMemAddressFree", drv.address_free(va, size as usize), 0);
    }
    rec.record("cuMemRelease", drv.mem_release(handle), 0);
    None
}

static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// Returns when stdin closes or SIGTERM arrives.
pub fn wait_until_released() {
    // SAFETY: installs an async-signal-safe handler (one atomic store) for SIGTERM.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigterm as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        TERMINATED.store(true, Ordering::SeqCst);
    });
    while !TERMINATED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn hold(drv: &Driver, bytes: usize) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let (r, ptr) = drv.mem_alloc(bytes);
    print(json!({"pid": std::process::id(), "bytes": bytes, "result": r, "ptr": ptr}));
    if r != Some(0) {
        return Ok(ExitCode::FAILURE);
    }
    wait_until_released();
    let r = drv.mem_free(ptr);
    print(json!({"pid": std::process::id(), "freed": r}));
    Ok(if r == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn pressure(
    drv: &Driver,
    chunk: usize,
    delay_ms: u64,
    seconds: u64,
) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    // SAFETY: installs an async-signal-safe handler (one atomic store) for SIGTERM.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigterm as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
    if seconds == 0 {
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            TERMINATED.store(true, Ordering::SeqCst);
        });
    }
    let end = (seconds > 0).then(|| Instant::now() + Duration::from_secs(seconds));
    let (mut made, mut refused, mut rounds) = (0u64, 0u64, 0u64);
    let mut live: Vec<u64> = Vec::new();
    let done = || TERMINATED.load(Ordering::SeqCst) || end.is_some_and(|e| Instant::now() >= e);
    let pause = || {
        let wake = Instant::now() + Duration::from_millis(delay_ms);
        while Instant::now() < wake && !done() {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    while !done() {
        loop {
            let (r, ptr) = drv.mem_alloc(chunk);
            if r != Some(0) {
                refused += 1;
                break;
            }
            made += 1;
            live.push(ptr);
            if done() {
                break;
            }
        }
        rounds += 1;
        // Full for a while, then half full for a while: an observer sees both.
        pause();
        // The older half: an observer that attached later soon sees every live allocation.
        let half = live.len() / 2;
        for ptr in live.drain(..half) {
            drv.mem_free(ptr);
        }
        pause();
    }
    for ptr in live {
        drv.mem_free(ptr);
    }
    print(
        json!({"pid": std::process::id(), "rounds": rounds, "allocations": made, "refused": refused}),
    );
    Ok(ExitCode::SUCCESS)
}
