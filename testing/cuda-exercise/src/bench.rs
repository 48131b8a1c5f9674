//! Benchmark commands (`launch-loop`, `pairs`): driver pointers resolved once, so a run measures
//! the calls (and whatever is interposed on them), not the lookups.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::driver::{CUresult, Driver};
use crate::record::print;
use crate::wait::wait_for_file;

pub fn pairs(
    drv: &Driver,
    count: u64,
    size: usize,
    barrier: Option<&std::path::Path>,
    outside: bool,
) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let (r, ptr) = drv.mem_alloc(size);
    if r != Some(0) {
        return Err(format!("cuMemAlloc_v2 returned {r:?}"));
    }
    let startup_s = process_age_seconds();
    drv.mem_free(ptr);
    if let Some(b) = barrier {
        wait_for_file(b, Duration::from_secs(120))?;
    }
    let (Some(a), Some(f)) = (drv.symbol("cuMemAlloc_v2"), drv.symbol("cuMemFree_v2")) else {
        return Err("cuMemAlloc_v2/cuMemFree_v2 missing".into());
    };
    // SAFETY: the driver's cuMemAlloc_v2 and cuMemFree_v2 have these cuda.h signatures.
    let (alloc, free) = unsafe {
        (
            std::mem::transmute::<*mut std::ffi::c_void, Alloc>(a),
            std::mem::transmute::<*mut std::ffi::c_void, Free>(f),
        )
    };
    if outside {
        return pairs_outside(drv, count, size, (alloc, free));
    }
    let mut ns: Vec<u64> = Vec::with_capacity(count as usize);
    let mut errors = 0u64;
    let t_all = Instant::now();
    for _ in 0..count {
        let mut p = 0u64;
        let t = Instant::now();
        // SAFETY: a valid out-pointer; the pointer freed is the one just allocated.
        let (r, f) = unsafe { (alloc(&mut p, size), free(p)) };
        ns.push(t.elapsed().as_nanos() as u64);
        errors += u64::from(r != 0 || f != 0);
    }
    let total = t_all.elapsed().as_nanos() as u64;
    ns.sort_unstable();
    print(json!({
        "pid": std::process::id(),
        "pairs": count,
        "size": size,
        "errors": errors,
        "pair_median_ns": ns.get(ns.len() / 2).copied().unwrap_or(0),
        "pair_mean_ns": total.checked_div(count).unwrap_or(0),
        "startup_s": startup_s,
        "limiter": limiter_self_time(),
    }));
    Ok(ExitCode::SUCCESS)
}

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type Free = unsafe extern "C" fn(u64) -> CUresult;

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// `pairs --outside`: each call timed alone, minus the time the simulated driver says it spent
/// inside itself (`simcuda_last_call_ns`, set by calls that sweep: `SIMCUDA_SWEEP`). What is left
/// is the time spent outside the driver: under a preloaded limiter, its whole self-time per call
/// (entry, accounting, recording), plus a few nanoseconds of timing that a native run measures
/// alone.
fn pairs_outside(
    drv: &Driver,
    count: u64,
    size: usize,
    (alloc, free): (Alloc, Free),
) -> Result<ExitCode, String> {
    let last = drv
        .symbol("simcuda_last_call_ns")
        .ok_or("--outside needs the simulated driver (simcuda_last_call_ns)")?;
    // SAFETY: sim-cuda's `simcuda_last_call_ns` takes nothing and returns a u64.
    let last =
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, extern "C" fn() -> u64>(last) };
    let n = count as usize;
    let (mut a_out, mut f_out, mut pair_out, mut inside) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut errors = 0u64;
    for _ in 0..count {
        let mut p = 0u64;
        let t0 = Instant::now();
        // SAFETY: a valid out-pointer.
        let r = unsafe { alloc(&mut p, size) };
        let t1 = Instant::now();
        let a_in = last();
        let t2 = Instant::now();
        // SAFETY: the pointer just allocated.
        let f = unsafe { free(p) };
        let t3 = Instant::now();
        let f_in = last();
        errors += u64::from(r != 0 || f != 0 || a_in == 0 || f_in == 0);
        let a = ((t1 - t0).as_nanos() as u64).saturating_sub(a_in);
        let fr = ((t3 - t2).as_nanos() as u64).saturating_sub(f_in);
        a_out.push(a);
        f_out.push(fr);
        pair_out.push(a + fr);
        inside.push(a_in + f_in);
    }
    print(json!({
        "pid": std::process::id(),
        "pairs": count,
        "size": size,
        "errors": errors,
        "alloc_outside_median_ns": median(&mut a_out),
        "free_outside_median_ns": median(&mut f_out),
        "pair_outside_median_ns": median(&mut pair_out),
        "pair_inside_median_ns": median(&mut inside),
        "limiter": limiter_self_time(),
    }));
    Ok(ExitCode::SUCCESS)
}

/// Under the limiter with a region (`CUDA_DEVICE_MEMORY_SHARED_CACHE`): the limiter's own time
/// inside its hooks for this process, per API and in total, as the region records it. It is what
/// the limiter adds to the calls, measured below the run-to-run noise of end-to-end timings.
fn limiter_self_time() -> serde_json::Value {
    let Some(path) = std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE") else {
        return serde_json::Value::Null;
    };
    let snapshot = match region::reader::RegionReader::open(std::path::Path::new(&path))
        .and_then(|r| r.snapshot())
    {
        Ok(s) => s,
        Err(e) => return json!({ "error": e.to_string() }),
    };
    let me = std::process::id();
    let Some(slot) = snapshot.slots.iter().find(|s| s.pid == me) else {
        return json!({ "error": "no slot of this process" });
    };
    let apis: serde_json::Map<String, serde_json::Value> = slot
        .apis
        .iter()
        .filter(|a| a.calls > 0)
        .map(|a| {
            (
                a.api.name().to_string(),
                json!({ "calls": a.calls, "hook_ns": a.hook_ns, "latency_hist": a.histogram.to_vec() }),
            )
        })
        .collect();
    json!({
        "hook_ns_total": slot.apis.iter().map(|a| a.hook_ns).sum::<u64>(),
        "apis": apis,
    })
}

/// `launch-loop`: `count` launches through the driver's `cuLaunchKernel` as `dlsym` gives it
/// (under a preloaded limiter, its hook), each timed. With `direct_every` N > 0, every Nth launch
/// goes instead straight to the simulated driver's implementation, past the limiter and past any
/// probe on the entry point: the direct launches' mean (not trimmed: the limiter's total carries
/// every preempted call too) is the truth for the hooked launches' driver time.
pub fn launch_loop(
    drv: &Driver,
    count: u64,
    sync_every: u64,
    direct_every: u64,
) -> Result<ExitCode, String> {
    if drv.init() != Some(0) {
        return Err("cuInit failed".into());
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let (r, func) = drv.function_from_image(b"simcuda\0", "kernel");
    if r != Some(0) {
        return Err(format!("loading a function returned {r:?}"));
    }
    type Launch = unsafe extern "C" fn(
        *mut std::ffi::c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        *mut std::ffi::c_void,
        *mut *mut std::ffi::c_void,
        *mut *mut std::ffi::c_void,
    ) -> CUresult;
    let p = drv
        .symbol("cuLaunchKernel")
        .ok_or("cuLaunchKernel missing")?;
    // SAFETY: the driver's cuLaunchKernel has this cuda.h signature.
    let launch = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Launch>(p) };
    // The simulated driver's own timing of each launch (launches it delays), if it is one.
    let inside_of = drv.symbol("simcuda_last_call_ns").map(|f| {
        // SAFETY: sim-cuda's `simcuda_last_call_ns` takes nothing and returns a u64.
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, extern "C" fn() -> u64>(f) }
    });
    // The simulated driver's implementation of cuLaunchKernel, past any hook or probe.
    let direct = if direct_every > 0 {
        let own = drv
            .symbol("simcuda_own_symbol")
            .ok_or("--direct-every needs the simulated driver (simcuda_own_symbol)")?;
        // SAFETY: sim-cuda's `simcuda_own_symbol` takes a C string and returns an address.
        let own = unsafe {
            std::mem::transmute::<
                *mut std::ffi::c_void,
                unsafe extern "C" fn(*const i8) -> *mut std::ffi::c_void,
            >(own)
        };
        // SAFETY: a NUL-terminated literal.
        let p = unsafe { own(c"cuLaunchKernel".as_ptr()) };
        if p.is_null() {
            return Err("the simulated driver has no own cuLaunchKernel".into());
        }
        // SAFETY: the simulated driver's cuLaunchKernel has this cuda.h signature.
        Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, Launch>(p) })
    } else {
        None
    };
    let null = std::ptr::null_mut();
    let mut ns: Vec<u64> = Vec::with_capacity(count as usize);
    let mut direct_ns: Vec<u64> = Vec::new();
    let mut errors = 0u64;
    let mut inside = 0u64;
    // Launches that met a uprobe's breakpoint (0xcc) on the entry point's first byte, before and
    // after the call: what the probes trapped, whether or not their programs counted the call.
    let entry = p.cast::<u8>().cast_const();
    // SAFETY: the entry point's first byte is mapped code; a volatile read of it, as the kernel
    // writes a breakpoint there and takes it out.
    let trap = || unsafe { entry.read_volatile() } == 0xcc;
    let mut trapped = 0u64;
    let t_all = Instant::now();
    for i in 0..count {
        let through = direct.filter(|_| (i + 1).is_multiple_of(direct_every));
        let before = trap();
        let t = Instant::now();
        // SAFETY: a function from the driver, non-zero dimensions, no parameters.
        let r = unsafe {
            through.unwrap_or(launch)(func, 1, 1, 1, 1, 1, 1, 0, null, null.cast(), null.cast())
        };
        let took = t.elapsed().as_nanos() as u64;
        trapped += u64::from(through.is_none() && before && trap());
        ns.push(took);
        if through.is_some() {
            direct_ns.push(took);
        }
        errors += u64::from(r != 0);
        if let Some(f) = inside_of {
            inside += f();
        }
        if sync_every > 0 && (ns.len() as u64).is_multiple_of(sync_every) {
            errors += u64::from(drv.ctx_synchronize() != Some(0));
        }
    }
    let total = t_all.elapsed().as_nanos() as u64;
    drv.ctx_synchronize();
    ns.sort_unstable();
    let direct_figures = direct.map(|_| {
        json!({
            "hooked": count - direct_ns.len() as u64,
            "direct": direct_ns.len(),
            "mean_ns": (!direct_ns.is_empty())
                .then(|| direct_ns.iter().sum::<u64>() as f64 / direct_ns.len() as f64),
        })
    });
    print(json!({
        "pid": std::process::id(),
        "launches": count,
        "errors": errors,
        "launch_ns": ns.get(ns.len() / 2).copied().unwrap_or(0),
        "launch_mean_ns": total.checked_div(count).unwrap_or(0),
        "inside_total_ns": inside_of.map(|_| inside),
        "trapped": trapped,
        "direct": direct_figures,
    }));
    Ok(ExitCode::SUCCESS)
}

pub fn paced(
    drv: &Driver,
    seconds: f64,
    sync_every: u64,
    held_ms: u64,
    kernels: &str,
) -> Result<ExitCode, String> {
    if drv.init() != Some(0) {
        return Err("cuInit failed".into());
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let names: Vec<&str> = kernels.split(',').filter(|n| !n.is_empty()).collect();
    let mut funcs = Vec::new();
    for name in &names {
        let (r, func) = drv.function_from_image(b"simcuda\0", name);
        if r != Some(0) {
            return Err(format!("loading function {name} returned {r:?}"));
        }
        funcs.push(func);
    }
    if funcs.is_empty() {
        return Err("--kernels names no function".into());
    }
    let mut per_kernel = vec![0u64; funcs.len()];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut launches, mut errors, mut first_held) = (0u64, 0u64, None);
    while Instant::now() < end {
        let t = Instant::now();
        let which = (launches % funcs.len() as u64) as usize;
        per_kernel[which] += 1;
        let r = drv.launch_kernel(funcs[which]);
        if first_held.is_none() && t.elapsed() > Duration::from_millis(held_ms) {
            first_held = Some(monotonic_ns());
        }
        errors += u64::from(r != Some(0));
        launches += 1;
        if launches.is_multiple_of(sync_every) {
            drv.ctx_synchronize();
        }
    }
    drv.ctx_synchronize();
    print(json!({
        "pid": std::process::id(),
        "launches": launches,
        "errors": errors,
        "first_held_mono_ns": first_held,
        "kernels": names.iter().zip(&per_kernel).fold(
            std::collections::BTreeMap::<String, u64>::new(),
            |mut m, (n, c)| {
                *m.entry(n.to_string()).or_default() += c;
                m
            }
        ),
    }));
    Ok(ExitCode::SUCCESS)
}

/// CLOCK_MONOTONIC in nanoseconds (comparable across processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Seconds since this process started (`/proc/self/stat` field 22 against the uptime).
fn process_age_seconds() -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let start = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(19))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    (uptime - start / ticks).max(0.0)
}
