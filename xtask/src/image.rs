//! `cargo xtask image`: the agent's OCI image, built here from scratch (no base image, no
//! registry): the release `vgpu-agent` (eBPF probes included) and the libraries `ldd` says it
//! needs, plus the limiter at `/usr/lib/vgpu-agent/libvgpu_limiter.so` for nodes that inject it
//! through CDI (`vgpu-agent cdi install` copies it out). Written reproducibly (see `oci`) as an
//! OCI archive that `podman load` reads.

mod oci;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::util::{self, cmd, output, repo_root};

/// The image's name without the tag: what `podman load` calls it, and what the DaemonSet
/// and the kustomization name.
pub const IMAGE_NAME: &str = "localhost/vgpu-agent";

const USAGE: &str = "\
usage: cargo xtask image [--bin-dir DIR] [--out FILE] [--tag REFERENCE]

Builds the agent's OCI image (target/image/vgpu-agent-VERSION.oci.tar) from the release build.
  --bin-dir DIR   take vgpu-agent and libvgpu_limiter.so from DIR instead of building them
  --out FILE      where to write the archive
  --tag REF       the name podman load gives it (default localhost/vgpu-agent:VERSION)
The time stamped in it is SOURCE_DATE_EPOCH, else the last commit's time.";

/// The agent's version, from agent/Cargo.toml.
pub fn version() -> Result<String> {
    let manifest = fs::read_to_string(repo_root().join("agent/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_owned)
        .context("agent/Cargo.toml has no version")
}

struct Args {
    bin_dir: Option<PathBuf>,
    out: Option<PathBuf>,
    tag: Option<String>,
}

fn parse_args(rest: &[String]) -> Result<Args> {
    let mut args = Args {
        bin_dir: None,
        out: None,
        tag: None,
    };
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs a value\n\n{USAGE}"))
        };
        match a.as_str() {
            "--bin-dir" => args.bin_dir = Some(value()?.into()),
            "--out" => args.out = Some(value()?.into()),
            "--tag" => args.tag = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(args)
}

pub fn run(rest: &[String]) -> Result<()> {
    let args = parse_args(rest)?;
    let version = version()?;
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => {
            crate::setup::run()?;
            util::step("cargo build --release (vgpu-agent with its eBPF probes, the limiter)");
            util::run(&mut cmd(
                "cargo",
                ["build", "--release", "-p", "vgpu-agent", "-p", "limiter"],
            ))?;
            repo_root().join("target/release")
        }
    };
    let out = args
        .out
        .unwrap_or_else(|| repo_root().join(format!("target/image/vgpu-agent-{version}.oci.tar")));
    let reference = args
        .tag
        .unwrap_or_else(|| format!("{IMAGE_NAME}:{version}"));
    let files = collect(&bin_dir)?;
    let spec = oci::ImageSpec {
        reference: reference.clone(),
        entrypoint: vec!["/usr/bin/vgpu-agent".into()],
        cmd: vec!["run".into()],
        env: vec!["PATH=/usr/bin:/bin".into()],
        labels: [
            ("org.opencontainers.image.title", "vgpu-agent"),
            (
                "org.opencontainers.image.description",
                "Observability and enforcement for shared NVIDIA GPUs",
            ),
            ("org.opencontainers.image.version", version.as_str()),
            ("org.opencontainers.image.licenses", "Apache-2.0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect::<BTreeMap<_, _>>(),
        dirs: vec![("tmp".into(), 0o1777)],
        epoch: source_date_epoch()?,
    };
    let built = oci::build(&files, &spec)?;
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir)?;
    }
    let partial = out.with_extension("tar.partial");
    fs::write(&partial, &built.archive)
        .with_context(|| format!("writing {}", partial.display()))?;
    fs::rename(&partial, &out)?;
    println!(
        "image: {} ({:.1} MiB, {} files)\n  name     {reference}\n  id       {}\n  manifest {}\n\
         load and push it:\n  podman load -i {}\n  podman tag {reference} REGISTRY/vgpu-agent:{version}\n  \
         podman push REGISTRY/vgpu-agent:{version}",
        out.display(),
        built.archive.len() as f64 / (1 << 20) as f64,
        files.len(),
        built.config_digest,
        built.manifest_digest,
        out.display(),
    );
    Ok(())
}

/// `SOURCE_DATE_EPOCH`, else the time of the last commit, else 0.
fn source_date_epoch() -> Result<u64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"));
    }
    Ok(output(&mut cmd("git", ["log", "-1", "--format=%ct"]))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0))
}

/// The image's files: the agent and the limiter from `bin_dir` (debug info stripped), and the
/// shared libraries and loader the agent needs, at the paths `ldd` names.
fn collect(bin_dir: &Path) -> Result<Vec<oci::LayerFile>> {
    let agent = bin_dir.join("vgpu-agent");
    let limiter = bin_dir.join("libvgpu_limiter.so");
    for p in [&agent, &limiter] {
        if !p.is_file() {
            bail!(
                "{} is missing: build it (`cargo build --release -p vgpu-agent -p limiter`) or pass another --bin-dir",
                p.display()
            );
        }
    }
    let tmp = std::env::temp_dir().join(format!("vgpu-image-{}", std::process::id()));
    fs::create_dir_all(&tmp)?;
    let result = (|| {
        let mut files = vec![
            oci::LayerFile {
                path: "usr/bin/vgpu-agent".into(),
                mode: 0o755,
                contents: stripped(&agent, &tmp)?,
            },
            oci::LayerFile {
                path: "usr/lib/vgpu-agent/libvgpu_limiter.so".into(),
                mode: 0o755,
                contents: stripped(&limiter, &tmp)?,
            },
        ];
        for lib in needed_libraries(&agent)? {
            files.push(oci::LayerFile {
                path: lib
                    .strip_prefix("/")
                    .unwrap_or(&lib)
                    .to_string_lossy()
                    .into_owned(),
                mode: 0o755,
                contents: fs::read(&lib).with_context(|| format!("reading {}", lib.display()))?,
            });
        }
        Ok(files)
    })();
    let _ = fs::remove_dir_all(&tmp);
    result
}

/// A copy of `path` without debug information (the release profile keeps line tables).
fn stripped(path: &Path, tmp: &Path) -> Result<Vec<u8>> {
    let copy = tmp.join(path.file_name().context("a file name")?);
    fs::copy(path, &copy).with_context(|| format!("copying {}", path.display()))?;
    util::run(cmd("strip", ["--strip-debug"]).arg(&copy))?;
    Ok(fs::read(&copy)?)
}

/// The libraries and the loader `ldd` lists for `binary` (not the vDSO).
fn needed_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let text = output(cmd("ldd", [binary]).env("LC_ALL", "C"))
        .with_context(|| format!("ldd {} failed", binary.display()))?;
    parse_ldd(&text)
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    bail!("ldd: {} is not found on this machine", name.trim());
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or(target).trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    if libs.is_empty() {
        bail!("ldd listed no libraries:\n{text}");
    }
    libs.sort();
    libs.dedup();
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let text = "\
\tlinux-vdso.so.1 (0x00007ffd1b5f2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0e0c5c1000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f0e0c4e2000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e0c301000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e0d4d5000)
";
        let libs = parse_ldd(text).unwrap();
        let want: Vec<PathBuf> = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libgcc_s.so.1",
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/lib64/ld-linux-x86-64.so.2",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(libs, want);
        let err = parse_ldd("\tlibnvidia-ml.so.1 => not found\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("libnvidia-ml.so.1 is not found"), "{err}");
        assert!(parse_ldd("\tstatically linked\n").is_err());
    }

    /// Two copies of the same binaries with different times and modes on disk give one image.
    #[test]
    fn building_twice_from_copies_gives_the_same_digest() {
        let base = std::env::temp_dir().join(format!("vgpu-image-test-{}", std::process::id()));
        let mut digests = Vec::new();
        for (i, mode) in [(0, 0o700), (1, 0o755)] {
            let dir = base.join(i.to_string());
            fs::create_dir_all(&dir).unwrap();
            // Any dynamically linked program and library stand in for the agent and the limiter.
            for (src, dst) in [
                ("/usr/bin/true", "vgpu-agent"),
                ("/lib/x86_64-linux-gnu/libgcc_s.so.1", "libvgpu_limiter.so"),
            ] {
                let p = dir.join(dst);
                fs::copy(src, &p).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            }
            if i == 1 {
                // A later mtime on the second copy.
                std::thread::sleep(std::time::Duration::from_millis(20));
                fs::write(dir.join("vgpu-agent.touch"), b"").unwrap();
                let f = fs::File::options()
                    .append(true)
                    .open(dir.join("vgpu-agent"))
                    .unwrap();
                f.set_modified(std::time::SystemTime::now()).unwrap();
            }
            let files = collect(&dir).unwrap();
            assert!(
                files
                    .iter()
                    .any(|f| f.path == "lib/x86_64-linux-gnu/libc.so.6"),
                "glibc is in the image: {:?}",
                files.iter().map(|f| &f.path).collect::<Vec<_>>()
            );
            let spec = oci::ImageSpec {
                reference: "localhost/vgpu-agent:test".into(),
                entrypoint: vec!["/usr/bin/vgpu-agent".into()],
                cmd: vec![],
                env: vec![],
                labels: BTreeMap::new(),
                dirs: vec![],
                epoch: 1,
            };
            let built = oci::build(&files, &spec).unwrap();
            digests.push((built.manifest_digest, built.archive));
        }
        let _ = fs::remove_dir_all(&base);
        assert_eq!(digests[0].0, digests[1].0);
        assert!(digests[0].1 == digests[1].1, "the archives differ");
    }

    #[test]
    fn the_manifests_name_the_image_this_builds() {
        let version = version().unwrap();
        let daemonset = fs::read_to_string(repo_root().join("deploy/base/daemonset.yaml")).unwrap();
        assert!(
            daemonset.contains(&format!("image: {IMAGE_NAME}:{version}\n")),
            "deploy/base/daemonset.yaml must run {IMAGE_NAME}:{version}"
        );
        let kustomization =
            fs::read_to_string(repo_root().join("deploy/base/kustomization.yaml")).unwrap();
        assert!(
            kustomization.contains(&format!("- name: {IMAGE_NAME}\n"))
                && kustomization.contains(&format!("newTag: \"{version}\"\n")),
            "deploy/base/kustomization.yaml must map {IMAGE_NAME} with newTag \"{version}\":\n{kustomization}"
        );
    }
}
