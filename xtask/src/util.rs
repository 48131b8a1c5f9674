//! Small process helpers.

use std::{
    ffi::OsStr,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The repository root (xtask lives in `<root>/xtask`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the repository")
        .to_path_buf()
}

pub fn cmd<I, S>(program: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(program);
    c.args(args).current_dir(repo_root());
    c
}

/// Runs a command with inherited stdio; an unsuccessful exit is an error naming the command.
pub fn run(c: &mut Command) -> Result<()> {
    let shown = format!("{c:?}");
    let status = c
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout, or `None` if it could not run or failed.
pub fn output(c: &mut Command) -> Option<String> {
    let out = c.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

pub fn step(name: &str) {
    eprintln!("\n==> {name}");
}
