//! The simulated driver's checkpoint API between processes sharing a device: a second process
//! locks, checkpoints, restores and unlocks a process by its pid; the checkpointed process's
//! device memory goes back to the device (another process can allocate it), its CUDA calls wait
//! until the unlock, and its memory comes back word for word.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

const MIB: u64 = 1 << 20;
const CU_PROCESS_STATE_RUNNING: i64 = 0;
const CU_PROCESS_STATE_LOCKED: i64 = 1;
const CU_PROCESS_STATE_CHECKPOINTED: i64 = 2;
const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;
const CUDA_ERROR_ILLEGAL_STATE: i64 = 401;
const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;
const CUDA_ERROR_TIMEOUT: i64 = 909;

/// A fresh shared device file for one test.
fn gpu(name: &str) -> PathBuf {
    let p = test_dir("checkpoint").join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// Bytes charged on device 0 of the shared device, by every process (word 256 of the file).
fn charged(gpu: &Path) -> u64 {
    let b = std::fs::read(gpu).unwrap();
    u64::from_le_bytes(b[256 * 8..257 * 8].try_into().unwrap())
}

struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn start(args: &[&str], gpu: &Path, extra: &[(&str, &str)]) -> Running {
        let mut c = Command::new(EXE);
        c.arg("--lib").arg(sim_lib()).args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("SIMCUDA_") {
                c.env_remove(k);
            }
        }
        c.env("SIMCUDA_SHARED_DEVICE", gpu)
            .env("SIMCUDA_CAPACITY", "64m")
            .envs(extra.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Running { child, lines }
    }

    fn line(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Closes stdin and waits for the last line.
    fn finish(mut self) -> Value {
        drop(self.child.stdin.take());
        let last = self.line();
        assert!(self.child.wait().unwrap().success());
        last
    }
}

/// `cuda-exercise checkpoint` on `pid`: (result, state after).
fn op(gpu: &Path, pid: i32, op: &str, timeout_ms: u32) -> (i64, Option<i64>) {
    let out = run_sim(
        &[
            "checkpoint",
            "--pid",
            &pid.to_string(),
            "--op",
            op,
            "--timeout-ms",
            &timeout_ms.to_string(),
        ],
        &[
            ("SIMCUDA_SHARED_DEVICE", gpu.to_str().unwrap()),
            ("SIMCUDA_CAPACITY", "64m"),
        ],
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (v["result"].as_i64().unwrap(), v["state"].as_i64())
}

/// A `pattern` process of 8 MiB, its memory checked once.
fn pattern(gpu: &Path, extra: &[(&str, &str)]) -> Running {
    let mut p = Running::start(&["pattern", "--bytes", "8m"], gpu, extra);
    let first = p.line();
    assert_eq!(first["result"], 0, "{first}");
    p.send("check");
    assert_eq!(p.line()["checking"], true);
    let v = p.line();
    assert_eq!(
        (v["result"].as_i64(), v["corrupted"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    p
}

#[test]
fn a_checkpoint_gives_the_memory_back_and_the_restore_brings_it_back_word_for_word() {
    let gpu = gpu("roundtrip");
    let mut p = pattern(&gpu, &[]);
    let pid = p.pid();
    assert_eq!(charged(&gpu), 8 * MIB);
    assert_eq!(
        op(&gpu, pid, "state", 0),
        (0, Some(CU_PROCESS_STATE_RUNNING))
    );
    assert_eq!(op(&gpu, pid, "lock", 0), (0, Some(CU_PROCESS_STATE_LOCKED)));
    assert_eq!(
        op(&gpu, pid, "checkpoint", 0),
        (0, Some(CU_PROCESS_STATE_CHECKPOINTED))
    );
    assert_eq!(charged(&gpu), 0, "all of its device memory given back");
    // Its next call waits for the unlock; meanwhile another process gets the whole device.
    p.send("check");
    assert_eq!(p.line()["checking"], true);
    let mut other = Running::start(&["hold", "--bytes", "64m"], &gpu, &[]);
    assert_eq!(other.line()["result"], 0);
    assert_eq!(other.finish()["freed"], 0);
    assert_eq!(
        op(&gpu, pid, "restore", 0),
        (0, Some(CU_PROCESS_STATE_LOCKED))
    );
    assert_eq!(charged(&gpu), 8 * MIB);
    assert_eq!(
        op(&gpu, pid, "unlock", 0),
        (0, Some(CU_PROCESS_STATE_RUNNING))
    );
    // The call that waited read the memory as it was before the checkpoint (had it run while
    // checkpointed, it would have read zeros).
    let v = p.line();
    assert_eq!(
        (v["result"].as_i64(), v["corrupted"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(p.finish()["freed"], 0);
    assert_eq!(charged(&gpu), 0);
}

#[test]
fn a_restore_without_room_fails_and_stays_checkpointed() {
    let gpu = gpu("full");
    let p = pattern(&gpu, &[]);
    let pid = p.pid();
    assert_eq!(op(&gpu, pid, "lock", 0).0, 0);
    assert_eq!(op(&gpu, pid, "checkpoint", 0).0, 0);
    let mut other = Running::start(&["hold", "--bytes", "60m"], &gpu, &[]);
    assert_eq!(other.line()["result"], 0);
    assert_eq!(
        op(&gpu, pid, "restore", 0),
        (
            CUDA_ERROR_OUT_OF_MEMORY,
            Some(CU_PROCESS_STATE_CHECKPOINTED)
        )
    );
    assert_eq!(
        charged(&gpu),
        60 * MIB,
        "nothing charged by the failed restore"
    );
    other.finish();
    assert_eq!(
        op(&gpu, pid, "restore", 0),
        (0, Some(CU_PROCESS_STATE_LOCKED))
    );
    assert_eq!(op(&gpu, pid, "unlock", 0).0, 0);
    let mut p = p;
    p.send("check");
    p.line();
    assert_eq!(p.line()["corrupted"], 0);
    p.finish();
}

#[test]
fn a_lock_waits_for_calls_in_flight_and_gives_up_at_its_timeout() {
    let gpu = gpu("inflight");
    // Each copy back spends 1.5 s inside the driver.
    let mut p = pattern(&gpu, &[("SIMCUDA_DELAY_US", "cuMemcpyDtoH_v2=1500000")]);
    let pid = p.pid();
    p.send("check");
    assert_eq!(p.line()["checking"], true);
    assert_eq!(
        op(&gpu, pid, "lock", 100),
        (CUDA_ERROR_TIMEOUT, Some(CU_PROCESS_STATE_RUNNING))
    );
    // The call was not disturbed, and a lock without a timeout waits for the next one.
    assert_eq!(p.line()["corrupted"], 0);
    p.send("check");
    assert_eq!(p.line()["checking"], true);
    assert_eq!(op(&gpu, pid, "lock", 0), (0, Some(CU_PROCESS_STATE_LOCKED)));
    let v = p.line();
    assert_eq!(
        v["corrupted"], 0,
        "the call in flight finished before the lock: {v}"
    );
    assert_eq!(op(&gpu, pid, "unlock", 0).0, 0);
    p.finish();
}

#[test]
fn requests_out_of_order_unknown_pids_and_unshared_devices_are_refused() {
    let gpu = gpu("order");
    let p = pattern(&gpu, &[]);
    let pid = p.pid();
    assert_eq!(op(&gpu, pid, "checkpoint", 0).0, CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(op(&gpu, pid, "unlock", 0).0, CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(op(&gpu, pid, "restore", 0).0, CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(op(&gpu, pid, "lock", 0).0, 0);
    assert_eq!(op(&gpu, pid, "lock", 0).0, CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(op(&gpu, pid, "unlock", 0).0, 0);
    // A pid with no entry in the device file.
    assert_eq!(op(&gpu, 1, "lock", 0), (1, None));
    // No shared device: nothing to checkpoint through.
    let out = run_sim(
        &["checkpoint", "--pid", &pid.to_string(), "--op", "lock"],
        &[],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"], CUDA_ERROR_NOT_SUPPORTED);
    assert_eq!(p.finish()["freed"], 0);
}

#[test]
fn a_killed_checkpointed_process_leaves_no_device_memory_behind() {
    let gpu = gpu("killed");
    let mut p = pattern(&gpu, &[]);
    let pid = p.pid();
    assert_eq!(op(&gpu, pid, "lock", 0).0, 0);
    assert_eq!(op(&gpu, pid, "checkpoint", 0).0, 0);
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    assert_eq!(charged(&gpu), 0);
    // Its pid is gone: requests for it are refused, not waited on.
    assert_eq!(op(&gpu, pid, "restore", 0).0, 1);
}
