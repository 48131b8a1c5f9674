//! The timing commands (`steady`, `latency`, `launches`): one API called at a steady rate or N
//! times with each call timed, and kernel launches timed against the synchronisation after them.

use serde_json::json;
use std::process::ExitCode;
use std::time::Instant;

use crate::driver::Driver;
use crate::record::{Recorder, print};

/// Paces calls in 1 ms batches so that the rate holds even when calls are much faster.
pub fn steady(
    drv: &Driver,
    api: &str,
    rate: u64,
    seconds: f64,
    size: usize,
) -> Result<ExitCode, String> {
    if !drv.has(api) {
        return Err(format!("{api} is not exported by the library"));
    }
    drv.init();
    let start = Instant::now();
    let total = (rate as f64 * seconds) as u64;
    let mut made = 0u64;
    let mut errors = 0u64;
    while made < total {
        // Calls due by now, at most one millisecond ahead.
        let due = ((start.elapsed().as_secs_f64() + 0.001) * rate as f64) as u64;
        while made < due.min(total) {
            errors += u64::from(drv.call_default(api, size)? != Some(0));
            made += 1;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    let elapsed = start.elapsed().as_secs_f64();
    print(json!({
        "pid": std::process::id(),
        "api": api,
        "calls": made,
        "errors": errors,
        "seconds": elapsed,
        "rate": made as f64 / elapsed,
    }));
    Ok(ExitCode::SUCCESS)
}

pub fn latency(
    drv: &Driver,
    api: &str,
    calls: u64,
    init: bool,
    size: usize,
) -> Result<ExitCode, String> {
    if !drv.has(api) {
        return Err(format!("{api} is not exported by the library"));
    }
    if init {
        drv.init();
    }
    // The simulated driver's own timing of each call (calls it delays or sweeps), if it is one.
    let inside_of = drv.symbol("simcuda_last_call_ns").map(|f| {
        // SAFETY: sim-cuda's `simcuda_last_call_ns` takes nothing and returns a u64.
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, extern "C" fn() -> u64>(f) }
    });
    let mut ns: Vec<u64> = Vec::with_capacity(calls as usize);
    let mut errors = 0u64;
    let mut inside = 0u64;
    for _ in 0..calls {
        let t = Instant::now();
        let r = drv.call_default(api, size)?;
        ns.push(t.elapsed().as_nanos() as u64);
        errors += u64::from(r != Some(0));
        if let Some(f) = inside_of {
            inside += f();
        }
    }
    ns.sort_unstable();
    let total: u64 = ns.iter().sum();
    let pct = |p: f64| {
        ns.get(((ns.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    print(json!({
        "pid": std::process::id(),
        "api": api,
        "calls": calls,
        "errors": errors,
        "total_ns": total,
        "mean_ns": total.checked_div(calls).unwrap_or(0),
        "min_ns": ns.first().copied().unwrap_or(0),
        "p50_ns": pct(0.5),
        "p99_ns": pct(0.99),
        "max_ns": ns.last().copied().unwrap_or(0),
        "inside_total_ns": inside_of.map(|_| inside),
    }));
    Ok(ExitCode::SUCCESS)
}

pub fn launches(drv: &Driver, count: u64) -> Result<ExitCode, String> {
    let mut rec = Recorder::default();
    let r = drv.init();
    rec.record("cuInit", r, 0);
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    drv.primary_context(&mut |n, r, s| rec.record(n, r, s))
        .map_err(|e| format!("setting up a context: {e}"))?;
    // A stand-in image: the sim does not read it; a real driver would reject it.
    let (r, func) = drv.function_from_image(b"simcuda\0", "kernel");
    rec.record("cuModuleGetFunction", r, 0);
    if r != Some(0) {
        return Err(format!("loading a function returned {r:?}"));
    }
    let t = Instant::now();
    let mut errors = 0;
    for _ in 0..count {
        let r = drv.launch_kernel(func);
        errors += u64::from(r != Some(0));
        rec.record("cuLaunchKernel", r, 0);
    }
    let launch_ns = t.elapsed().as_nanos() as u64;
    let t = Instant::now();
    let r = drv.ctx_synchronize();
    let sync_ns = t.elapsed().as_nanos() as u64;
    errors += u64::from(r != Some(0));
    rec.record("cuCtxSynchronize", r, 0);
    print(json!({
        "pid": std::process::id(),
        "launches": count,
        "errors": errors,
        "launch_ns": launch_ns,
        "sync_ns": sync_ns,
        "calls": rec.calls,
    }));
    Ok(ExitCode::SUCCESS)
}
