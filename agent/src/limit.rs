//! `vgpu-agent limit set|show`: run-time limit changes through the control block beside a
//! container's region (`region::control`). The agent writes only the control block, never the
//! accounting region; the container's limiter applies the change at its next CUDA call.
//!
//! A container's regions are found as the collector finds them: the region files its processes
//! map (`/proc/<pid>/maps`, reached through `/proc/<pid>/root`), for processes whose cgroup names
//! the container.

use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use region::{ControlError, ControlSettings, ControlWriter, MAX_DEVICES, control_path};

use crate::{
    collector::regions::{Format, mapped_files, sniff},
    identity::container::ContainerIdentity,
};

/// What a `limit` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error(
        "no running process of container {0:?} maps a limiter region (is the limiter preloaded?)"
    )]
    NoRegion(String),
    #[error("{0} is not a vgpu-agent limiter region")]
    NotARegion(PathBuf),
    #[error("device {0} is beyond the {MAX_DEVICES} devices a region holds")]
    Device(u32),
    #[error("nothing to set: give --sm and/or --memory")]
    NothingToSet,
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// Where to apply a change.
pub enum Target {
    Container(String),
    Region(PathBuf),
}

/// Parses a memory limit: bytes with an optional binary suffix k, m, g, t (as
/// `CUDA_DEVICE_MEMORY_LIMIT`), or `0`/`none` for no limit.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    let bad =
        || format!("{s:?}: expected bytes with an optional k, m, g or t suffix (e.g. 4g), or none");
    let (digits, shift) = match s.as_bytes().last().map(u8::to_ascii_lowercase) {
        Some(b'k') => (&s[..s.len() - 1], 10),
        Some(b'm') => (&s[..s.len() - 1], 20),
        Some(b'g') => (&s[..s.len() - 1], 30),
        Some(b't') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(bad)
}

/// The regions of `target`: the file itself, or those the container's processes map.
pub fn regions(target: &Target, proc: &Path) -> Result<Vec<PathBuf>, LimitError> {
    match target {
        Target::Region(p) => match sniff(p) {
            Some(Format::Vgpu) => Ok(vec![p.clone()]),
            _ => Err(LimitError::NotARegion(p.clone())),
        },
        Target::Container(id) => {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            let pids = std::fs::read_dir(proc)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
            for pid in pids {
                let Ok(cg) = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup"))
                else {
                    continue;
                };
                let matches = ContainerIdentity::from_proc_cgroup(&cg)
                    .and_then(|i| i.container_id)
                    .is_some_and(|c| !id.is_empty() && c.as_str().starts_with(id.as_str()));
                if !matches {
                    continue;
                }
                for f in mapped_files(proc, pid) {
                    if sniff(&f) == Some(Format::Vgpu)
                        && let Ok(m) = std::fs::metadata(&f)
                        && seen.insert((m.dev(), m.ino()))
                    {
                        out.push(f);
                    }
                }
            }
            if out.is_empty() {
                return Err(LimitError::NoRegion(id.clone()));
            }
            Ok(out)
        }
    }
}

/// Writes the change into each region's control block; returns a line per region.
pub fn set(
    target: &Target,
    device: Option<u32>,
    sm: Option<u8>,
    memory: Option<u64>,
) -> Result<Vec<String>, LimitError> {
    if sm.is_none() && memory.is_none() {
        return Err(LimitError::NothingToSet);
    }
    if let Some(d) = device
        && d as usize >= MAX_DEVICES
    {
        return Err(LimitError::Device(d));
    }
    let mut lines = Vec::new();
    for region in regions(target, Path::new("/proc"))? {
        let writer = ControlWriter::open(&control_path(&region))?;
        let generation = writer.update(|s| {
            let devices = device.map_or(0..MAX_DEVICES, |d| d as usize..d as usize + 1);
            for d in devices {
                if let Some(p) = sm {
                    s.sm_percent[d] = Some(p);
                }
                if let Some(m) = memory {
                    s.memory_limit[d] = Some(m);
                }
            }
        })?;
        lines.push(format!(
            "{}: generation {generation}: {}",
            writer.path().display(),
            describe(&writer.snapshot()?.map(|s| s.settings).unwrap_or_default())
        ));
    }
    Ok(lines)
}

/// The overrides of each region's control block, a line per region.
pub fn show(target: &Target) -> Result<Vec<String>, LimitError> {
    let mut lines = Vec::new();
    for region in regions(target, Path::new("/proc"))? {
        let ctl = control_path(&region);
        let line = if ctl.exists() {
            let snap = ControlWriter::open(&ctl)?.snapshot()?;
            match snap {
                Some(s) => format!(
                    "{}: generation {}: {}",
                    ctl.display(),
                    s.generation,
                    describe(&s.settings)
                ),
                None => format!("{}: no run-time changes", ctl.display()),
            }
        } else {
            format!("{}: no control block yet", ctl.display())
        };
        lines.push(line);
    }
    Ok(lines)
}

fn describe(s: &ControlSettings) -> String {
    let mut parts = Vec::new();
    for d in 0..MAX_DEVICES {
        let mut p = Vec::new();
        if let Some(sm) = s.sm_percent[d] {
            p.push(if sm == 0 || sm == 100 {
                "sm unlimited".to_string()
            } else {
                format!("sm {sm}%")
            });
        }
        if let Some(m) = s.memory_limit[d] {
            p.push(if m == 0 {
                "memory unlimited".to_string()
            } else {
                format!("memory {}", crate::units::bytes(m))
            });
        }
        if !p.is_empty() {
            parts.push(format!("device {d}: {}", p.join(", ")));
        }
    }
    if parts.is_empty() {
        "no overrides".into()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_values() {
        assert_eq!(parse_memory("4g"), Ok(4 << 30));
        assert_eq!(parse_memory("512M"), Ok(512 << 20));
        assert_eq!(parse_memory("none"), Ok(0));
        assert_eq!(parse_memory("0"), Ok(0));
        for bad in ["", "4x", "-1", "4.5g", "g", "99999999999999999999"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
    }
}
