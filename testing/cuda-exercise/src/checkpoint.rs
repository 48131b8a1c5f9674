//! The checkpoint commands: `pattern` (a process whose device memory holds a known pattern, for
//! a checkpoint and restore to be checked against, word by word) and `checkpoint` (the second
//! process that calls the driver's checkpoint API on it).

use serde_json::json;
use std::io::BufRead;
use std::process::ExitCode;

use crate::cli::CheckpointOp;
use crate::driver::{CUresult, Driver};
use crate::record::print;

/// Word `i` of the pattern: distinct in every word and every byte position.
fn word(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a5a_0000_0000_00a5
}

pub fn pattern(drv: &Driver, bytes: usize) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let words = bytes / 8;
    let expected: Vec<u8> = (0..words).flat_map(|i| word(i).to_le_bytes()).collect();
    let (mut r, ptr) = drv.mem_alloc(bytes);
    if r == Some(0) {
        r = drv.memcpy_htod(ptr, &expected);
    }
    print(json!({"pid": std::process::id(), "bytes": bytes, "result": r, "ptr": ptr}));
    if r != Some(0) {
        return Ok(ExitCode::FAILURE);
    }
    let mut back = vec![0u8; expected.len()];
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        if let Some(name) = line.trim().strip_prefix("call ") {
            // Any entry point, with harmless arguments and a size of 0 (an allocation of
            // nothing): what matters is that the call is made, and when it returns.
            print(json!({"calling": name}));
            let r = drv.call_default(name, 0)?;
            print(json!({"called": name, "result": r}));
            continue;
        }
        if line.trim() != "check" {
            return Err(format!(
                "unknown request {line:?} (want check or call NAME)"
            ));
        }
        back.fill(0);
        print(json!({"checking": true}));
        let r = drv.memcpy_dtoh(&mut back, ptr);
        let corrupted = back
            .as_chunks::<8>()
            .0
            .iter()
            .zip(expected.as_chunks::<8>().0)
            .filter(|(a, b)| a != b)
            .count();
        print(json!({"result": r, "corrupted": corrupted}));
    }
    let r = drv.mem_free(ptr);
    print(json!({"pid": std::process::id(), "freed": r}));
    Ok(if r == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The `vmm-pattern` command (see `cli.rs`).
pub fn vmm_pattern(drv: &Driver, bytes: usize, shareable: bool) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let mut ignore = |_: &str, _: Option<CUresult>, _: u64| {};
    drv.primary_context(&mut ignore)
        .map_err(|e| format!("setting up a context: {e}"))?;
    let chunk = bytes / 2;
    let words = bytes / 8;
    let expected: Vec<u8> = (0..words).flat_map(|i| word(i).to_le_bytes()).collect();
    let (mut r, va) = drv.address_reserve(bytes);
    let mut handles = [0u64; 2];
    for (i, h) in handles.iter_mut().enumerate() {
        if r != Some(0) {
            break;
        }
        (r, *h) = if shareable {
            drv.mem_create_shareable(chunk)
        } else {
            drv.mem_create(chunk)
        };
        if r == Some(0) {
            r = drv.mem_map(va + (i * chunk) as u64, chunk, *h);
        }
    }
    if r == Some(0) {
        r = drv.mem_set_access(va, bytes);
    }
    for i in 0..2 {
        if r == Some(0) {
            let at = i * chunk;
            r = drv.memcpy_htod(va + at as u64, &expected[at..at + chunk]);
        }
    }
    let (mut retained, mut released) = (0, None);
    if r == Some(0) {
        (r, retained) = drv.mem_retain(va + chunk as u64 + 4096);
        released = drv.mem_release(retained);
    }
    print(json!({
        "pid": std::process::id(), "bytes": bytes, "result": r, "ptr": va,
        "handles": handles, "retained": retained, "released": released,
    }));
    if r != Some(0) {
        return Ok(ExitCode::FAILURE);
    }
    let mut mapped = 2;
    let mut back = vec![0u8; chunk];
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let line = line.trim();
        if let Some(name) = line.strip_prefix("call ") {
            print(json!({"calling": name}));
            let r = drv.call_default(name, 0)?;
            print(json!({"called": name, "result": r}));
            continue;
        }
        match line {
            "check" => {
                print(json!({"checking": true}));
                let (mut r, mut corrupted) = (Some(0), 0);
                for i in 0..mapped {
                    let at = i * chunk;
                    back.fill(0);
                    let c = drv.memcpy_dtoh(&mut back, va + at as u64);
                    if c != Some(0) {
                        r = c;
                    }
                    corrupted += back
                        .as_chunks::<8>()
                        .0
                        .iter()
                        .zip(expected[at..at + chunk].as_chunks::<8>().0)
                        .filter(|(a, b)| a != b)
                        .count();
                }
                print(json!({"result": r, "corrupted": corrupted}));
            }
            "export" => {
                let (r, fd) = drv.mem_export_fd(handles[0]);
                if r == Some(0) {
                    // SAFETY: a descriptor the export just gave this process, closed once.
                    unsafe { libc::close(fd) };
                }
                print(json!({"exported": r}));
            }
            "release-one" if mapped == 2 => {
                let unmapped = drv.mem_unmap(va + chunk as u64, chunk);
                let released = drv.mem_release(handles[1]);
                mapped = 1;
                print(json!({"unmapped": unmapped, "released": released}));
            }
            _ => {
                return Err(format!(
                    "unknown request {line:?} (want check, call NAME, export or release-one)"
                ));
            }
        }
    }
    let mut r = Some(0);
    for (i, &h) in handles.iter().enumerate().take(mapped) {
        for step in [
            drv.mem_unmap(va + (i * chunk) as u64, chunk),
            drv.mem_release(h),
        ] {
            if step != Some(0) {
                r = step;
            }
        }
    }
    let freed = drv.address_free(va, bytes);
    if freed != Some(0) {
        r = freed;
    }
    print(json!({"pid": std::process::id(), "freed": r}));
    Ok(if r == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn checkpoint(
    drv: &Driver,
    pid: i32,
    op: CheckpointOp,
    timeout_ms: u32,
) -> Result<ExitCode, String> {
    let r = drv.init();
    if r != Some(0) {
        return Err(format!("cuInit returned {r:?}"));
    }
    let r = match op {
        CheckpointOp::Lock => drv.checkpoint_lock(pid, timeout_ms),
        CheckpointOp::Checkpoint => drv.checkpoint_step("cuCheckpointProcessCheckpoint", pid),
        CheckpointOp::Restore => drv.checkpoint_step("cuCheckpointProcessRestore", pid),
        CheckpointOp::Unlock => drv.checkpoint_step("cuCheckpointProcessUnlock", pid),
        CheckpointOp::State => Some(0),
    };
    let (s, state) = drv.checkpoint_state(pid);
    let state = (s == Some(0)).then_some(state);
    print(json!({"op": format!("{op:?}").to_lowercase(), "result": r, "state": state}));
    Ok(if r == Some(0) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
