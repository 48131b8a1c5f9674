//! Which container (and Kubernetes pod) a process belongs to, read from its cgroup paths.
//!
//! Container runtimes name the cgroup of a container after its id, and the kubelet names pod
//! cgroups after the pod UID and QoS class. The shapes handled here:
//!
//! | runtime, driver | path (relative to the cgroup root) |
//! |---|---|
//! | docker, cgroupfs | `/docker/<id>` |
//! | docker, systemd | `/system.slice/docker-<id>.scope` |
//! | kubelet, systemd | `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/<runtime>-<id>.scope` (Guaranteed pods: `/kubepods.slice/kubepods-pod<uid>.slice/...`) |
//! | kubelet, cgroupfs | `/kubepods/<qos>/pod<uid>/<id>` (Guaranteed: `/kubepods/pod<uid>/<id>`; cri-o: `crio-<id>`) |
//! | containerd without Kubernetes | `/<namespace>/<id>`, e.g. `/default/<id>` |
//! | podman | `/machine.slice/libpod-<id>.scope` (and a `container` child when systemd runs inside) |
//!
//! with `<runtime>` one of `cri-containerd`, `crio`, `docker`. `crio-conmon-<id>.scope` and
//! `libpod-conmon-<id>.scope` hold the runtime's monitor process, not the container.
//!
//! # Which segment wins
//!
//! A path is read from the root down. The first (outermost) container segment found names the
//! container: that is the cgroup the runtime created. Anything below it is the container's own
//! business (`init.scope`, `container`, or whatever a process that can write to its cgroup tree
//! creates) and never changes the identity, so a container cannot pass its processes off as
//! another container's or pod's by naming a child cgroup like one (`kubepods/pod<uid>/<id>`,
//! `docker/<id>`, `libpod-<id>.scope`). Such a segment below a container's is kept as
//! [`ContainerIdentity::nested_claim`] and shown, not believed. A Kubernetes node run inside a
//! container (kind) is therefore one container, whose pods are named in its processes' cgroup
//! paths.
//!
//! # Which line wins (v1, v2 and hybrid hosts)
//!
//! `/proc/<pid>/cgroup` has one `0::<path>` line on a cgroup v2 host, one line per v1 hierarchy on
//! a v1 host, and both on a hybrid host, where the v2 line may say `/` or a session scope while
//! the v1 controllers place the process in its container (processes entered with `runc exec`
//! historically stayed in the caller's v2 cgroup). Every line is parsed and the most specific
//! identity wins: a container id beats a pod without a container, which beats a non-root path,
//! which beats `/`. On a tie the v2 line wins (it is the hierarchy eBPF's cgroup id refers to),
//! then the earlier line.

use std::fmt;

use serde::Serialize;

use super::runtime_names::ContainerNames;

/// The engine that created a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Docker,
    Containerd,
    #[serde(rename = "cri-o")]
    CriO,
    Podman,
    Unknown,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
            Runtime::Unknown => "container",
        })
    }
}

/// A container id: always 64 lowercase hexadecimal characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ContainerId(String);

impl ContainerId {
    pub const LEN: usize = 64;

    /// `Some` when `s` is exactly 64 lowercase hex digits.
    pub fn parse(s: &str) -> Option<ContainerId> {
        (s.len() == Self::LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| ContainerId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 12-character prefix `docker ps` shows.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pod UID in its canonical form: lowercase, with dashes (`3d274242-8ee0-11e9-a8a6-1e68d864ef1a`).
/// Static pods have a 32-hex config hash as their UID, which is kept as it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct PodUid(String);

impl PodUid {
    /// Accepts the UID with dashes (cgroupfs driver, `/var/log/pods`) or with underscores
    /// (systemd driver, where `-` separates slice levels), or a 32-hex static pod hash.
    pub fn parse(s: &str) -> Option<PodUid> {
        let normalised = s.to_ascii_lowercase().replace('_', "-");
        let b = normalised.as_bytes();
        let hex = |c: &u8| c.is_ascii_hexdigit();
        let uuid = b.len() == 36
            && b.iter().enumerate().all(|(i, c)| {
                if matches!(i, 8 | 13 | 18 | 23) {
                    *c == b'-'
                } else {
                    hex(c)
                }
            });
        let static_hash = b.len() == 32 && b.iter().all(hex);
        (uuid || static_hash).then_some(PodUid(normalised))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pod's Kubernetes QoS class, read from the level of the cgroup tree it sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct PodIdentity {
    pub uid: PodUid,
    pub qos: QosClass,
}

/// How the cgroup tree was laid out: by systemd units (`.slice`/`.scope`) or by plain directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Systemd,
    Cgroupfs,
}

/// Who a process is, as far as its cgroup tells.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContainerIdentity {
    /// The cgroup path the identity was read from.
    pub cgroup_path: String,
    pub runtime: Option<Runtime>,
    pub container_id: Option<ContainerId>,
    pub pod: Option<PodIdentity>,
    pub cgroup_driver: Option<CgroupDriver>,
    /// A container or pod segment found below the container's own cgroup (which the container
    /// can create): what the path claims, not believed; the identity is the outer container's.
    pub nested_claim: Option<String>,
    /// Outside containers and pods: the systemd unit or last path segment (`nginx.service`,
    /// `session-3.scope`); `None` at the root.
    pub host_unit: Option<String>,
}

/// What the agent groups processes by: the container when its id is known, else the cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerKey {
    Container(ContainerId),
    Cgroup(String),
}

impl ContainerIdentity {
    /// The identity of one cgroup path (relative to the cgroup root, as `/proc/<pid>/cgroup` and
    /// [`super::CgroupIndex::path_of`] give it). Never fails: unknown shapes are host cgroups.
    pub fn from_path(path: &str) -> ContainerIdentity {
        let mut walk = Walk::default();
        for segment in path.split('/').filter(|s| !s.is_empty() && *s != "..") {
            walk.step(segment);
        }
        let host_unit = if walk.container_id.is_none() && walk.pod.is_none() {
            host_unit_of(path)
        } else {
            None
        };
        ContainerIdentity {
            cgroup_path: path.to_owned(),
            runtime: walk.runtime,
            container_id: walk.container_id,
            pod: walk.pod,
            cgroup_driver: walk.driver,
            nested_claim: walk.nested_claim,
            host_unit,
        }
    }

    /// The identity from a whole `/proc/<pid>/cgroup` text, by the rule in the module docs.
    /// `None` when no line could be read.
    pub fn from_proc_cgroup(text: &str) -> Option<ContainerIdentity> {
        let mut best: Option<(u8, bool, ContainerIdentity)> = None;
        for line in text.lines() {
            // hierarchy-id:controllers:path; the path itself may contain ':'.
            let mut fields = line.splitn(3, ':');
            let (Some(hierarchy), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if !path.starts_with('/') {
                continue;
            }
            let is_v2 = hierarchy == "0" && controllers.is_empty();
            let identity = ContainerIdentity::from_path(path);
            let rank = identity.specificity();
            let better = match &best {
                None => true,
                Some((best_rank, best_v2, _)) => {
                    rank > *best_rank || (rank == *best_rank && is_v2 && !best_v2)
                }
            };
            if better {
                best = Some((rank, is_v2, identity));
            }
        }
        best.map(|(_, _, identity)| identity)
    }

    fn specificity(&self) -> u8 {
        if self.container_id.is_some() {
            3
        } else if self.pod.is_some() {
            2
        } else if self.host_unit.is_some() {
            1
        } else {
            0
        }
    }

    /// In a container or a pod (as opposed to a host service or session).
    pub fn is_containerised(&self) -> bool {
        self.container_id.is_some() || self.pod.is_some()
    }

    pub fn key(&self) -> ContainerKey {
        match &self.container_id {
            Some(id) => ContainerKey::Container(id.clone()),
            None => ContainerKey::Cgroup(self.cgroup_path.clone()),
        }
    }

    /// The name to show for this identity. With names from the runtime: `namespace/pod/container`
    /// for a Kubernetes container, the runtime's container name otherwise. Without them:
    /// `pod <uid prefix>/<id prefix>`, `<runtime> <id prefix>`, `pod <uid prefix>`, the host unit,
    /// or `host` for the root cgroup.
    pub fn display_name(&self, names: Option<&ContainerNames>) -> String {
        if let Some(names) = names {
            if let Some(pod) = &names.pod {
                let container = names
                    .container_name
                    .as_deref()
                    .or(self.container_id.as_ref().map(ContainerId::short))
                    .unwrap_or("?");
                return format!("{}/{}/{}", pod.namespace, pod.name, container);
            }
            if let Some(name) = &names.container_name {
                return name.clone();
            }
        }
        let uid_prefix = |p: &PodIdentity| p.uid.as_str()[..8].to_owned();
        match (&self.pod, &self.container_id) {
            (Some(pod), Some(id)) => format!("pod {}/{}", uid_prefix(pod), id.short()),
            (None, Some(id)) => {
                format!(
                    "{} {}",
                    self.runtime.unwrap_or(Runtime::Unknown),
                    id.short()
                )
            }
            (Some(pod), None) => format!("pod {}", uid_prefix(pod)),
            (None, None) => self.host_unit.clone().unwrap_or_else(|| "host".to_owned()),
        }
    }
}

/// The state of a walk down one path.
#[derive(Default)]
struct Walk {
    /// Segments seen so far (for context: parent names, the `kubepods` level).
    depth: usize,
    previous: Option<String>,
    in_kubepods: bool,
    qos_from_parent: Option<QosClass>,
    runtime: Option<Runtime>,
    container_id: Option<ContainerId>,
    pod: Option<PodIdentity>,
    driver: Option<CgroupDriver>,
    nested_claim: Option<String>,
    /// A container segment was found: what follows is the container's own subtree.
    inside_container: bool,
}

impl Walk {
    fn step(&mut self, segment: &str) {
        // runc's systemd form `slice:prefix:name`, seen verbatim in some v1 hierarchies.
        if let Some((slice, id)) = segment.split_once(":cri-containerd:") {
            self.step(slice);
            self.step(&format!("cri-containerd-{id}.scope"));
            return;
        }
        if self.inside_container {
            // The container's own subtree: a segment named like a pod or a container here is a
            // claim, never the identity.
            self.note_kubepods_level(segment);
            if self.nested_claim.is_none()
                && (self.pod_level(segment).is_some() || self.container_level(segment).is_some())
            {
                self.nested_claim = Some(segment.to_owned());
            }
        } else if let Some((pod, driver)) = self.pod_level(segment) {
            self.pod = Some(pod);
            self.driver = Some(driver);
        } else if let Some((runtime, id, driver)) = self.container_level(segment) {
            self.runtime = Some(runtime);
            self.container_id = Some(id);
            self.driver = Some(driver);
            self.inside_container = true;
            // A pod level below a container is the container's own naming.
            self.in_kubepods = false;
            self.qos_from_parent = None;
        } else {
            self.note_kubepods_level(segment);
        }
        self.previous = Some(segment.to_owned());
        self.depth += 1;
    }

    /// `kubepods`, `kubepods/burstable`, `kubepods.slice`, `kubelet-kubepods.slice` ...
    fn note_kubepods_level(&mut self, segment: &str) {
        if segment == "kubepods" || segment.ends_with("kubepods.slice") {
            self.in_kubepods = true;
            self.qos_from_parent = None;
        } else if self.in_kubepods && self.previous.as_deref() == Some("kubepods") {
            self.qos_from_parent = match segment {
                "burstable" => Some(QosClass::Burstable),
                "besteffort" => Some(QosClass::BestEffort),
                _ => None,
            };
        }
    }

    /// A pod's own cgroup: `kubepods-<qos>-pod<uid>.slice` or `pod<uid>` under `kubepods`.
    fn pod_level(&self, segment: &str) -> Option<(PodIdentity, CgroupDriver)> {
        if let Some(name) = segment.strip_suffix(".slice") {
            let at = name.rfind("-pod")?;
            let (prefix, uid) = (&name[..at], &name[at + 4..]);
            let qos = if prefix.ends_with("kubepods-burstable") {
                QosClass::Burstable
            } else if prefix.ends_with("kubepods-besteffort") {
                QosClass::BestEffort
            } else if prefix.ends_with("kubepods") {
                QosClass::Guaranteed
            } else {
                return None;
            };
            let uid = PodUid::parse(uid)?;
            return Some((PodIdentity { uid, qos }, CgroupDriver::Systemd));
        }
        if !self.in_kubepods {
            return None;
        }
        let uid = PodUid::parse(segment.strip_prefix("pod")?)?;
        let qos = self.qos_from_parent.unwrap_or(QosClass::Guaranteed);
        Some((PodIdentity { uid, qos }, CgroupDriver::Cgroupfs))
    }

    /// A container's cgroup: a runtime's shape around a valid 64-hex id.
    fn container_level(&self, segment: &str) -> Option<(Runtime, ContainerId, CgroupDriver)> {
        // Runtime helpers, not containers: their processes stay with the pod or the host.
        if segment.starts_with("crio-conmon-") || segment.starts_with("libpod-conmon-") {
            return None;
        }
        const SCOPES: [(&str, Runtime); 5] = [
            ("cri-containerd-", Runtime::Containerd),
            ("crio-", Runtime::CriO),
            ("docker-", Runtime::Docker),
            ("libpod-", Runtime::Podman),
            ("containerd-", Runtime::Containerd),
        ];
        for (prefix, runtime) in SCOPES {
            let Some(rest) = segment.strip_prefix(prefix) else {
                continue;
            };
            if let Some(id) = rest.strip_suffix(".scope") {
                return ContainerId::parse(id).map(|id| (runtime, id, CgroupDriver::Systemd));
            }
            // cgroupfs drivers of cri-o and podman name the directory without `.scope`.
            if matches!(runtime, Runtime::CriO | Runtime::Podman)
                && let Some(id) = ContainerId::parse(rest)
            {
                return Some((runtime, id, CgroupDriver::Cgroupfs));
            }
        }
        // A bare id: docker's cgroupfs driver, the kubelet's cgroupfs layout, or a containerd
        // namespace (`/default/<id>`, `/k8s.io/<id>`).
        let id = ContainerId::parse(segment)?;
        let runtime = match self.previous.as_deref() {
            Some("docker") => Runtime::Docker,
            // Before Kubernetes 1.24, dockershim made the same shape; containerd is what is
            // left today, and the names from /var/log/pods work for both.
            _ if self.pod.is_some() => Runtime::Containerd,
            Some(_) if self.depth == 1 => Runtime::Containerd,
            _ => Runtime::Unknown,
        };
        Some((runtime, id, CgroupDriver::Cgroupfs))
    }
}

/// The unit a host process runs in: the last `.service` segment, else the last segment.
fn host_unit_of(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    segments
        .iter()
        .rev()
        .find(|s| s.ends_with(".service"))
        .or(segments.last())
        .map(|s| (*s).to_owned())
}

#[cfg(test)]
mod tests;
