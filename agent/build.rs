//! Builds the eBPF programs (agent-ebpf) with the pinned nightly and bpf-linker, and embeds them.
//!
//! Without that toolchain (a plain `cargo test` on a machine where `cargo xtask setup` never ran)
//! the build still succeeds: an empty object is embedded and `vgpu-agent` says at start-up that it
//! was built without probes and how to fix that.

use std::{env, fs, path::PathBuf, process::Command};

/// Keep in step with xtask's `EBPF_TOOLCHAIN` and docs/building.md.
const EBPF_TOOLCHAIN: &str = "nightly-2026-08-01";
const OBJECT: &str = "vgpu-probes";

fn main() -> anyhow::Result<()> {
    println!("cargo::rerun-if-env-changed=VGPU_SKIP_EBPF");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let ebpf_dir = manifest_dir.join("../agent-ebpf");
    let ebpf_dir = ebpf_dir.canonicalize().unwrap_or(ebpf_dir);
    println!("cargo::rerun-if-changed={}", ebpf_dir.display());
    println!(
        "cargo::rerun-if-changed={}",
        manifest_dir.join("../agent-common/src").display()
    );

    let skip = env::var_os("VGPU_SKIP_EBPF").is_some_and(|v| v == "1");
    let missing = if skip {
        Some("VGPU_SKIP_EBPF=1".to_string())
    } else {
        missing_toolchain()
    };
    if let Some(why) = missing {
        println!(
            "cargo::warning=building vgpu-agent without eBPF probes ({why}); run `cargo xtask setup`"
        );
        fs::write(out_dir.join(OBJECT), [])?;
        return Ok(());
    }
    let root_dir = ebpf_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "agent-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )
}

/// Why the eBPF toolchain is unusable, if it is.
fn missing_toolchain() -> Option<String> {
    let has_linker = env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).any(|p| p.join("bpf-linker").is_file()))
        .unwrap_or(false);
    if !has_linker {
        return Some("bpf-linker not found in PATH".into());
    }
    let sysroot = Command::new("rustup")
        .args(["run", EBPF_TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output();
    match sysroot {
        Ok(o) if o.status.success() => {
            let root = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            if root.join("lib/rustlib/src/rust/library/core").is_dir() {
                None
            } else {
                Some(format!("{EBPF_TOOLCHAIN} has no rust-src component"))
            }
        }
        _ => Some(format!("toolchain {EBPF_TOOLCHAIN} not installed")),
    }
}
