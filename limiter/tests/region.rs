//! The limiter in the container's region: processes share one limit, a forked child gets its own
//! slot, exit returns a process's bytes, SIGKILLed processes are reclaimed, statistics reach the
//! slot's thread shards, pools are charged what they hold, and a panic in the hook logic falls
//! through to the driver and is counted. The region is read with `region::reader`, as the agent
//! reads it; the GPU validation script's own parser is checked against that reader.

mod support;

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use agent_common::api::ApiId;
use region::reader::{RegionReader, RegionSnapshot, SlotPhase, SlotSnapshot};
use support::{cc, expect_ok, fresh_region, paths, preloaded};

const MIB: u64 = 1 << 20;

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

fn snapshot(region: &Path) -> RegionSnapshot {
    RegionReader::open(region)
        .expect("open region")
        .snapshot()
        .expect("snapshot")
}

fn live(s: &RegionSnapshot) -> Vec<&SlotSnapshot> {
    s.slots
        .iter()
        .filter(|sl| sl.phase == SlotPhase::Live)
        .collect()
}

fn api_stats<'a>(slot: &'a SlotSnapshot, name: &str) -> &'a region::reader::ApiStats {
    let id = ApiId::from_name(name).unwrap();
    slot.apis
        .iter()
        .find(|a| a.api == id)
        .unwrap_or_else(|| panic!("no {name} in {:?}", slot.apis))
}

fn wait_for(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn spawn(args: &[&str], region: &Path, limit: &str, extra: &[(&str, &str)]) -> Child {
    let mut c = preloaded(caller());
    c.args(args)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in extra {
        c.env(k, v);
    }
    c.spawn().expect("spawn region_caller")
}

fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

#[test]
fn forked_child_gets_its_own_slot_and_returns_its_bytes_at_exit() {
    let region = fresh_region("fork");
    let dir = region.with_extension("d");
    std::fs::create_dir_all(&dir).unwrap();
    let child = spawn(&["fork", dir.to_str().unwrap()], &region, "1g", &[]);
    wait_for(&dir.join("child-ready"));
    let s = snapshot(&region);
    let slots = live(&s);
    assert_eq!(slots.len(), 2, "{:?}", s.slots);
    let mut held: Vec<u64> = slots.iter().map(|sl| sl.held[0]).collect();
    held.sort_unstable();
    assert_eq!(held, [32 * MIB, 64 * MIB]);
    assert_eq!(s.devices[0].reserved, 96 * MIB);
    std::fs::write(dir.join("child-go"), "").unwrap();
    wait_for(&dir.join("parent-ready"));
    let s = snapshot(&region);
    assert_eq!(live(&s).len(), 1, "{:?}", s.slots);
    assert_eq!(
        s.devices[0].reserved,
        64 * MIB,
        "the child's exit returned its bytes"
    );
    std::fs::write(dir.join("parent-go"), "").unwrap();
    let (out, _) = expect_ok(child.wait_with_output().unwrap());
    assert!(out.contains("ok: fork: after the child's exit"), "{out}");
    let s = snapshot(&region);
    assert!(live(&s).is_empty());
    assert_eq!(
        s.devices[0].reserved, 0,
        "the parent's exit returned its bytes"
    );
}

#[test]
fn sixteen_processes_racing_never_pass_the_limit_and_get_close() {
    const PROCS: usize = 16;
    const LIMIT: u64 = 2048 * MIB;
    const BLOCK: u64 = 64 * MIB;
    const CONTEXT: u64 = 16 * MIB;
    let region = fresh_region("race");
    let ctx = CONTEXT.to_string();
    let mut kids: Vec<Child> = (0..PROCS)
        .map(|_| {
            spawn(
                &["grab", &BLOCK.to_string()],
                &region,
                "2g",
                &[("VGPU_CONTEXT_BYTES", &ctx)],
            )
        })
        .collect();
    // Everyone has initialised (cuInit claimed a slot) before the barrier opens.
    let t0 = Instant::now();
    while !region.exists() || live(&snapshot(&region)).len() < PROCS {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "slots never claimed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let done = AtomicBool::new(false);
    let peak = AtomicU64::new(0);
    let got: u64 = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let snap = snapshot(&region);
                assert!(snap.devices[0].reserved <= LIMIT, "{:?}", snap.devices[0]);
                peak.fetch_max(snap.devices[0].reserved, Ordering::Relaxed);
            }
        });
        for k in &mut kids {
            k.stdin.as_mut().unwrap().write_all(b"g").unwrap();
        }
        let got = kids
            .iter_mut()
            .map(|k| {
                let line = first_line(k);
                line.split_whitespace()
                    .nth(2)
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        done.store(true, Ordering::Relaxed);
        got
    });
    let s = snapshot(&region);
    let reserved = s.devices[0].reserved;
    let held: u64 = live(&s).iter().map(|sl| sl.held[0]).sum();
    let with_context = live(&s)
        .iter()
        .filter(|sl| sl.context_bytes[0] == CONTEXT)
        .count() as u64;
    assert_eq!(reserved, held, "every reserved byte is held by a live slot");
    assert_eq!(
        reserved,
        got + with_context * CONTEXT,
        "allocations plus contexts"
    );
    assert!(reserved <= LIMIT && peak.load(Ordering::Relaxed) <= LIMIT);
    assert!(
        LIMIT - reserved < BLOCK + CONTEXT,
        "close to the limit: {reserved} of {LIMIT}"
    );
    for mut k in kids {
        drop(k.stdin.take());
        assert!(k.wait().unwrap().success());
    }
    let s = snapshot(&region);
    assert!(live(&s).is_empty(), "{:?}", s.slots);
    assert_eq!(s.devices[0].reserved, 0, "every exit returned its bytes");
}

#[test]
fn sigkilled_holder_is_reclaimed_by_the_next_denied_reservation() {
    let region = fresh_region("kill");
    let bytes = (192 * MIB).to_string();
    let mut a = spawn(&["hold", &bytes], &region, "256m", &[]);
    assert_eq!(first_line(&mut a).trim(), "held 0");
    assert_eq!(snapshot(&region).devices[0].reserved, 192 * MIB);
    a.kill().unwrap();
    a.wait().unwrap();
    // The dead process still holds its bytes until someone needs them.
    assert_eq!(snapshot(&region).devices[0].reserved, 192 * MIB);
    let mut b = spawn(&["hold", &bytes], &region, "256m", &[]);
    assert_eq!(
        first_line(&mut b).trim(),
        "held 0",
        "the denied reservation reclaimed the dead slot and succeeded"
    );
    let s = snapshot(&region);
    assert_eq!(s.devices[0].reserved, 192 * MIB);
    assert!(
        s.devices[0].reclaimed_bytes >= 192 * MIB,
        "{:?}",
        s.devices[0]
    );
    assert_eq!(live(&s).len(), 1);
    drop(b.stdin.take());
    assert!(b.wait().unwrap().success());
    assert_eq!(snapshot(&region).devices[0].reserved, 0);
}

#[test]
fn every_thread_records_into_its_own_shard() {
    let region = fresh_region("threads");
    let mut c = spawn(&["threads"], &region, "1g", &[]);
    assert_eq!(first_line(&mut c).trim(), "ok: threads: cuInit");
    let t0 = Instant::now();
    loop {
        let s = snapshot(&region);
        let slots = live(&s);
        // The threads may not have recorded their frees yet: look without insisting.
        let frees = |sl: &SlotSnapshot| {
            let id = ApiId::from_name("cuMemFree_v2").unwrap();
            sl.apis.iter().find(|a| a.api == id).map(|a| a.calls)
        };
        if let Some(sl) = slots.first()
            && frees(sl) == Some(3)
        {
            let alloc = api_stats(sl, "cuMemAlloc_v2");
            assert_eq!((alloc.calls, alloc.errors), (3, 0));
            assert_eq!(alloc.bytes_allocated, 3 * MIB);
            assert!(alloc.latency_ns > 0 && alloc.hook_ns > 0, "{alloc:?}");
            assert_eq!(alloc.histogram.iter().sum::<u64>(), 3);
            assert_eq!(api_stats(sl, "cuMemFree_v2").bytes_freed, 3 * MIB);
            assert_eq!(api_stats(sl, "cuInit").calls, 1);
            assert_eq!(sl.held[0], 0);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", s.slots);
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(c.stdin.take());
    expect_ok(c.wait_with_output().unwrap());
}

#[test]
fn failed_allocations_and_frees_keep_the_charge_exact() {
    let region = fresh_region("failing");
    let out = preloaded(caller())
        .arg("failing")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("SIMCUDA_FAIL", "cuMemAlloc_v2:2,cuMemFree_v2:2")
        .output()
        .unwrap();
    let (out, _) = expect_ok(out);
    assert!(
        out.contains("ok: failing: nothing charged at the end"),
        "{out}"
    );
    assert_eq!(snapshot(&region).devices[0].reserved, 0);
}

#[test]
fn pools_are_charged_what_they_hold() {
    let region = fresh_region("pool");
    let out = preloaded(caller())
        .arg("pool")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "256m")
        .output()
        .unwrap();
    let (out, _) = expect_ok(out);
    assert!(
        out.contains("ok: pool: after the trim nothing is charged"),
        "{out}"
    );
    assert_eq!(snapshot(&region).devices[0].reserved, 0);
}

#[test]
fn a_panic_in_the_hook_falls_through_to_the_driver_and_is_counted() {
    let region = fresh_region("panic");
    let bytes = (64 * MIB).to_string();
    let mut c = spawn(
        &["hold", &bytes],
        &region,
        "1g",
        &[("VGPU_DEBUG_PANIC_IN", "cuMemAlloc_v2")],
    );
    assert_eq!(
        first_line(&mut c).trim(),
        "held 0",
        "the driver was reached"
    );
    let s = snapshot(&region);
    let sl = live(&s)[0];
    let alloc = api_stats(sl, "cuMemAlloc_v2");
    assert_eq!(
        (alloc.calls, alloc.errors),
        (1, 1),
        "counted as a failure of the limiter"
    );
    assert_eq!(
        sl.held[0], 0,
        "unaccounted: the logic that would charge it panicked"
    );
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success());
}

#[test]
fn the_first_initialiser_wins_and_a_mismatch_is_logged_once() {
    let region = fresh_region("mismatch");
    let mut first = spawn(&["hold", &(64 * MIB).to_string()], &region, "1g", &[]);
    assert_eq!(first_line(&mut first).trim(), "held 0");
    let out = preloaded(caller())
        .args(["hold", &(1536 * MIB).to_string()])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .env("LIBCUDA_LOG_LEVEL", "2")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (so, se) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(
        so.trim(),
        "held 2",
        "the region's 1 GiB applies, not this process's 2 GiB"
    );
    assert_eq!(se.matches("created with other limits").count(), 1, "{se}");
    drop(first.stdin.take());
    assert!(first.wait().unwrap().success());
}

/// The GPU machine's validation script reads regions with its own parser
/// (`scripts/gpu/limiter_region.py`, no agent needed there): it must agree with the region
/// crate's reader, or the script finds no slot and reports every case FAIL without region figures.
#[test]
fn the_gpu_scripts_region_parser_agrees_with_the_reader() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu/limiter_region.py");
    let parse = |region: &Path| -> String {
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(region)
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let region = fresh_region("script-parser");
    let bytes = (96 * MIB).to_string();
    let mut holder = spawn(&["hold", &bytes], &region, "1g", &[]);
    assert_eq!(first_line(&mut holder).trim(), "held 0");
    let s = snapshot(&region);
    let slot = live(&s)[0];
    let d = &s.devices[0];
    // The parser's JSON, compared field by field with what the reader saw (written the same way:
    // Python's json.dumps with its default separators).
    let expected_device = format!(
        "{{\"index\": 0, \"limit\": {}, \"reserved\": {}, \"peak\": {}, \"denied\": {}}}",
        d.memory_limit, d.reserved, d.peak_reserved, d.denied
    );
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let expected_slot = format!(
        "{{\"index\": {}, \"pid\": {}, \"held\": [{}], \"context\": [{}]}}",
        slot.index,
        slot.pid,
        list(&slot.held),
        list(&slot.context_bytes)
    );
    let text = parse(&region);
    assert!(
        text.contains(&expected_device),
        "{text}\nexpected {expected_device}"
    );
    assert!(
        text.contains(&expected_slot),
        "{text}\nexpected {expected_slot}"
    );
    assert!(
        d.reserved >= 96 * MIB && slot.held[0] == d.reserved,
        "{d:?}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let text = parse(&region);
    assert!(text.contains("\"reserved\": 0,"), "{text}");
    assert!(text.contains("\"slots\": []"), "{text}");
}
