//! `vgpu-agent freeze|thaw` against the simulated driver's checkpoint API: a process under the
//! limiter, sharing one simulated GPU, gives all of its device memory back while frozen, stays
//! alive, its next CUDA call waits for the thaw and reads its memory back word for word.

mod support;

use std::{
    io::{BufRead, BufReader, Lines, Write},
    path::Path,
    process::{Child, ChildStdout, Command, Output, Stdio},
};

use serde_json::Value;
use support::{agent_bin, exercise, limiter_lib, sim_lib, tempdir};

const MIB: u64 = 1 << 20;

/// Bytes every process holds on device 0 of the shared device (word 256 of its file).
fn charged(gpu: &Path) -> u64 {
    let b = std::fs::read(gpu).unwrap();
    u64::from_le_bytes(b[256 * 8..257 * 8].try_into().unwrap())
}

struct Pattern {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Pattern {
    fn line(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }

    fn check(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap(), "check").unwrap();
        assert_eq!(self.line()["checking"], true);
    }
}

/// `cuda-exercise pattern` of 8 MiB under the limiter, on the shared device `gpu`.
fn pattern(dir: &Path, lib: &Path, gpu: &Path) -> Pattern {
    let mut c = exercise(lib);
    c.args(["pattern", "--bytes", "8m"])
        .env("LD_PRELOAD", limiter_lib())
        .env("VGPU_REAL_LIBCUDA", lib)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", dir.join("c.region"))
        .env("CUDA_DEVICE_MEMORY_LIMIT", "32m")
        .env("VGPU_CONTEXT_BYTES", "0")
        .env("SIMCUDA_SHARED_DEVICE", gpu)
        .env("SIMCUDA_CAPACITY", "64m")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut p = Pattern { child, lines };
    assert_eq!(p.line()["result"], 0);
    p
}

fn agent(args: &[&str], lib: &Path, gpu: &Path) -> Output {
    Command::new(agent_bin())
        .args(args)
        .arg("--libcuda")
        .arg(lib)
        .env("SIMCUDA_SHARED_DEVICE", gpu)
        .env("SIMCUDA_CAPACITY", "64m")
        .output()
        .unwrap()
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_frozen_process_gives_its_memory_back_and_its_next_call_thaws_word_for_word() {
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let mut p = pattern(dir.path(), &lib, &gpu);
    let pid = p.child.id().to_string();
    p.check();
    assert_eq!(p.line()["corrupted"], 0);
    assert_eq!(charged(&gpu), 8 * MIB);

    let out = stdout_ok(&agent(&["freeze", "--pid", &pid], &lib, &gpu));
    assert_eq!(
        out.trim(),
        format!("pid {pid}: frozen (device memory in host memory, CUDA calls wait for the thaw)")
    );
    assert_eq!(charged(&gpu), 0, "all of its device memory back to the GPU");
    assert!(p.child.try_wait().unwrap().is_none(), "still alive");

    // Its next call (a copy back) waits; the thaw lets it proceed on the memory as it was.
    p.check();
    let out = stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(out.trim(), format!("pid {pid}: thawed"));
    let v = p.line();
    assert_eq!(
        (v["result"].as_i64(), v["corrupted"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(charged(&gpu), 8 * MIB);

    let out = stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(out.trim(), format!("pid {pid}: already running"));

    drop(p.child.stdin.take());
    assert_eq!(p.line()["freed"], 0);
    assert!(p.child.wait().unwrap().success());
}

#[test]
fn processes_that_cannot_be_frozen_are_named_and_the_others_still_are() {
    let dir = tempdir();
    let lib = sim_lib(&dir.path().join("lib"));
    let gpu = dir.path().join("gpu");
    let mut p = pattern(dir.path(), &lib, &gpu);
    let pid = p.child.id().to_string();
    // pid 1 is no CUDA process of this device.
    let out = agent(&["freeze", "--pid", "1", "--pid", &pid], &lib, &gpu);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains(&format!("pid {pid}: frozen")), "{stdout}");
    assert!(
        stderr.contains("pid 1: cuCheckpointProcessLock on pid 1 failed with CUDA error 1"),
        "{stderr}"
    );
    assert_eq!(charged(&gpu), 0);
    stdout_ok(&agent(&["thaw", "--pid", &pid], &lib, &gpu));
    assert_eq!(charged(&gpu), 8 * MIB);
    // A container with no GPU process.
    let out = agent(&["freeze", "--container", "no-such-container"], &lib, &gpu);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no GPU process of container"),
        "{out:?}"
    );
    p.check();
    assert_eq!(p.line()["corrupted"], 0);
    drop(p.child.stdin.take());
    assert_eq!(p.line()["freed"], 0);
    p.child.wait().unwrap();
}
