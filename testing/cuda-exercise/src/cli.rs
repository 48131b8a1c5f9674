//! The command line: the global options, the subcommands with their arguments, and the byte-count
//! parser they use.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Calls a CUDA driver library a known number of times")]
pub struct Cli {
    /// The driver library to dlopen (a path or a soname).
    #[arg(long, global = true, default_value = "libcuda.so.1")]
    pub lib: String,
    /// After loading the library and before any call, wait until this file exists (poll every
    /// 5 ms, up to 60 s), so a test can attach probes to the mapped library first.
    #[arg(long, global = true)]
    pub wait_file: Option<PathBuf>,
    /// Create this file once the library is loaded (before waiting for --wait-file).
    #[arg(long, global = true)]
    pub ready_file: Option<PathBuf>,
    /// Call cuInit(0) once the library is loaded, before --ready-file, and count it nowhere: a
    /// limiter preloaded into the process takes its region slot then, before the counted calls.
    #[arg(long, global = true)]
    pub init_first: bool,
    /// After the command, stay alive this long before exiting (so an observer sees the final
    /// state of a short-lived process, e.g. its limiter region slot before it is retired).
    #[arg(long, global = true, default_value_t = 0)]
    pub linger_ms: u64,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// cuInit, context, cuMemAlloc_v2 of B bytes, a pattern of 64-bit words copied in
    /// (cuMemcpyHtoD_v2); prints {"pid","bytes","result","ptr"}. Then for each line `check` on
    /// stdin prints {"checking":true}, copies it back (cuMemcpyDtoH_v2) and prints
    /// {"result","corrupted"} (words that differ); for each line `call NAME` prints
    /// {"calling":NAME}, calls entry point NAME with harmless arguments and a size of 0 and
    /// prints {"called","result"}; at stdin EOF frees and prints {"pid","freed"}.
    Pattern {
        #[arg(long, value_parser = parse_bytes)]
        bytes: u64,
    },
    /// Device memory as XLA's allocator takes it: cuMemAddressReserve of B bytes, cuMemCreate
    /// of two chunks of B/2 (POSIX-fd shareable with `--shareable`), cuMemMap of each,
    /// cuMemSetAccess of the range (read-write, device 0), a pattern copied in per chunk, then
    /// cuMemRetainAllocationHandle of an address in the second chunk and cuMemRelease of what it
    /// returned. Prints {"pid","bytes","result","ptr","handles","retained","released"}. Then per
    /// stdin line: `check` (as `pattern`, over the chunks still mapped), `call NAME` (as
    /// `pattern`), `export` (cuMemExportToShareableHandle of the first chunk: {"exported"}),
    /// `release-one` (cuMemUnmap and cuMemRelease of the second chunk by the handles it got:
    /// {"unmapped","released"}); at stdin EOF unmaps, releases and frees the range and prints
    /// {"pid","freed"}.
    VmmPattern {
        #[arg(long, value_parser = parse_bytes)]
        bytes: u64,
        #[arg(long)]
        shareable: bool,
    },
    /// The driver's checkpoint API on process `--pid`: `lock` (with `--timeout-ms`), `checkpoint`,
    /// `restore`, `unlock`, or `state`; prints {"op","result","state"} (`state`: the process's
    /// CUprocessState after the call, or null if it cannot be read).
    Checkpoint {
        #[arg(long)]
        pid: i32,
        #[arg(long, value_enum)]
        op: CheckpointOp,
        #[arg(long, default_value_t = 0)]
        timeout_ms: u32,
    },
    /// On each device of `--devices` in turn (its primary context made current): cuMemAlloc_v2
    /// of `--chunk` bytes until one fails, then 2 MiB until one fails, then 512 bytes until one
    /// fails, and cuMemGetInfo_v2. Prints per device the bytes allocated, the last refusal (size
    /// and result) and the memory info; holds everything until stdin closes or SIGTERM, frees it
    /// and prints the frees that failed.
    Fill {
        #[arg(long, value_delimiter = ',', default_value = "0")]
        devices: Vec<i32>,
        #[arg(long, default_value = "16m", value_parser = parse_bytes)]
        chunk: u64,
    },
    /// Keep hitting the memory limit: allocate `--chunk` bytes at a time until an allocation
    /// fails (the device is full or a limiter denies it), wait `--delay-ms`, free the older half
    /// of what is held, wait `--delay-ms`, repeat; until `--seconds` pass (0: until SIGTERM or
    /// stdin closes). Prints the allocations made and refused.
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
        /// Functions to load by these names (comma-separated) and launch in turn (the sim's
        /// `SIMCUDA_KERNEL_US` gives each its device time); the launches of each are printed.
        #[arg(long, default_value = "kernel")]
        kernels: String,
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
        /// Every Nth launch goes straight to the simulated driver's own cuLaunchKernel (its
        /// `simcuda_own_symbol`), past a preloaded limiter, so that the direct launches' time,
        /// measured beside the hooked ones, is the truth for the limiter's timing (0: none)
        #[arg(long, default_value_t = 0)]
        direct_every: u64,
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
    /// One rank of an NCCL communicator across processes (`--lib` names libnccl.so.2): rank 0
    /// calls ncclGetUniqueId and writes the id to `--unique-id-file` (hex), other ranks wait for
    /// that file and read it; then ncclCommInitRankConfig, `--all-reduce` ncclAllReduce of
    /// `--count` elements of `--datatype` on the communicator (NULL if creation failed), and
    /// ncclCommDestroy. Prints the unique id, the communicator and the calls.
    NcclRank {
        #[arg(long, default_value_t = 2)]
        nranks: i32,
        #[arg(long)]
        rank: i32,
        #[arg(long)]
        unique_id_file: PathBuf,
        #[arg(long, default_value_t = 10)]
        all_reduce: u64,
        #[arg(long, default_value_t = 1 << 20)]
        count: usize,
        /// ncclDataType_t (7: ncclFloat32).
        #[arg(long, default_value_t = 7)]
        datatype: i32,
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

/// What `checkpoint` asks the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckpointOp {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
    State,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    Ptr,
    Handle,
    All,
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
