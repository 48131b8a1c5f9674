//! `vgpu-agent cdi`: the limiter through the Container Device Interface, for podman, containerd
//! and CRI-O without HAMi's device plugin.
//!
//! `cdi install` puts the limiter and a one-line preload list in a host directory
//! (`/usr/local/lib/vgpu-agent`); `cdi generate` writes a spec whose devices are limit profiles
//! (`--device small:mem=4g,sm=25`). A container run with `--device vgpu-agent.dev/limit=small`
//! gets the limiter mounted read-only and preloaded, HAMi's variables for the profile's limits
//! (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`), and a tmpfs of its own for its region
//! (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), which the agent finds through the processes that map it.
//! The GPU itself still comes from NVIDIA's CDI spec (`--device nvidia.com/gpu=0`).

mod error;
pub mod install;
mod names;
pub mod profile;
pub mod spec;

use std::path::{Path, PathBuf};

use clap::Subcommand;

pub use self::error::CdiError;
use self::{
    names::{LIMITER_FILE, PRELOAD_FILE},
    profile::{Kind, Profile, format_bytes},
    spec::{Preload, SpecOptions},
};

/// The library directory on the node, by default.
pub const DEFAULT_LIB_DIR: &str = "/usr/local/lib/vgpu-agent";
pub const DEFAULT_KIND: &str = "vgpu-agent.dev/limit";

#[derive(Subcommand)]
pub enum CdiCommand {
    /// Install the limiter and its preload list on this node (the files a spec's mounts name).
    Install {
        /// The host directory to install into (the same --lib-dir as `cdi generate`).
        #[arg(long, default_value = DEFAULT_LIB_DIR)]
        lib_dir: PathBuf,
        /// The limiter to install (default: beside this binary, or /usr/lib/vgpu-agent in the
        /// image).
        #[arg(long)]
        limiter: Option<PathBuf>,
    },
    /// Write a CDI spec whose devices inject the limiter with the given limits.
    Generate {
        /// A device: NAME:mem=SIZE[,sm=PERCENT][,tier=TIER][,guarantee=PERCENT], e.g.
        /// small:mem=4g,sm=25 or train:mem=40g,guarantee=30 (repeatable). A
        /// container asks for it with --device KIND=NAME.
        #[arg(long = "device", value_name = "NAME:LIMITS", required = true)]
        devices: Vec<String>,
        /// Where to write the spec (JSON, e.g. /etc/cdi/vgpu-agent.json); `-` for stdout.
        #[arg(long, default_value = "-")]
        output: PathBuf,
        /// The CDI kind, vendor/class.
        #[arg(long, default_value = DEFAULT_KIND)]
        kind: String,
        /// The host directory holding the limiter and the preload list (`cdi install`).
        #[arg(long, default_value = DEFAULT_LIB_DIR)]
        lib_dir: PathBuf,
        /// How processes load the limiter.
        #[arg(long, value_enum, default_value = "ld.so.preload")]
        preload: Preload,
        /// Size of each container's region tmpfs (memory is used only as the region is written).
        #[arg(long, default_value = "64m")]
        region_size: String,
        /// Where the host's filesystem is, to check the library directory from a container
        /// (e.g. /host); the spec names host paths as they are on the host.
        #[arg(long, default_value = "/")]
        host_root: PathBuf,
        /// A host directory for the node's QoS board (docs/qos.md), mounted read-write into
        /// every container with VGPU_QOS_BOARD pointing into it (created with mode 1777).
        #[arg(long)]
        qos_board_dir: Option<PathBuf>,
        /// The host directory of the daemon's freeze pool socket (`vgpu-agent run
        /// --freeze-pool`, docs/oversubscription.md), mounted read-only into every container
        /// with VGPU_FREEZE_POOL_SOCKET pointing into it (created with mode 0755 if missing).
        #[arg(long)]
        freeze_pool_dir: Option<PathBuf>,
    },
}

/// Runs a `cdi` command; returns what to tell the user (on stderr: stdout may be the spec).
pub fn run(command: CdiCommand) -> Result<Vec<String>, CdiError> {
    match command {
        CdiCommand::Install { lib_dir, limiter } => {
            let limiter = limiter
                .or_else(install::default_limiter)
                .ok_or(CdiError::NoLimiter)?;
            let done = install::install(&limiter, &lib_dir)?;
            Ok(vec![
                format!(
                    "installed {} (from {})",
                    done.limiter.display(),
                    limiter.display()
                ),
                format!("wrote {}", done.preload.display()),
            ])
        }
        CdiCommand::Generate {
            devices,
            output,
            kind,
            lib_dir,
            preload,
            region_size,
            host_root,
            qos_board_dir,
            freeze_pool_dir,
        } => {
            let mut opts = options(&kind, &devices, lib_dir, preload, &region_size)?;
            if let Some(dir) = qos_board_dir {
                install::board_dir(&host_root.join(dir.strip_prefix("/").unwrap_or(&dir)))?;
                opts.qos_board_dir = Some(dir);
            }
            if let Some(dir) = freeze_pool_dir {
                install::pool_dir(&host_root.join(dir.strip_prefix("/").unwrap_or(&dir)))?;
                opts.freeze_pool_dir = Some(dir);
            }
            let to_stdout = output.as_os_str() == "-";
            if !to_stdout && output.extension().is_none_or(|e| e != "json") {
                return Err(CdiError::NotJson { path: output });
            }
            check_installed(&opts, &host_root)?;
            let text = render(&opts);
            if to_stdout {
                print!("{text}");
                return Ok(Vec::new());
            }
            install::write_atomically(&output, text.as_bytes(), 0o644)?;
            let names: Vec<String> = opts
                .devices
                .iter()
                .map(|d| format!("{}={}", opts.kind, d.name))
                .collect();
            Ok(vec![
                format!("wrote {}", output.display()),
                format!("devices: {}", names.join(" ")),
            ])
        }
    }
}

/// Validated spec options from the command line's strings.
pub fn options(
    kind: &str,
    devices: &[String],
    lib_dir: PathBuf,
    preload: Preload,
    region_size: &str,
) -> Result<SpecOptions, CdiError> {
    let kind: Kind = kind.parse()?;
    if devices.is_empty() {
        return Err(CdiError::NoDevices);
    }
    let mut profiles: Vec<Profile> = Vec::new();
    for d in devices {
        let p: Profile = d.parse()?;
        if profiles.iter().any(|q| q.name == p.name) {
            return Err(CdiError::DuplicateDevice(p.name));
        }
        profiles.push(p);
    }
    let size = crate::limit::parse_memory(region_size)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| CdiError::RegionSizeSyntax(region_size.to_owned()))?;
    let min = spec::min_region_size();
    if size < min {
        return Err(CdiError::RegionSize {
            given: region_size.to_owned(),
            min: format_bytes(min),
        });
    }
    Ok(SpecOptions {
        kind,
        devices: profiles,
        lib_dir,
        preload,
        region_size: size,
        qos_board_dir: None,
        freeze_pool_dir: None,
    })
}

/// The files the spec mounts must be on the node (under `host_root` when run in a container).
fn check_installed(opts: &SpecOptions, host_root: &Path) -> Result<(), CdiError> {
    let mut needed = vec![opts.lib_dir.join(LIMITER_FILE)];
    if opts.preload == Preload::LdSoPreload {
        needed.push(opts.lib_dir.join(PRELOAD_FILE));
    }
    for path in needed {
        let on_host = host_root.join(path.strip_prefix("/").unwrap_or(&path));
        if !on_host.is_file() {
            return Err(CdiError::NotInstalled {
                path,
                lib_dir: opts.lib_dir.clone(),
            });
        }
        if path.ends_with(LIMITER_FILE) {
            install::check_limiter(&on_host)?;
        }
    }
    Ok(())
}

/// The spec as pretty JSON with a final newline.
pub fn render(opts: &SpecOptions) -> String {
    let mut text = serde_json::to_string_pretty(&spec::build(opts)).expect("a spec serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(devices: &[&str], preload: Preload) -> SpecOptions {
        let devices: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
        options(
            DEFAULT_KIND,
            &devices,
            PathBuf::from(DEFAULT_LIB_DIR),
            preload,
            "64m",
        )
        .unwrap()
    }

    fn device_err(s: &str) -> String {
        s.parse::<Profile>().unwrap_err().to_string()
    }

    #[test]
    fn profiles_parse_limits_the_limiter_reads() {
        let p: Profile = "small:mem=4g,sm=25".parse().unwrap();
        assert_eq!(
            p,
            Profile {
                name: "small".into(),
                memory: Some(4 << 30),
                sm: Some(25),
                tier: None,
                guarantee: None,
            }
        );
        // QoS tiers (docs/qos.md).
        let p: Profile = "infer:mem=8g,tier=latency".parse().unwrap();
        assert_eq!(p.tier.as_deref(), Some("latency"));
        let p: Profile = "train:guarantee=30".parse().unwrap();
        assert_eq!((p.tier, p.guarantee), (None, Some(30)));
        for bad in [
            "x:tier=gold",
            "x:tier=guaranteed",
            "x:tier=latency,guarantee=30",
            "x:guarantee=0",
            "x:guarantee=101",
        ] {
            assert!(bad.parse::<Profile>().is_err(), "{bad}");
        }
        let p: Profile = "a100-half.v2:memory=1536m".parse().unwrap();
        assert_eq!((p.memory, p.sm), (Some(1536 << 20), None));
        let p: Profile = "0:sm=40%".parse().unwrap();
        assert_eq!((p.name.as_str(), p.memory, p.sm), ("0", None, Some(40)));
        assert_eq!(format_bytes(4 << 30), "4g");
        assert_eq!(format_bytes(1536 << 20), "1536m");
        assert_eq!(format_bytes(4097), "4097");
        assert_eq!(format_bytes(3 << 40), "3t");
    }

    #[test]
    fn bad_profiles_say_what_is_wrong() {
        for (input, says) in [
            ("small", "expected NAME:mem=SIZE[,sm=PERCENT]"),
            (":mem=4g", "the device name is empty"),
            ("-x:mem=4g", "must start with a letter or digit"),
            ("x-:mem=4g", "must end with a letter or digit"),
            ("a b:mem=4g", "may not contain ' '"),
            (
                "x:mem=4x",
                "mem=\"4x\": expected a size such as 4g or 1536m",
            ),
            ("x:mem=0", "mem=0 is no limit"),
            ("x:mem=1000000t", "above the largest limit a region holds"),
            ("x:sm=0", "sm=0 is no limit"),
            ("x:sm=100", "sm=100 is no limit"),
            ("x:sm=150", "expected a percentage from 1 to 99"),
            ("x:sm=half", "expected a percentage from 1 to 99"),
            (
                "x:gpu=1",
                "unknown setting \"gpu\": the settings are mem, sm, tier and guarantee",
            ),
            ("x:mem=1g,mem=2g", "mem is given twice"),
            ("x:sm=1,sm=2", "sm is given twice"),
            ("x:mem", "expected key=value"),
        ] {
            let err = device_err(input);
            assert!(err.contains(says), "{input}: {err}");
            assert!(err.starts_with(&format!("--device {input:?}")), "{err}");
        }
    }

    #[test]
    fn kinds_follow_the_cdi_rules_podman_reads() {
        let k: Kind = "vgpu-agent.dev/limit".parse().unwrap();
        assert_eq!(k.to_string(), "vgpu-agent.dev/limit");
        assert!("example.com/gpu_share-2".parse::<Kind>().is_ok());
        for (input, says) in [
            ("limit", "expected vendor/class"),
            ("/limit", "the vendor is empty"),
            ("vgpu-agent.dev/", "the class is empty"),
            ("1vendor/limit", "must start with a letter"),
            ("vendor/li.mit", "may not contain '.'"),
            ("vendor/limit/x", "may not contain '/'"),
            ("vendor./limit", "must end with a letter or digit"),
        ] {
            let err = input.parse::<Kind>().unwrap_err().to_string();
            assert!(err.contains(says), "{input}: {err}");
        }
    }

    #[test]
    fn options_refuse_duplicates_no_devices_and_a_region_tmpfs_too_small() {
        let lib = PathBuf::from(DEFAULT_LIB_DIR);
        let dup = options(
            DEFAULT_KIND,
            &["a:mem=1g".into(), "a:sm=5".into()],
            lib.clone(),
            Preload::LdSoPreload,
            "64m",
        );
        assert_eq!(
            dup.unwrap_err().to_string(),
            "--device \"a\" is given twice"
        );
        let none = options(DEFAULT_KIND, &[], lib.clone(), Preload::Env, "64m");
        assert!(matches!(none, Err(CdiError::NoDevices)));
        let small = options(
            DEFAULT_KIND,
            &["a:mem=1g".into()],
            lib.clone(),
            Preload::Env,
            "16m",
        )
        .unwrap_err()
        .to_string();
        assert!(small.contains("SIGBUS"), "{small}");
        assert!(
            small.contains(&format_bytes(spec::min_region_size())),
            "{small}"
        );
        let syntax = options(
            DEFAULT_KIND,
            &["a:mem=1g".into()],
            lib,
            Preload::Env,
            "lots",
        );
        assert!(matches!(syntax, Err(CdiError::RegionSizeSyntax(_))));
        // The minimum holds the default region and its control block.
        assert!(
            spec::min_region_size()
                >= region::layout::region_size(region::DEFAULT_SLOTS)
                    + region::control::CONTROL_SIZE as u64
        );
        assert!(spec::min_region_size() <= 64 << 20, "the default must fit");
    }

    /// The whole spec, as written: reviewed like code.
    #[test]
    fn the_spec_mounts_the_limiter_preload_and_a_region_tmpfs_and_sets_each_devices_limits() {
        let text = render(&opts(
            &["small:mem=4g,sm=25", "large:mem=16g"],
            Preload::LdSoPreload,
        ));
        let want = r#"{
  "cdiVersion": "0.5.0",
  "kind": "vgpu-agent.dev/limit",
  "devices": [
    {
      "name": "small",
      "containerEdits": {
        "env": [
          "CUDA_DEVICE_MEMORY_LIMIT=4g",
          "CUDA_DEVICE_SM_LIMIT=25"
        ]
      }
    },
    {
      "name": "large",
      "containerEdits": {
        "env": [
          "CUDA_DEVICE_MEMORY_LIMIT=16g"
        ]
      }
    }
  ],
  "containerEdits": {
    "env": [
      "CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/lib/vgpu-agent/region/vgpu.cache"
    ],
    "mounts": [
      {
        "hostPath": "/usr/local/lib/vgpu-agent/libvgpu_limiter.so",
        "containerPath": "/usr/local/lib/vgpu-agent/libvgpu_limiter.so",
        "options": [
          "ro",
          "nosuid",
          "nodev",
          "bind"
        ]
      },
      {
        "hostPath": "/usr/local/lib/vgpu-agent/ld.so.preload",
        "containerPath": "/etc/ld.so.preload",
        "options": [
          "ro",
          "nosuid",
          "nodev",
          "bind"
        ]
      },
      {
        "hostPath": "tmpfs",
        "containerPath": "/var/lib/vgpu-agent/region",
        "type": "tmpfs",
        "options": [
          "nosuid",
          "nodev",
          "noexec",
          "size=64m",
          "mode=1777"
        ]
      }
    ]
  }
}
"#;
        assert_eq!(text, want);
        // It reads back as a spec with no unknown field.
        let back: spec::Spec = serde_json::from_str(&text).unwrap();
        assert_eq!(back.devices.len(), 2);
    }

    #[test]
    fn the_env_route_sets_ld_preload_and_leaves_etc_ld_so_preload_alone() {
        let s = spec::build(&opts(&["a:sm=30"], Preload::Env));
        let edits = &s.container_edits;
        assert!(
            edits
                .env
                .contains(&format!("LD_PRELOAD={}", spec::LIMITER_IN_CONTAINER))
        );
        assert!(
            edits
                .mounts
                .iter()
                .all(|m| m.container_path != "/etc/ld.so.preload")
        );
        assert_eq!(
            s.devices[0].container_edits.env,
            ["CUDA_DEVICE_SM_LIMIT=30"]
        );
        // The region is per container and the limiter read-only, whichever route.
        assert!(
            edits
                .mounts
                .iter()
                .any(|m| m.mount_type.as_deref() == Some("tmpfs")
                    && m.container_path == spec::REGION_DIR_IN_CONTAINER)
        );
        assert!(
            edits
                .mounts
                .iter()
                .any(|m| m.container_path == spec::LIMITER_IN_CONTAINER
                    && m.options.contains(&"ro".to_owned()))
        );
    }

    #[test]
    fn a_freeze_pool_directory_is_mounted_read_only_with_the_socket_named() {
        let mut o = opts(&["a:mem=8g"], Preload::Env);
        o.freeze_pool_dir = Some(PathBuf::from("/srv/pool"));
        let spec = spec::build(&o);
        assert!(spec.container_edits.env.contains(&format!(
            "VGPU_FREEZE_POOL_SOCKET={}",
            region::freeze_pool::DEFAULT_SOCKET
        )));
        let m = spec
            .container_edits
            .mounts
            .iter()
            .find(|m| m.host_path == "/srv/pool")
            .expect("the pool directory is mounted");
        assert_eq!(
            Path::new(region::freeze_pool::DEFAULT_SOCKET).parent(),
            Some(Path::new(&m.container_path))
        );
        assert!(m.options.contains(&"ro".to_string()), "{:?}", m.options);
        assert!(!m.options.contains(&"rw".to_string()), "{:?}", m.options);
        let plain = spec::build(&opts(&["a:mem=1g"], Preload::Env));
        assert!(
            !plain
                .container_edits
                .env
                .iter()
                .any(|e| e.starts_with("VGPU_FREEZE_POOL_SOCKET="))
        );
        // The directory is made root's, 0755; something else in its place is refused.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pool");
        install::pool_dir(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = install::pool_dir(&file).unwrap_err().to_string();
        assert!(err.contains("a freeze pool directory must be one"), "{err}");
    }

    #[test]
    fn a_qos_board_directory_is_mounted_into_every_container_and_tiers_set_per_device() {
        let mut o = opts(
            &["infer:mem=8g,tier=latency", "train:guarantee=30"],
            Preload::Env,
        );
        o.qos_board_dir = Some(PathBuf::from("/run/vgpu-agent/qos"));
        let spec = spec::build(&o);
        assert!(
            spec.container_edits
                .env
                .contains(&format!("VGPU_QOS_BOARD={}", spec::QOS_BOARD_IN_CONTAINER))
        );
        let m = spec
            .container_edits
            .mounts
            .iter()
            .find(|m| m.container_path == spec::QOS_DIR_IN_CONTAINER)
            .expect("the board directory is mounted");
        assert_eq!(m.host_path, "/run/vgpu-agent/qos");
        assert!(m.options.contains(&"rw".to_string()), "{:?}", m.options);
        assert!(
            spec.devices[0]
                .container_edits
                .env
                .contains(&"VGPU_QOS_TIER=latency".into())
        );
        assert!(
            spec.devices[1]
                .container_edits
                .env
                .contains(&"VGPU_QOS_GUARANTEE=30".into())
        );
        // Without a board directory, no mount and no variable.
        let plain = spec::build(&opts(&["a:mem=1g"], Preload::Env));
        assert!(
            !plain
                .container_edits
                .env
                .iter()
                .any(|e| e.starts_with("VGPU_QOS_BOARD"))
        );
        // The directory is made sticky and writable by all; a file in its place is refused.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("qos");
        install::board_dir(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(install::board_dir(&file).is_err());
    }

    #[test]
    fn generate_needs_the_limiter_installed_and_a_json_file() {
        let tmp = tempfile::tempdir().unwrap();
        let generate = |output: &str, lib_dir: &Path| CdiCommand::Generate {
            devices: vec!["a:mem=1g".into()],
            output: tmp.path().join(output),
            kind: DEFAULT_KIND.into(),
            lib_dir: lib_dir.to_owned(),
            preload: Preload::LdSoPreload,
            region_size: "64m".into(),
            host_root: "/".into(),
            qos_board_dir: None,
            freeze_pool_dir: None,
        };
        let lib_dir = tmp.path().join("lib");
        let err = run(generate("vgpu.json", &lib_dir))
            .unwrap_err()
            .to_string();
        assert!(err.contains("vgpu-agent cdi install --lib-dir"), "{err}");
        // Something that is not the limiter is refused by name.
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::write(lib_dir.join(LIMITER_FILE), b"not ELF").unwrap();
        std::fs::write(lib_dir.join(PRELOAD_FILE), b"x\n").unwrap();
        let err = run(generate("vgpu.json", &lib_dir))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is not the vgpu-agent limiter: not ELF"),
            "{err}"
        );
        let err = install::check_limiter(Path::new("/lib/x86_64-linux-gnu/libc.so.6"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not export cuMemAlloc_v2"), "{err}");
        assert!(!err.contains("dlsym"), "{err}");
        // YAML is not written (said before anything is checked on the node).
        let err = run(generate("vgpu.yaml", &lib_dir)).unwrap_err();
        assert!(matches!(err, CdiError::NotJson { .. }), "{err}");
        assert!(!tmp.path().join("vgpu.yaml").exists());
        let err = install::install(Path::new("/nonexistent/libvgpu_limiter.so"), &lib_dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/libvgpu_limiter.so is not the vgpu-agent limiter"),
            "{err}"
        );
    }

    #[test]
    fn files_are_replaced_whole_with_the_mode_asked_for() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("cdi/vgpu-agent.json");
        install::write_atomically(&path, b"one", 0o644).unwrap();
        install::write_atomically(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["vgpu-agent.json"]);
    }
}
