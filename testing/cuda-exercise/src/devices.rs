//! `fill`: allocate on each of several devices until the memory limit refuses, in three sizes
//! (the chunk, then 2 MiB, then 512 bytes), so that what a device holds ends exactly where its
//! limit does; then hold everything until stdin closes or SIGTERM, and free it.

use serde_json::json;
use std::ffi::c_int;
use std::process::ExitCode;

use crate::driver::{CUresult, Driver};
use crate::memory::wait_until_released;
use crate::record::print;

/// The driver's allocation granularity from 2 MiB on, and the smallest step after it: the sizes
/// the limiter charges exactly (it rounds sizes up to 2 MiB above 2 MiB, to 512 bytes below).
const STEPS_AFTER_CHUNK: [u64; 2] = [2 << 20, 512];
/// Bound on the allocations of one size on one device (512-byte steps below a 2 MiB remainder
/// take at most 4096).
const MAX_PER_STEP: u64 = 1 << 16;

pub fn fill(drv: &Driver, devices: &[c_int], chunk: u64) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    let mut held: Vec<u64> = Vec::new();
    let mut report = Vec::new();
    for &d in devices {
        drv.primary_context_on(d, &mut ignore)
            .map_err(|e| format!("setting up a context on device {d}: {e}"))?;
        let (mut bytes, mut allocations) = (0u64, 0u64);
        let mut refused = None;
        for size in std::iter::once(chunk).chain(STEPS_AFTER_CHUNK) {
            for _ in 0..MAX_PER_STEP {
                let (r, ptr) = drv.mem_alloc(size as usize);
                if r != Some(0) {
                    refused = Some(json!({"bytes": size, "result": r}));
                    break;
                }
                held.push(ptr);
                bytes += size;
                allocations += 1;
            }
        }
        let (r, free, total) = drv.mem_get_info();
        report.push(json!({
            "device": d,
            "allocated": bytes,
            "allocations": allocations,
            "last_refused": refused,
            "mem_info": {"result": r, "free": free, "total": total},
        }));
    }
    print(json!({"pid": std::process::id(), "chunk": chunk, "devices": report}));
    wait_until_released();
    let failed = held
        .into_iter()
        .filter(|p| drv.mem_free(*p) != Some(0))
        .count();
    print(json!({"pid": std::process::id(), "free_errors": failed}));
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
