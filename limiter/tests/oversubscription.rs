//! When the GPU runs out before the limits do: two containers (two regions) whose limits add up to
//! more than one simulated GPU (`SIMCUDA_SHARED_DEVICE`: every process's allocations share its
//! capacity), with HAMi's `CUDA_OVERSUBSCRIBE=true`. The tenant that holds memory keeps it; the
//! tenant that asks for more than is physically free gets `CUDA_ERROR_OUT_OF_MEMORY` at once, or,
//! with `VGPU_OOM_WAIT`, waits until memory frees or the wait's timeout passes
//! (docs/oversubscription.md).

mod support;

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use agent_common::api::ApiId;
use region::reader::{OomWait, RegionReader, SlotPhase};
use support::{cc, fresh_region, paths, preloaded};

/// The simulated GPU: 8 GiB for everyone.
const CAPACITY: &str = "8g";
/// Each container's limit: 6 GiB, 12 in all on an 8 GiB GPU.
const LIMIT: &str = "6g";
const GIB: u64 = 1 << 30;

fn caller() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let libdir = format!("-L{}", paths().libdir.display());
        cc(
            "region_caller.c",
            "region_caller",
            &[&libdir, "-lcuda", "-lpthread"],
        )
    })
}

/// One GPU shared by the processes of a test (a fresh device file).
fn gpu() -> PathBuf {
    fresh_region("gpu")
}

/// `region_caller hold BYTES` in the container of `region`, on `gpu`, with `extra` variables.
fn hold(bytes: u64, gpu: &Path, region: &Path, extra: &[(&str, &str)]) -> Child {
    let mut c = preloaded(caller());
    c.args(["hold", &bytes.to_string()])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", LIMIT)
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("SIMCUDA_SHARED_DEVICE", gpu)
        .env("SIMCUDA_CAPACITY", CAPACITY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        c.env(k, v);
    }
    c.spawn().expect("spawn region_caller")
}

/// The `held <result>` line: the allocation's result.
fn held(child: &mut Child) -> i32 {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix("held ")
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
}

/// Closes stdin (the holder frees and exits) and returns its stderr.
fn release(mut child: Child) -> String {
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

/// What the container's live process recorded for cuMemAlloc_v2: (calls, errors, denied), and
/// the time the limiter held its calls back.
fn recorded(region: &Path) -> ((u64, u64, u64), u64) {
    let snap = RegionReader::open(region)
        .expect("open region")
        .snapshot()
        .expect("snapshot");
    let slot = snap
        .slots
        .iter()
        .find(|s| s.phase == SlotPhase::Live)
        .expect("a live slot");
    let id = ApiId::from_name("cuMemAlloc_v2").unwrap();
    let a = slot
        .apis
        .iter()
        .find(|a| a.api == id)
        .expect("cuMemAlloc_v2");
    ((a.calls, a.errors, a.denied), slot.throttled_ns)
}

/// What the container's live process publishes in its slot about an allocation waiting for
/// device memory.
fn waiting(region: &Path) -> Option<OomWait> {
    let snap = RegionReader::open(region)
        .expect("open region")
        .snapshot()
        .expect("snapshot");
    snap.slots
        .iter()
        .find(|s| s.phase == SlotPhase::Live)
        .expect("a live slot")
        .oom_wait
}

#[test]
fn the_tenant_asking_past_the_gpu_fails_at_once_and_the_holder_keeps_its_memory() {
    let gpu = gpu();
    let (first, second) = (fresh_region("a"), fresh_region("b"));
    let mut a = hold(5 * GIB, &gpu, &first, &[]);
    assert_eq!(held(&mut a), 0);
    // 4 GiB is within the second container's limit, and 3 GiB are physically free.
    let mut b = hold(4 * GIB, &gpu, &second, &[("LIBCUDA_LOG_LEVEL", "3")]);
    assert_eq!(held(&mut b), 2, "CUDA_ERROR_OUT_OF_MEMORY");
    // The driver refused it, not the limit, and nothing waited.
    assert_eq!(recorded(&second), ((1, 1, 0), 0));
    // The holder's memory is untouched by the other tenant's failure.
    assert_eq!(recorded(&first), ((1, 0, 0), 0));
    let err = release(b);
    assert!(
        err.contains("INFO: cuMemAlloc_v2: the GPU has no room for 4294967296 bytes"),
        "{err}"
    );
    // What is physically free fits.
    let mut c = hold(3 * GIB, &gpu, &second, &[]);
    assert_eq!(held(&mut c), 0);
    release(c);
    release(a);
}

#[test]
fn running_out_of_the_gpu_is_a_warning_where_limits_are_meant_to_fit() {
    let gpu = gpu();
    let (first, second) = (fresh_region("a"), fresh_region("b"));
    let mut a = hold(5 * GIB, &gpu, &first, &[]);
    assert_eq!(held(&mut a), 0);
    let level = ("LIBCUDA_LOG_LEVEL", "2");
    // Oversubscribed: expected, reported as information (not shown at level 2).
    let mut b = hold(4 * GIB, &gpu, &second, &[level]);
    assert_eq!(held(&mut b), 2);
    let err = release(b);
    assert!(!err.contains("no room"), "{err}");
    // Without CUDA_OVERSUBSCRIBE=true (`1` is not HAMi's value): a warning.
    let mut b = hold(
        4 * GIB,
        &gpu,
        &second,
        &[level, ("CUDA_OVERSUBSCRIBE", "1")],
    );
    assert_eq!(held(&mut b), 2);
    let err = release(b);
    assert!(
        err.contains("WARN: cuMemAlloc_v2: the GPU has no room"),
        "{err}"
    );
    release(a);
}

#[test]
fn an_opted_in_tenant_waits_until_memory_frees() {
    let gpu = gpu();
    let (first, second) = (fresh_region("a"), fresh_region("b"));
    let mut a = hold(5 * GIB, &gpu, &first, &[]);
    assert_eq!(held(&mut a), 0);
    let mut b = hold(
        4 * GIB,
        &gpu,
        &second,
        &[("VGPU_OOM_WAIT", "60s"), ("SIMCUDA_LOG", "1")],
    );
    // The driver refused the first attempt: the tenant is waiting now.
    let mut log = BufReader::new(b.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("cuMemAlloc_v2 #1 -> 2") {
        line.clear();
        assert_ne!(log.read_line(&mut line).unwrap(), 0, "no refused attempt");
    }
    // Keep reading the retries' log lines so the pipe never fills.
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        log.read_to_string(&mut rest).unwrap();
        rest
    });
    // While it waits, its slot says for what (the agent's --freeze-on-demand reads it).
    let deadline = Instant::now() + Duration::from_secs(30);
    let wait = loop {
        match waiting(&second) {
            Some(w) => break w,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            None => panic!("the wait was not published"),
        }
    };
    assert_eq!((wait.device, wait.bytes), (0, 4 * GIB));
    assert!(wait.seq > 0);
    release(a);
    assert_eq!(held(&mut b), 0, "the wait got the memory that freed");
    assert_eq!(waiting(&second), None, "cleared when the wait succeeded");
    let ((calls, errors, denied), waited) = recorded(&second);
    assert_eq!((calls, errors, denied), (1, 0, 0));
    assert!(waited > 0);
    drop(b.stdin.take());
    assert!(b.wait().unwrap().success());
    let rest = drain.join().unwrap();
    assert!(rest.contains("cuMemAlloc_v2 #2 -> "), "{rest}");
}

#[test]
fn a_wait_ends_at_its_timeout_with_out_of_memory() {
    let gpu = gpu();
    let (first, second) = (fresh_region("a"), fresh_region("b"));
    let mut a = hold(5 * GIB, &gpu, &first, &[]);
    assert_eq!(held(&mut a), 0);
    let t0 = Instant::now();
    let mut b = hold(4 * GIB, &gpu, &second, &[("VGPU_OOM_WAIT", "300ms")]);
    assert_eq!(held(&mut b), 2);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let ((calls, errors, denied), waited) = recorded(&second);
    assert_eq!((calls, errors, denied), (1, 1, 0));
    assert!(waited >= 300_000_000, "{waited}");
    assert_eq!(waiting(&second), None, "cleared when the wait timed out");
    release(b);
    // Its reservation went back: the container can use its whole limit once the GPU has room.
    release(a);
    let mut c = hold(6 * GIB, &gpu, &second, &[]);
    assert_eq!(held(&mut c), 0);
    release(c);
}
