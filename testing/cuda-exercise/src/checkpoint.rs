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
