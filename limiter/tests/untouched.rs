//! A process that never calls CUDA is untouched, even with a malformed configuration; a process
//! that does call CUDA with a malformed configuration fails its first call and says why, once.

mod support;

use std::process::Command;

use support::{cc, expect_ok, paths, preloaded, text};

/// Runs `cmd` in a fresh empty directory and returns its output and what it left there.
fn run_in_empty_dir(name: &str, mut cmd: Command) -> (std::process::Output, Vec<String>) {
    let dir = paths()
        .tmp
        .join(format!("empty-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let region = dir.join("region.cache");
    let out = cmd
        .current_dir(&dir)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4x")
        .output()
        .expect("run");
    let left = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    (out, left)
}

#[test]
fn shell_without_cuda_is_untouched() {
    let mut c = preloaded("sh");
    c.args(["-c", "true"]);
    let (out, left) = run_in_empty_dir("sh", c);
    assert!(out.status.success());
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        (String::new(), String::new())
    );
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn python_without_cuda_is_untouched() {
    let mut c = preloaded("python3");
    // One thread, no output of ours, no files: the limiter did nothing at load time.
    c.args(["-c", "import os; print(len(os.listdir('/proc/self/task')))"]);
    let (out, left) = run_in_empty_dir("py", c);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "1\n");
    assert_eq!(text(&out.stderr), "");
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn malformed_limit_fails_the_first_cuda_call_with_one_message() {
    let exe = cc(
        "caller.c",
        "caller-untouched",
        &[
            "-ldl",
            "-lpthread",
            &format!("-L{}", paths().libdir.display()),
            "-lcuda",
        ],
    );
    let out = preloaded(exe)
        .arg("config")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4x")
        .output()
        .expect("run caller");
    let (_, err) = expect_ok(out);
    assert_eq!(
        err.matches("CUDA_DEVICE_MEMORY_LIMIT=\"4x\"").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("configuration error") && err.contains("CUDA_ERROR_NOT_INITIALIZED"),
        "{err}"
    );
}

#[test]
fn malformed_per_device_sm_limit_is_reported_too() {
    let exe = cc(
        "caller.c",
        "caller-untouched-sm",
        &[
            "-ldl",
            "-lpthread",
            &format!("-L{}", paths().libdir.display()),
            "-lcuda",
        ],
    );
    let out = preloaded(exe)
        .arg("config")
        .env("CUDA_DEVICE_SM_LIMIT_1", "150")
        .output()
        .expect("run caller");
    let (_, err) = expect_ok(out);
    assert!(err.contains("CUDA_DEVICE_SM_LIMIT_1=\"150\""), "{err}");
}
