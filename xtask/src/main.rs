//! Project tasks: `cargo xtask <setup|build|test|run|demo|bundle|image|bench>`.
//!
//! `setup` installs every prerequisite on a fresh Debian 12 machine and is idempotent: when
//! everything is present it only checks, in well under 5 s. `test` and `run` call it first, so a
//! fresh clone needs nothing else.
//!
//! # Layers
//!
//! Lowest first; a module imports modules of its own layer and of the layers below, and no
//! import cycle forms among modules (`cargo xtask layers` checks both).
//!
//! 1. base: `demo_workloads`, `layers`, `util`, `bench_fixtures`, `setup`. Shared helpers, the
//!    toolchain setup and the layers check.
//! 2. commands: `bench_agent`, `bench_cold`, `bench_limiter`, `bench_startup`, `demo`, `image`,
//!    `bench_export`, `bench`. One module per command.

mod bench;
mod bench_agent;
mod bench_cold;
mod bench_export;
mod bench_fixtures;
mod bench_limiter;
mod bench_startup;
mod demo;
mod demo_workloads;
mod image;
mod layers;
mod setup;
mod util;

use std::{env, path::PathBuf};

use anyhow::{Context, Result, bail};

use crate::util::{cmd, repo_root};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup            install the toolchains and packages the build and tests need (idempotent)
  build [--release]  build everything, the eBPF probes included
  test             setup, then formatting, lints and every test (privileged ones when root)
  run [-- ARGS]    setup, build (release) and run vgpu-agent ARGS (default: top)
  demo             top on simulated-driver workloads in two cgroups, one under the limiter (root)
  bundle [--prev COMMIT]  build release binaries into .carry/ for the GPU machine (with --prev,
                   also COMMIT's limiter into .carry/prev/, for scripts/gpu/bench-limiter.sh)
  image            build the agent's OCI image into target/image/ (podman load -i ...)
  bench <name>     run a benchmark: region, agent, limiter, pairs-cold, startup, export,
                   attribute, sm-shares
                   (see docs/benchmarks.md)
  layers [--bless | --edges CRATE]  print each crate's layer table and any import cycle,
                   layer violation or stale name in docs/architecture.md (--bless writes the
                   tables there; --edges prints CRATE's import edges)";

fn main() {
    // The error's chain without a backtrace (CI sets RUST_BACKTRACE, and a backtrace of xtask
    // itself would bury the tests' messages at the end of the log).
    if let Err(e) = xtask_main() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn xtask_main() -> Result<()> {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some(command) = args.first() else {
        println!("{USAGE}");
        return Ok(());
    };
    let rest = &args[1..];
    match command.as_str() {
        "setup" => setup::run(),
        "build" => {
            setup::run()?;
            build(rest.iter().any(|a| a == "--release"))
        }
        "test" => test(),
        "run" => run(rest),
        "demo" => demo::run(),
        "bundle" => match rest {
            [] => bundle(),
            [flag, commit] if flag == "--prev" => bundle().and_then(|()| bundle_prev(commit)),
            _ => bail!("usage: cargo xtask bundle [--prev COMMIT]"),
        },
        "image" => image::run(rest),
        "bench" => bench::run(rest),
        "layers" => layers::run(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

fn build(release: bool) -> Result<()> {
    let mut c = cmd("cargo", ["build", "--all-targets"]);
    if release {
        c.arg("--release");
    }
    util::run(&mut c)
}

/// Environment that tests read: where the real driver and NCCL libraries are, and whether
/// privileged tests must run (as root they may not skip).
pub fn test_env() -> Vec<(String, String)> {
    let mut v = vec![
        (
            "VGPU_TEST_LIBCUDA".to_string(),
            setup::test_libcuda().display().to_string(),
        ),
        (
            "VGPU_TEST_LIBNCCL".to_string(),
            setup::test_libnccl().display().to_string(),
        ),
    ];
    if util::is_root() {
        v.push(("VGPU_REQUIRE_PRIVILEGED".into(), "1".into()));
    }
    v
}

fn test() -> Result<()> {
    setup::run()?;
    util::step("cargo fmt --check");
    util::run(&mut cmd("cargo", ["fmt", "--all", "--", "--check"]))
        .context("formatting: run `cargo fmt --all`")?;
    util::step("cargo clippy");
    util::run(&mut cmd(
        "cargo",
        ["clippy", "--all-targets", "--", "-D", "warnings"],
    ))?;
    util::step("cargo test");
    // Through `tee`, so that a failure's own messages can be repeated at the very end, where a CI
    // log's tail shows them (the full log: target/test-output.log).
    let log = repo_root().join("target/test-output.log");
    let mut t = cmd(
        "bash",
        [
            "-o",
            "pipefail",
            "-c",
            "cargo test --no-fail-fast 2>&1 | tee \"$1\"",
            "cargo-test",
        ],
    );
    t.arg(&log).envs(test_env());
    if let Err(e) = util::run(&mut t) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        eprintln!("{}", failure_summary(&text));
        return Err(e.context(format!("cargo test failed (full log: {})", log.display())));
    }
    // The loom models (the region's seqlocks, the in-process freeze's gate), in their own
    // target directory: `--cfg loom` changes RUSTFLAGS, which would otherwise invalidate the
    // main build.
    for krate in ["region", "limiter-core"] {
        util::step(&format!("loom models ({krate})"));
        let mut loom = cmd("cargo", ["test", "-p", krate, "--release", "--lib", "loom"]);
        loom.env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", repo_root().join("target/loom"));
        util::run(&mut loom)?;
    }
    // The limiter's pure logic under miri (undefined behaviour, data races, leaks), with the
    // pinned nightly; its sysroot is built once into ~/.cache/miri.
    util::step("miri (limiter-core)");
    let nightly = format!("+{}", setup::EBPF_TOOLCHAIN);
    util::run(&mut cmd(
        "cargo",
        [nightly.as_str(), "miri", "test", "-p", "limiter-core"],
    ))?;
    util::step("deploy/validate.py (overlays rendered by kubectl kustomize, alert rules)");
    let python = setup::kube_validate_python();
    util::run(&mut cmd(
        python.to_str().context("utf-8 path")?,
        ["deploy/validate.py"],
    ))?;
    Ok(())
}

/// The failed tests of a `cargo test` log and what each printed (its `---- name stdout ----`
/// block, backtrace frames left out), for the end of the output.
fn failure_summary(log: &str) -> String {
    let mut out = String::from("\n==== failed tests, with what they printed ====\n");
    let mut inside = false;
    let mut lines_in_block = 0;
    for line in log.lines() {
        if line.starts_with("---- ") && line.ends_with(" stdout ----") {
            inside = true;
            lines_in_block = 0;
        } else if inside && (line == "failures:" || line.starts_with("test result:")) {
            inside = false;
        }
        let frame = line.trim_start().starts_with("at ")
            || line
                .trim_start()
                .split_once(':')
                .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty());
        if inside && !frame && lines_in_block < 80 {
            out.push_str(line);
            out.push('\n');
            lines_in_block += 1;
        }
    }
    for line in log.lines().filter(|l| l.ends_with("... FAILED")) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn run(rest: &[String]) -> Result<()> {
    setup::run()?;
    util::run(&mut cmd(
        "cargo",
        ["build", "--release", "--bin", "vgpu-agent"],
    ))?;
    let bin = repo_root().join("target/release/vgpu-agent");
    let args: Vec<String> = match rest.iter().position(|a| a == "--") {
        Some(i) => rest[i + 1..].to_vec(),
        None if rest.is_empty() => vec!["top".into()],
        None => rest.to_vec(),
    };
    if args.first().is_some_and(|a| a == "top") && !nvidia_driver_present() {
        println!(
            "No NVIDIA driver on this machine: top will show what the probes see, without GPUs. \
             For a live view of simulated GPU workloads run `./x demo` (cargo xtask demo)."
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let mut c = if util::is_root() || which("sudo").is_none() {
        cmd(
            bin.to_str().context("utf-8 path")?,
            args.iter().map(String::as_str),
        )
    } else {
        let mut c = cmd("sudo", ["-E"]);
        c.arg(&bin).args(&args);
        c
    };
    util::run(&mut c)
}

/// Whether the NVIDIA kernel driver is loaded.
fn nvidia_driver_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists()
}

fn bundle() -> Result<()> {
    setup::run()?;
    util::run(&mut cmd(
        "cargo",
        [
            "build",
            "--release",
            "--workspace",
            "--exclude",
            "agent-ebpf",
        ],
    ))?;
    let out = repo_root().join(".carry/bin");
    std::fs::create_dir_all(&out)?;
    for name in [
        "vgpu-agent",
        "cuda-exercise",
        "libsimcuda.so",
        "libvgpu_limiter.so",
    ] {
        let src = repo_root().join("target/release").join(name);
        if src.exists() {
            let dst = out.join(name);
            std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
            // Debug info stays in target/; the copies travel to the GPU machine (64 MiB limit).
            util::run(cmd("strip", ["--strip-debug"]).arg(&dst))?;
            println!("bundled {}", dst.display());
        }
    }
    Ok(())
}

/// Builds the limiter of `commit` into `.carry/prev/libvgpu_limiter.so`, for
/// `LIM_PREV=.carry/prev/libvgpu_limiter.so bash scripts/gpu/bench-limiter.sh` to compare with
/// this tree's build: in a detached worktree under `target/` (removed afterwards) with its own
/// target directory, so that this tree's build is left alone.
fn bundle_prev(commit: &str) -> Result<()> {
    let root = repo_root();
    let src = root.join("target/prev-src");
    let remove = || {
        let _ = cmd("git", ["worktree", "remove", "--force"])
            .arg(&src)
            .output();
    };
    remove();
    util::run(
        cmd("git", ["worktree", "add", "--detach", "--force"])
            .arg(&src)
            .arg(commit),
    )
    .with_context(|| format!("checking out {commit}"))?;
    let built = util::run(
        cmd("cargo", ["build", "--release", "-p", "limiter"])
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", root.join("target/prev")),
    );
    remove();
    built.with_context(|| format!("building the limiter of {commit}"))?;
    let out = root.join(".carry/prev");
    std::fs::create_dir_all(&out)?;
    let dst = out.join("libvgpu_limiter.so");
    std::fs::copy(root.join("target/prev/release/libvgpu_limiter.so"), &dst)?;
    util::run(cmd("strip", ["--strip-debug"]).arg(&dst))?;
    let rev = std::process::Command::new("git")
        .args(["rev-parse", commit])
        .current_dir(&root)
        .output()?;
    std::fs::write(out.join("COMMIT"), &rev.stdout)?;
    println!(
        "bundled {} ({})",
        dst.display(),
        String::from_utf8_lossy(&rev.stdout).trim()
    );
    Ok(())
}

fn which(name: &str) -> Option<PathBuf> {
    env::var_os("PATH").and_then(|p| {
        env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::failure_summary;

    #[test]
    fn the_summary_keeps_each_failures_messages_without_backtrace_frames() {
        let log = "\
running 2 tests
test a ... ok
test b ... FAILED

failures:

---- b stdout ----
probe cost: attributed 0.1s, truth 0.2s (50.0% off)

thread 'b' panicked at agent/tests/attribute.rs:9:5:
no attempt within tolerance
stack backtrace:
   0: std::panicking::begin_panic
             at /rustc/x/library/std/src/panicking.rs:1:1

failures:
    b

test result: FAILED. 1 passed; 1 failed
";
        let s = failure_summary(log);
        assert!(s.contains("(50.0% off)"), "{s}");
        assert!(s.contains("no attempt within tolerance"), "{s}");
        assert!(s.contains("test b ... FAILED"), "{s}");
        assert!(
            !s.contains("begin_panic") && !s.contains("panicking.rs"),
            "{s}"
        );
        assert!(!s.contains("test a"), "{s}");
    }
}

#[cfg(test)]
mod docs_lint {
    //! User documents and code comments state current behaviour; development history ("the fourth
    //! session", records named `...-session5.txt`, an issue cited by its number) belongs in `docs/lab/` or in
    //! git history. This test fails when a file outside `docs/lab/` names a development session or
    //! cites one of the project's issues by number.

    use std::fs;
    use std::path::{Path, PathBuf};

    /// Extensions of the files checked: documentation and every kind of source with comments.
    const CHECKED: &[&str] = &["md", "rs", "c", "cu", "py", "sh", "toml", "yaml", "yml"];
    /// Folders not checked: history, build outputs, the GPU bundle and vendored trees.
    const SKIPPED: &[&str] = &["docs/lab", "target", ".git", ".carry", "node_modules"];
    const ORDINALS: &[&str] = &[
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh",
    ];

    /// The places in `text` that name a development session: "<ordinal> session" or "session"
    /// directly followed by a digit ("session6"). A systemd unit such as `session-3.scope` is not one.
    fn session_mentions(text: &str) -> Vec<String> {
        let lower = text.to_ascii_lowercase();
        let word = "session";
        let mut found = Vec::new();
        for (at, _) in lower.match_indices(word) {
            let before = lower[..at].trim_end_matches(char::is_whitespace);
            let after = lower[at + word.len()..].chars().next();
            let ordinal = ORDINALS.iter().any(|o| {
                before.ends_with(o)
                    && before.len() < at
                    && !before[..before.len() - o.len()]
                        .ends_with(|c: char| c.is_ascii_alphanumeric())
            });
            if ordinal || after.is_some_and(|c| c.is_ascii_digit()) {
                let line = lower[..at].matches('\n').count() + 1;
                let start = at.saturating_sub(30);
                let end = (at + word.len() + 10).min(lower.len());
                let context = text.get(start..end).unwrap_or(word);
                found.push(format!("line {line}: ...{context}..."));
            }
        }
        found
    }

    /// The places in `text` that cite one of the project's issues: "issue" as a word, then blanks
    /// and a digit. Other projects' issues are cited by their
    /// repository (`HAMi#2863`), which this leaves alone, as it does "issues" ("rank r issues 5").
    fn issue_mentions(text: &str) -> Vec<String> {
        let lower = text.to_ascii_lowercase();
        let word = "issue";
        let mut found = Vec::new();
        for (at, _) in lower.match_indices(word) {
            let starts_word = !lower[..at].ends_with(|c: char| c.is_ascii_alphanumeric());
            let rest = &lower[at + word.len()..];
            let blanks = rest.len() - rest.trim_start_matches([' ', '\t', '\n']).len();
            let digit = blanks > 0 && rest[blanks..].starts_with(|c: char| c.is_ascii_digit());
            if starts_word && digit {
                let line = lower[..at].matches('\n').count() + 1;
                let end = (at + word.len() + blanks + 6).min(lower.len());
                let context = text.get(at..end).unwrap_or(word);
                found.push(format!("line {line}: {context}..."));
            }
        }
        found
    }

    fn checked_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap_or(&path);
            if SKIPPED.iter().any(|s| relative.starts_with(s)) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                checked_files(root, &path, out);
            } else if kind.is_file()
                && path
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| CHECKED.contains(&e))
            {
                out.push(path);
            }
        }
    }

    // The samples are split so that this file does not itself read as a narrative.
    #[test]
    fn the_detector_finds_sessions_and_leaves_unit_names_alone() {
        assert_eq!(
            session_mentions(concat!("as the Fourth", " session showed")).len(),
            1
        );
        assert_eq!(
            session_mentions(concat!("see bench-h100-", "session6.json")).len(),
            1
        );
        assert_eq!(
            session_mentions(concat!("in the first ", " session")).len(),
            1
        );
        assert_eq!(
            session_mentions(concat!("the Sixth", "\nsession, above")).len(),
            1
        );
        assert!(session_mentions("/user.slice/session-3.scope").is_empty());
        assert!(session_mentions("the probe session attaches").is_empty());
        assert!(session_mentions("a tmux session").is_empty());
        assert!(session_mentions("the thirst session").is_empty());
    }

    // The samples are split so that this file does not itself cite an issue.
    #[test]
    fn the_detector_finds_issue_numbers_and_leaves_other_uses_alone() {
        assert_eq!(issue_mentions(concat!("(iss", "ue 4, point 8)")).len(), 1);
        assert_eq!(issue_mentions(concat!("see Iss", "ue\n22 for")).len(), 1);
        assert!(issue_mentions("HAMi#2863 and HAMi-core#274").is_empty());
        assert!(issue_mentions("rank r issues 5 calls").is_empty());
        assert!(issue_mentions(concat!("tiss", "ue 5")).is_empty());
        assert!(issue_mentions("an issue with 4 GPUs").is_empty());
    }

    #[test]
    fn no_file_outside_docs_lab_names_a_development_session() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        checked_files(&root, &root, &mut files);
        assert!(
            files.len() > 50,
            "found only {} files under {}",
            files.len(),
            root.display()
        );
        let this_file = Path::new(file!()).file_name();
        let mut offenders = Vec::new();
        for path in files {
            if path.file_name() == this_file {
                continue;
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            for mention in session_mentions(&text)
                .into_iter()
                .chain(issue_mentions(&text))
            {
                offenders.push(format!("{}: {mention}", path.display()));
            }
        }
        assert!(
            offenders.is_empty(),
            "development history belongs in docs/lab/ (say what is true now, and why):\n{}",
            offenders.join("\n")
        );
    }
}
