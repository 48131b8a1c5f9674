//! cuda-exercise: a workload that calls a CUDA driver library (the real libcuda or the simulated
//! one in `testing/sim-cuda`) a known number of times and prints what it did as JSON, so tests
//! can compare what vgpu-agent and the limiter report with the truth. See `testing/README.md`.

mod bench;
mod driver;
mod nccl;

use agent_common::api::{APIS, ApiId, ApiKind};
use clap::{Parser, Subcommand};
use driver::{CUresult, Driver};
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(version, about = "Calls a CUDA driver library a known number of times")]
struct Cli {
    /// The driver library to dlopen (a path or a soname).
    #[arg(long, global = true, default_value = "libcuda.so.1")]
    lib: String,
    /// After loading the library and before any call, wait until this file exists (poll every
    /// 5 ms, up to 60 s), so a test can attach probes to the mapped library first.
    #[arg(long, global = true)]
    wait_file: Option<PathBuf>,
    /// Create this file once the library is loaded (before waiting for --wait-file).
    #[arg(long, global = true)]
    ready_file: Option<PathBuf>,
    /// After the command, stay alive this long before exiting (so an observer sees the final
    /// state of a short-lived process, e.g. its limiter region slot before it is retired).
    #[arg(long, global = true, default_value_t = 0)]
    linger_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Call each traced API (alloc, free, sync, copy, launch, lifecycle kinds) N times with
    /// harmless arguments and print the calls, errors and bytes per API.
    Counts {
        /// Calls per API.
        #[arg(long, default_value_t = 1)]
        per_api: u64,
        /// Comma-separated API names instead of all traced APIs of those kinds.
        #[arg(long, value_delimiter = ',')]
        apis: Option<Vec<String>>,
        /// Call cuInit(0) first (counted).
        #[arg(long)]
        init: bool,
        /// Size argument for APIs that take one (cuMemCreate, cuMemMap and cuMemUnmap round it
        /// up to 2 MiB).
        #[arg(long, default_value = "4096", value_parser = parse_bytes)]
        size: u64,
        /// Create a stream (cuStreamCreate) and pass it to the APIs that take one instead of
        /// the NULL stream; its handle is printed as `stream`.
        #[arg(long)]
        stream: bool,
    },
    /// A deterministic random sequence of allocations and frees; prints the live bytes at the end
    /// and what cuMemGetInfo_v2 reports. Needs a driver where cuInit succeeds (the sim).
    AllocFree {
        #[arg(long)]
        ops: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Largest size of one allocation.
        #[arg(long, default_value = "64m", value_parser = parse_bytes)]
        max_size: u64,
        /// Allocation APIs to use: ptr (cuMemAlloc*), handle (cuMemCreate + map) or all.
        #[arg(long, value_enum, default_value_t = Mix::All)]
        api_mix: Mix,
    },
    /// cuInit, allocate B bytes, print {"pid":..}, wait until stdin closes or SIGTERM, free, exit.
    Hold {
        #[arg(long, value_parser = parse_bytes)]
        bytes: u64,
    },
    /// Keep hitting the memory limit: allocate `--chunk` bytes at a time until an allocation
    /// fails (the device is full or a limiter denies it), free half of what is held, wait
    /// `--delay-ms`, repeat; until `--seconds` pass (0: until SIGTERM or stdin closes). Prints
    /// the allocations made and refused.
    Pressure {
        #[arg(long, default_value = "64m", value_parser = parse_bytes)]
        chunk: u64,
        #[arg(long, default_value_t = 200)]
        delay_ms: u64,
        #[arg(long, default_value_t = 0)]
        seconds: u64,
    },
    /// Call one API N times and print timing.
    Latency {
        #[arg(long)]
        api: String,
        #[arg(long, default_value_t = 1000)]
        calls: u64,
        /// Call cuInit(0) first (not counted).
        #[arg(long)]
        init: bool,
        #[arg(long, default_value = "4096", value_parser = parse_bytes)]
        size: u64,
    },
    /// Calls one API at a steady rate for a while (a paced load for the agent's cost benchmark).
    Steady {
        #[arg(long)]
        api: String,
        /// Calls per second.
        #[arg(long, default_value_t = 50_000)]
        rate: u64,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        #[arg(long, default_value = "4096", value_parser = parse_bytes)]
        size: u64,
    },
    /// cuInit, load a module, launch a kernel N times (cuLaunchKernel), then cuCtxSynchronize;
    /// prints the time spent launching and synchronising (with the sim's SIMCUDA_LAUNCH_US the
    /// synchronisation waits for the simulated work).
    Launches {
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
    /// Launches for `--seconds`, synchronising every `--sync-every` launches (a training loop's
    /// step); prints the launches made and the CLOCK_MONOTONIC time (ns) of the first launch call
    /// that took longer than `--held-ms` (an SM limiter holding it back), or null.
    Paced {
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value_t = 16)]
        sync_every: u64,
        #[arg(long, default_value_t = 20)]
        held_ms: u64,
    },
    /// cuInit, context, module + function, then N cuLaunchKernel through a pointer resolved once
    /// (no lookup per call), each timed; prints the median and mean launch time (`launch_ns`;
    /// the mean includes the synchronisations of `--sync-every`).
    LaunchLoop {
        #[arg(long, default_value_t = 200_000)]
        count: u64,
        /// Also a cuCtxSynchronize after every N launches (0: only at the end), as training steps
        /// do.
        #[arg(long, default_value_t = 0)]
        sync_every: u64,
    },
    /// cuInit, primary context, then (after `--barrier` appears, if given) N cuMemAlloc_v2 +
    /// cuMemFree_v2 pairs of `--size` bytes, each timed; prints the median and mean pair time and
    /// the seconds from process start to the first allocation (start-up).
    Pairs {
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[arg(long, default_value = "1m", value_parser = parse_bytes)]
        size: u64,
        /// A file to wait for between start-up and the timed pairs (a barrier across processes).
        #[arg(long)]
        barrier: Option<PathBuf>,
        /// Time each call alone and subtract what the simulated driver spent inside itself
        /// (needs sim-cuda with `SIMCUDA_SWEEP` on both calls): medians of the time outside the
        /// driver per call and per pair.
        #[arg(long)]
        outside: bool,
    },
    /// Call each traced NCCL API (agent_common's `nccl` kind) N times with harmless arguments
    /// (NULL buffers, communicators and streams; one rank; counts and datatypes varied per call)
    /// and print calls, errors and bytes (count x datatype size) per API. `--lib` names the NCCL
    /// library (libnccl.so.2). Communicators that get created (with a GPU) are destroyed at the
    /// end with ncclCommDestroy (counted).
    Nccl {
        /// Calls per API.
        #[arg(long, default_value_t = 1)]
        per_api: u64,
        /// One more ncclAllReduce with datatype 99, which NCCL does not define (0 bytes).
        #[arg(long)]
        bad_datatype: bool,
        /// Ranks of the communicators asked for (this process is the last rank;
        /// ncclCommInitAll makes all of them), at most 16.
        #[arg(long, default_value_t = 1)]
        nranks: usize,
        /// Pass the first communicator created (if any) to the collectives instead of NULL.
        #[arg(long)]
        use_comm: bool,
    },
    /// Resolve a symbol with cuGetProcAddress(_v2) and print the address next to dlsym's.
    ProcAddress {
        #[arg(long)]
        symbol: String,
        #[arg(long, default_value_t = 12020)]
        cuda_version: i32,
        #[arg(long, default_value_t = 0)]
        flags: u64,
        /// Use cuGetProcAddress (4 arguments) instead of cuGetProcAddress_v2.
        #[arg(long)]
        v1: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mix {
    Ptr,
    Handle,
    All,
}

/// Calls of one entry point.
#[derive(Default, Serialize)]
struct Stat {
    calls: u64,
    /// Calls whose result was not CUDA_SUCCESS.
    errors: u64,
    /// Sum of the size argument (APIs whose spec in agent_common::api has a size_arg).
    bytes: u64,
    /// Calls per result code.
    codes: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Recorder {
    calls: BTreeMap<String, Stat>,
    missing: BTreeSet<String>,
}

impl Recorder {
    /// Records one call of `name` that passed `size` as its size argument (`None`: not exported).
    fn record(&mut self, name: &str, r: Option<CUresult>, size: u64) {
        let sized = ApiId::from_name(name)
            .and_then(|id| id.spec())
            .is_some_and(|sp| sp.size_arg.is_some());
        self.record_bytes(name, r, if sized { size } else { 0 });
    }

    /// Records one call of `name` that moved `bytes` (`None`: not exported).
    fn record_bytes(&mut self, name: &str, r: Option<CUresult>, bytes: u64) {
        let Some(rc) = r else {
            self.missing.insert(name.to_string());
            return;
        };
        let s = self.calls.entry(name.to_string()).or_default();
        s.calls += 1;
        s.errors += u64::from(rc != 0);
        s.bytes += bytes;
        *s.codes.entry(rc.to_string()).or_default() += 1;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let linger = Duration::from_millis(cli.linger_ms);
    let result = run(cli);
    std::thread::sleep(linger);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cuda-exercise: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let mut drv = Driver::open(&cli.lib)?;
    if let Some(p) = &cli.ready_file {
        std::fs::write(p, std::process::id().to_string())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &cli.wait_file {
        wait_for_file(p, Duration::from_secs(60))?;
    }
    match cli.command {
        Command::Counts {
            per_api,
            apis,
            init,
            size,
            stream,
        } => counts(&mut drv, per_api, apis, init, size as usize, stream),
        Command::AllocFree {
            ops,
            seed,
            max_size,
            api_mix,
        } => alloc_free(&drv, ops, seed, max_size, api_mix),
        Command::Hold { bytes } => hold(&drv, bytes as usize),
        Command::Pressure {
            chunk,
            delay_ms,
            seconds,
        } => pressure(&drv, chunk as usize, delay_ms, seconds),
        Command::Latency {
            api,
            calls,
            init,
            size,
        } => latency(&drv, &api, calls, init, size as usize),
        Command::Launches { count } => launches(&drv, count),
        Command::LaunchLoop { count, sync_every } => bench::launch_loop(&drv, count, sync_every),
        Command::Paced {
            seconds,
            sync_every,
            held_ms,
        } => bench::paced(&drv, seconds, sync_every.max(1), held_ms),
        Command::Pairs {
            count,
            size,
            barrier,
            outside,
        } => bench::pairs(&drv, count, size as usize, barrier.as_deref(), outside),
        Command::Steady {
            api,
            rate,
            seconds,
            size,
        } => steady(&drv, &api, rate, seconds, size as usize),
        Command::Nccl {
            per_api,
            bad_datatype,
            nranks,
            use_comm,
        } => nccl_counts(&drv, per_api, bad_datatype, nranks, use_comm),
        Command::ProcAddress {
            symbol,
            cuda_version,
            flags,
            v1,
        } => proc_address(&drv, &symbol, cuda_version, flags, v1),
    }
}

/// A byte count with an optional k, m, g suffix (powers of 1024).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (digits, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        Some('g') => (&t[..t.len() - 1], 30),
        _ => (t.as_str(), 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn wait_for_file(p: &Path, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while !p.exists() {
        if start.elapsed() > limit {
            return Err(format!("{} did not appear within {limit:?}", p.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn print(v: serde_json::Value) {
    println!("{v}");
}

fn counts(
    drv: &mut Driver,
    per_api: u64,
    apis: Option<Vec<String>>,
    init: bool,
    size: usize,
    stream: bool,
) -> Result<ExitCode, String> {
    const KINDS: [ApiKind; 6] = [
        ApiKind::Alloc,
        ApiKind::Free,
        ApiKind::Sync,
        ApiKind::Copy,
        ApiKind::Launch,
        ApiKind::Lifecycle,
    ];
    let names: Vec<String> = match apis {
        Some(list) => list
            .into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => APIS
            .iter()
            .filter(|a| KINDS.contains(&a.kind))
            .map(|a| a.name.to_string())
            .collect(),
    };
    let mut rec = Recorder::default();
    if init {
        rec.record("cuInit", drv.init(), 0);
    }
    // Not a counted call: the stream is set up before the counted ones.
    let stream = if stream {
        Some(drv.create_stream()?)
    } else {
        None
    };
    for name in &names {
        let bytes = Driver::default_size(name, size) as u64;
        if !drv.has(name) {
            rec.missing.insert(name.clone());
            continue;
        }
        for _ in 0..per_api {
            let r = drv.call_default(name, size)?;
            rec.record(name, r, bytes);
        }
    }
    print(json!({
        "pid": std::process::id(),
        "calls": rec.calls,
        "missing": rec.missing,
        "stream": stream,
    }));
    Ok(ExitCode::SUCCESS)
}

fn nccl_counts(
    lib: &Driver,
    per_api: u64,
    bad_datatype: bool,
    nranks: usize,
    use_comm: bool,
) -> Result<ExitCode, String> {
    let (version_result, version) = nccl::version(lib);
    let (unique_id_result, id) = nccl::unique_id(lib);
    let mut rec = Recorder::default();
    let mut created = Vec::new();
    for (j, name) in nccl::traced().enumerate() {
        if !lib.has(name) {
            rec.missing.insert(name.to_string());
            continue;
        }
        for i in 0..per_api {
            let args = nccl::Args::nth(j, i);
            let comm = match created.first() {
                Some(&c) if use_comm => c,
                _ => std::ptr::null_mut(),
            };
            let o = nccl::call_default(lib, name, id, args, nranks, comm)?;
            rec.record_bytes(name, o.result, if o.data { args.bytes() } else { 0 });
            created.extend(o.created);
        }
    }
    if bad_datatype {
        let args = nccl::Args {
            count: 4096,
            datatype: 99,
        };
        let o = nccl::call_default(lib, "ncclAllReduce", id, args, nranks, std::ptr::null_mut())?;
        rec.record_bytes("ncclAllReduce", o.result, args.bytes());
    }
    let communicators: Vec<String> = created.iter().map(|&c| format!("{c:p}")).collect();
    let used = match created.first() {
        Some(&c) if use_comm => Some(format!("{c:p}")),
        _ => None,
    };
    for c in created {
        rec.record_bytes("ncclCommDestroy", nccl::destroy(lib, c), 0);
    }
    print(json!({
        "pid": std::process::id(),
        "version": version,
        "version_result": version_result,
        "unique_id_result": unique_id_result,
        "communicators_created": communicators.len(),
        "communicators": communicators,
        "collectives_comm": used,
        "calls": rec.calls,
        "missing": rec.missing,
    }));
    Ok(ExitCode::SUCCESS)
}

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

fn alloc_free(
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

fn hold(drv: &Driver, bytes: usize) -> Result<ExitCode, String> {
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
    let r = drv.mem_free(ptr);
    print(json!({"pid": std::process::id(), "freed": r}));
    Ok(if r == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Paces calls in 1 ms batches so that the rate holds even when calls are much faster.
fn steady(
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

fn pressure(drv: &Driver, chunk: usize, delay_ms: u64, seconds: u64) -> Result<ExitCode, String> {
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
        for ptr in live.split_off(live.len() / 2) {
            drv.mem_free(ptr);
        }
        let wake = Instant::now() + Duration::from_millis(delay_ms);
        while Instant::now() < wake && !done() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for ptr in live {
        drv.mem_free(ptr);
    }
    print(
        json!({"pid": std::process::id(), "rounds": rounds, "allocations": made, "refused": refused}),
    );
    Ok(ExitCode::SUCCESS)
}

fn latency(
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

fn launches(drv: &Driver, count: u64) -> Result<ExitCode, String> {
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

fn proc_address(
    drv: &Driver,
    symbol: &str,
    version: i32,
    flags: u64,
    v1: bool,
) -> Result<ExitCode, String> {
    let (r, addr, status) = drv.get_proc_address(symbol, version, flags, !v1)?;
    let mut exports = BTreeMap::new();
    for suffix in [
        "", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds",
    ] {
        let n = format!("{symbol}{suffix}");
        if let Some(p) = drv.symbol(&n) {
            exports.insert(n, p as usize);
        }
    }
    let resolved = exports
        .iter()
        .find(|(_, a)| **a == addr && addr != 0)
        .map(|(n, _)| n.clone());
    print(json!({
        "pid": std::process::id(),
        "symbol": symbol,
        "result": r,
        "address": addr,
        "status": if v1 { None } else { Some(status) },
        "resolved": resolved,
        "exports": exports,
    }));
    Ok(ExitCode::SUCCESS)
}
