//! `vgpu-agent limit set|show`: run-time limit changes through the control block beside a
//! container's region (`region::control`). The agent writes only the control block, never the
//! accounting region; the container's limiter applies the change at its next CUDA call.
//!
//! Everything here runs as root on files a container controls, so (docs/security.md):
//! - a container's regions are the files its processes map, opened through the kernel's
//!   reference to the mapping (`/proc/<pid>/map_files`) and used only if they are the file
//!   `/proc/<pid>/maps` names; the control block beside one is opened in the same directory,
//!   resolved inside the process's root (`tenant_fs`);
//! - `--region` takes the operator's path: `/proc/<pid>/root/...` is resolved inside that
//!   process's root, any other path must have no symbolic link in it;
//! - a control block is written only if it already exists as a regular file of exactly its size
//!   with one link; it is never created, resized or followed. `show` opens it read-only.
//!   Anything else is refused with an error naming the container (or region) and the reason.

use agent_common::MAX_DEVICES;
use std::{
    collections::HashSet,
    ffi::OsString,
    path::{Path, PathBuf},
};

use region::{
    ControlError, ControlSettings, ControlSnapshot, ControlWriter, FreezeMark, read_control,
};
use tenant_fs::{Access, FileKey, Root, TenantFile, TenantFsError};

use crate::{
    collector::regions::{Format, mapped_files, sniff},
    identity::container::ContainerIdentity,
};

/// Bytes of `/proc/<pid>/cgroup` read (a few hundred in practice).
const MAX_CGROUP_BYTES: usize = 64 << 10;

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
    #[error("nothing to set: give --sm, --memory, --tier and/or --guarantee")]
    NothingToSet,
    #[error("{}", refused_message(.target, .refused, .done))]
    Refused {
        /// The container (or region) the command named.
        target: String,
        /// Each control block not used: its path and why.
        refused: Vec<(PathBuf, String)>,
        /// What was done for the other regions of the target.
        done: Vec<String>,
    },
    #[error(transparent)]
    Open(#[from] TenantFsError),
}

fn refused_message(target: &str, refused: &[(PathBuf, String)], done: &[String]) -> String {
    let mut m = String::new();
    for (path, why) in refused {
        if !m.is_empty() {
            m.push('\n');
        }
        m += &format!("{target}: control block {} refused: {why}", path.display());
    }
    if !done.is_empty() {
        m += &format!(
            "\n(the other regions of {target} were handled: {})",
            done.join("; ")
        );
    }
    m
}

/// Where to apply a change.
pub enum Target {
    Container(String),
    Region(PathBuf),
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Container(id) => format!("container {id}"),
            Target::Region(p) => format!("region {}", p.display()),
        }
    }
}

/// Parses a memory limit as the limiter parses `CUDA_DEVICE_MEMORY_LIMIT`
/// (`limiter_core::config::parse_bytes`: bytes with an optional binary suffix k, m, g, t), or
/// `0`/`none` for no limit.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    limiter_core::config::parse_bytes(s).map_err(|e| {
        format!(
            "{s:?}: {e} (expected bytes with an optional k, m, g or t suffix, e.g. 4g, or none)"
        )
    })
}

/// A region found for a target: the directory holding it (an anchor that the control block is
/// opened in), its file name and identity.
pub struct FoundRegion {
    /// How the region is shown.
    pub path: PathBuf,
    dir: Root,
    name: OsString,
    key: FileKey,
}

impl FoundRegion {
    /// The control block's name beside the region (`<region>.ctl`).
    fn control_name(&self) -> OsString {
        let mut n = self.name.clone();
        n.push(".ctl");
        n
    }

    /// How the control block is shown.
    pub fn control_path(&self) -> PathBuf {
        region::control_path(&self.path)
    }

    /// Opens the control block beside the region: the region's name in that directory must
    /// still be the region found (else the directory is not the region's any more), and the
    /// control block must be on the region's own filesystem, not mounted over.
    pub fn open_control(&self, access: Access) -> Result<TenantFile, TenantFsError> {
        self.open_region()?;
        // Opened for writing, a control block is resolved without crossing a mount point (a
        // tenant's bind mount over it is refused), and it must sit on its region's filesystem.
        let control = self.dir.open(Path::new(&self.control_name()), access)?;
        if control.key().dev != self.key.dev {
            return Err(TenantFsError::MountCrossed {
                path: control.path().to_owned(),
            });
        }
        Ok(control)
    }
}

impl FoundRegion {
    /// Opens the region itself read-only, if its name in its directory is still the region
    /// found.
    pub fn open_region(&self) -> Result<TenantFile, TenantFsError> {
        let region = self.dir.open(Path::new(&self.name), Access::Read)?;
        if region.key() != self.key {
            return Err(TenantFsError::Replaced {
                path: self.path.clone(),
                expected: self.key,
                found: region.key(),
            });
        }
        Ok(region)
    }
}

/// Splits `inside` into its directory, opened in `root`, and its file name.
fn region_in(root: &Root, inside: &Path, shown: PathBuf, key: FileKey) -> Option<FoundRegion> {
    let name = inside.file_name()?.to_owned();
    let parent = inside.parent().unwrap_or(Path::new("/"));
    let dir = root.open_dir(parent).ok()?;
    Some(FoundRegion {
        path: shown,
        dir,
        name,
        key,
    })
}

/// The region at an operator's path.
fn region_at(proc: &Path, p: &Path) -> Result<FoundRegion, LimitError> {
    let not_a_region = || LimitError::NotARegion(p.to_owned());
    let file = match tenant_fs::open_operator_path(proc, p, Access::Read) {
        Ok(f) => f,
        Err(TenantFsError::NotFound { .. }) => return Err(not_a_region()),
        Err(e) => return Err(e.into()),
    };
    if sniff(&file) != Some(Format::Vgpu) {
        return Err(not_a_region());
    }
    let name = p.file_name().ok_or_else(not_a_region)?.to_owned();
    let dir = match tenant_fs::split_process_root(proc, p) {
        Some((pid, inside)) => {
            Root::process(proc, pid)?.open_dir(inside.parent().unwrap_or(Path::new("/")))?
        }
        None => Root::dir_no_links(p.parent().unwrap_or(Path::new("/")))?,
    };
    Ok(FoundRegion {
        path: p.to_owned(),
        dir,
        name,
        key: file.key(),
    })
}

/// The regions of `target`: the file itself, or those the container's processes map.
pub fn regions(target: &Target, proc: &Path) -> Result<Vec<FoundRegion>, LimitError> {
    match target {
        Target::Region(p) => Ok(vec![region_at(proc, p)?]),
        Target::Container(id) => {
            let out: Vec<FoundRegion> =
                container_regions(proc, |c| !id.is_empty() && c.starts_with(id.as_str()))
                    .into_iter()
                    .map(|(_, r)| r)
                    .collect();
            if out.is_empty() {
                return Err(LimitError::NoRegion(id.clone()));
            }
            Ok(out)
        }
    }
}

/// The regions that processes of containers whose id `wanted` accepts map, each with the id of
/// the container of the first process found mapping it.
pub fn container_regions(proc: &Path, wanted: impl Fn(&str) -> bool) -> Vec<(String, FoundRegion)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let pids = std::fs::read_dir(proc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids {
        let path = proc.join(pid.to_string()).join("cgroup");
        let Ok((cg, _)) = tenant_fs::read_proc(&path, MAX_CGROUP_BYTES) else {
            continue;
        };
        let Some(container) = ContainerIdentity::from_proc_cgroup(&String::from_utf8_lossy(&cg))
            .and_then(|i| i.container_id)
            .map(|c| c.as_str().to_owned())
            .filter(|c| wanted(c))
        else {
            continue;
        };
        for r in mapped_regions(proc, pid, &mut seen) {
            out.push((container.clone(), r));
        }
    }
    out
}

/// The regions the process `pid` maps (`freeze --pid` reads its slot there).
pub fn process_regions(proc: &Path, pid: u32) -> Vec<FoundRegion> {
    mapped_regions(proc, pid, &mut HashSet::new())
}

/// The regions the process `pid` maps that are not in `seen` (added to it).
fn mapped_regions(proc: &Path, pid: u32, seen: &mut HashSet<FileKey>) -> Vec<FoundRegion> {
    let mut out = Vec::new();
    let Ok(root) = Root::process(proc, pid) else {
        return out;
    };
    for m in mapped_files(proc, pid) {
        let key = m.map.key();
        if seen.contains(&key) {
            continue;
        }
        let Ok(file) =
            tenant_fs::open_mapped(proc, pid, m.map.range(), &m.map.path, key, Access::Read)
        else {
            continue;
        };
        if sniff(&file) != Some(Format::Vgpu) {
            continue;
        }
        let shown = root.shown(&m.map.path);
        if let Some(r) = region_in(&root, &m.map.path, shown, key) {
            seen.insert(key);
            out.push(r);
        }
    }
    out
}

/// Runs `each` on every region of `target`; a refusal of one region does not keep the others
/// from being handled, and is returned after them.
fn for_each_region(
    target: &Target,
    mut each: impl FnMut(&FoundRegion) -> Result<String, String>,
) -> Result<Vec<String>, LimitError> {
    let mut lines = Vec::new();
    let mut refused = Vec::new();
    for region in regions(target, Path::new("/proc"))? {
        match each(&region) {
            Ok(line) => lines.push(line),
            Err(why) => refused.push((region.control_path(), why)),
        }
    }
    if refused.is_empty() {
        Ok(lines)
    } else {
        Err(LimitError::Refused {
            target: target.label(),
            refused,
            done: lines,
        })
    }
}

fn control_error(e: ControlError) -> String {
    e.to_string()
}

/// A change of a container's QoS tier (docs/qos.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosChange {
    /// Back to the tier of the container's environment (the override removed).
    Env,
    /// No tier, whatever the environment says.
    None,
    Latency,
    /// Guaranteed this share, percent (1 to 100).
    Guaranteed(u8),
    BestEffort,
}

impl QosChange {
    /// From `--tier` and `--guarantee`: a guarantee alone means the guaranteed tier.
    pub fn from_args(tier: Option<&str>, guarantee: Option<u8>) -> Result<Option<Self>, String> {
        Ok(Some(match (tier, guarantee) {
            (None, None) => return Ok(None),
            (None | Some("guaranteed"), Some(g)) => QosChange::Guaranteed(g),
            (Some("guaranteed"), None) => {
                return Err("--tier guaranteed needs --guarantee PERCENT".into());
            }
            (Some(t), Some(_)) => {
                return Err(format!(
                    "--guarantee goes with the guaranteed tier, not {t}"
                ));
            }
            (Some("latency"), None) => QosChange::Latency,
            (Some("best-effort"), None) => QosChange::BestEffort,
            (Some("none"), None) => QosChange::None,
            (Some("env"), None) => QosChange::Env,
            (Some(t), None) => {
                return Err(format!(
                    "--tier {t:?}: expected latency, guaranteed, best-effort, none or env"
                ));
            }
        }))
    }

    /// The control block's override.
    fn word(self) -> Option<(u8, u16)> {
        match self {
            QosChange::Env => None,
            QosChange::None => Some((0, 0)),
            QosChange::Latency => Some((1, 0)),
            QosChange::Guaranteed(g) => Some((2, u16::from(g) * 10)),
            QosChange::BestEffort => Some((3, 0)),
        }
    }
}

/// Writes the change into each region's control block; returns a line per region.
pub fn set(
    target: &Target,
    device: Option<u32>,
    sm: Option<u8>,
    memory: Option<u64>,
    qos: Option<QosChange>,
) -> Result<Vec<String>, LimitError> {
    if sm.is_none() && memory.is_none() && qos.is_none() {
        return Err(LimitError::NothingToSet);
    }
    if let Some(d) = device
        && d as usize >= MAX_DEVICES
    {
        return Err(LimitError::Device(d));
    }
    for_each_region(target, |region| {
        let file =
            region.open_control(Access::ReadWrite).map_err(|e| {
                match e {
            TenantFsError::NotFound { .. } => {
                "it does not exist (the limiter creates it when it starts; the agent never does)"
                    .to_string()
            }
            e => e.to_string(),
        }
            })?;
        let writer = ControlWriter::new(&file).map_err(control_error)?;
        let generation = writer
            .update(|s| {
                if let Some(q) = qos {
                    s.qos = q.word();
                }
                let devices = device.map_or(0..MAX_DEVICES, |d| d as usize..d as usize + 1);
                for d in devices {
                    if let Some(p) = sm {
                        s.sm_percent[d] = Some(p);
                    }
                    if let Some(m) = memory {
                        s.memory_limit[d] = Some(m);
                    }
                }
            })
            .map_err(control_error)?;
        let now = writer.snapshot().map_err(control_error)?;
        Ok(format!(
            "{}: generation {generation}: {}",
            region.control_path().display(),
            describe(&now.map(|s| s.settings).unwrap_or_default())
        ))
    })
}

/// The overrides of each region's control block, a line per region (read-only).
pub fn show(target: &Target) -> Result<Vec<String>, LimitError> {
    for_each_region(target, |region| {
        let ctl = region.control_path();
        let file = match region.open_control(Access::Read) {
            Ok(f) => f,
            Err(TenantFsError::NotFound { .. }) => {
                return Ok(format!("{}: no control block yet", ctl.display()));
            }
            Err(e) => return Err(e.to_string()),
        };
        let snap: Option<ControlSnapshot> = read_control(&file).map_err(control_error)?;
        Ok(match snap {
            Some(s) => format!(
                "{}: generation {}: {}",
                ctl.display(),
                s.generation,
                describe(&s.settings)
            ),
            None => format!("{}: no run-time changes", ctl.display()),
        })
    })
}

/// How a freeze mark is said.
pub(crate) fn mark_name(mark: FreezeMark) -> &'static str {
    match mark {
        FreezeMark::Running => "not frozen",
        FreezeMark::Freezing => "freezing",
        FreezeMark::Frozen => "frozen",
        FreezeMark::InProcess => "frozen (in-process)",
    }
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
    if let Some((tier, guarantee)) = s.qos {
        parts.push(match tier {
            1 => "QoS tier latency".to_string(),
            2 => format!("QoS tier guaranteed {}%", guarantee.div_ceil(10)),
            3 => "QoS tier best-effort".to_string(),
            _ => "no QoS tier".to_string(),
        });
    }
    if s.freeze != FreezeMark::Running {
        parts.push(mark_name(s.freeze).into());
    }
    if parts.is_empty() {
        "no overrides".into()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tier_arguments_make_one_change_or_a_clear_error() {
        use super::QosChange as Q;
        assert_eq!(Q::from_args(None, None), Ok(None));
        assert_eq!(Q::from_args(None, Some(30)), Ok(Some(Q::Guaranteed(30))));
        assert_eq!(
            Q::from_args(Some("guaranteed"), Some(70)),
            Ok(Some(Q::Guaranteed(70)))
        );
        assert_eq!(Q::from_args(Some("latency"), None), Ok(Some(Q::Latency)));
        assert_eq!(
            Q::from_args(Some("best-effort"), None),
            Ok(Some(Q::BestEffort))
        );
        assert_eq!(Q::from_args(Some("none"), None), Ok(Some(Q::None)));
        assert_eq!(Q::from_args(Some("env"), None), Ok(Some(Q::Env)));
        assert!(Q::from_args(Some("guaranteed"), None).is_err());
        assert!(Q::from_args(Some("latency"), Some(5)).is_err());
        assert!(Q::from_args(Some("gold"), None).is_err());
        assert_eq!(Q::Guaranteed(30).word(), Some((2, 300)));
        assert_eq!(Q::Env.word(), None);
        assert_eq!(Q::None.word(), Some((0, 0)));
    }

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
