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

use super::names::ContainerNames;

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
mod tests {
    //! Paths as they appear on real hosts. Where a sample comes from public code, the repository and
    //! file are named above it.

    use proptest::prelude::*;

    use super::*;
    use crate::identity::names::{ContainerNames, PodNames};

    fn id(s: &str) -> ContainerId {
        ContainerId::parse(s).expect("a 64-hex sample id")
    }

    fn uid(s: &str) -> PodUid {
        PodUid::parse(s).expect("a sample pod uid")
    }

    fn container(path: &str) -> (Option<Runtime>, Option<ContainerId>, Option<CgroupDriver>) {
        let c = ContainerIdentity::from_path(path);
        (c.runtime, c.container_id, c.cgroup_driver)
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (docker_cgroupfs).
    #[test]
    fn docker_cgroupfs() {
        let c = ContainerIdentity::from_path(
            "/docker/7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8",
        );
        assert_eq!(c.runtime, Some(Runtime::Docker));
        assert_eq!(
            c.container_id,
            Some(id(
                "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8"
            ))
        );
        assert_eq!(c.cgroup_driver, Some(CgroupDriver::Cgroupfs));
        assert_eq!(c.pod, None);
        assert_eq!(c.host_unit, None);
        assert_eq!(c.display_name(None), "docker 7951fb549ab9");
    }

    // neuvector/neuvector, share/system/cgroup_test.go (TestDockerIDCentOS): docker's systemd driver.
    #[test]
    fn docker_systemd() {
        let c = ContainerIdentity::from_path(
            "/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope",
        );
        assert_eq!(
            (c.runtime, c.container_id, c.cgroup_driver),
            (
                Some(Runtime::Docker),
                Some(id(
                    "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"
                )),
                Some(CgroupDriver::Systemd)
            )
        );
    }

    // Kubernetes, systemd driver, containerd. The shape is the kubelet's (pod slice named after the
    // UID with `_`), the sample from a kubelet test table quoted in public code.
    #[test]
    fn containerd_kubernetes_systemd_burstable() {
        let c = ContainerIdentity::from_path(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod48d25824_cbe2_4fdc_9928_5bb49e05473d.slice/cri-containerd-c40dff48f1d53c3f07a50aa12bb9ae0e58c0927dc6b1d77e3f166784722642ad.scope",
        );
        assert_eq!(c.runtime, Some(Runtime::Containerd));
        assert_eq!(
            c.container_id,
            Some(id(
                "c40dff48f1d53c3f07a50aa12bb9ae0e58c0927dc6b1d77e3f166784722642ad"
            ))
        );
        assert_eq!(
            c.pod,
            Some(PodIdentity {
                uid: uid("48d25824-cbe2-4fdc-9928-5bb49e05473d"),
                qos: QosClass::Burstable
            })
        );
        assert_eq!(
            c.pod.as_ref().unwrap().uid.as_str(),
            "48d25824-cbe2-4fdc-9928-5bb49e05473d"
        );
        assert_eq!(c.cgroup_driver, Some(CgroupDriver::Systemd));
        assert_eq!(c.display_name(None), "pod 48d25824/c40dff48f1d5");
    }

    // CJLove/rt-operator, notes/cgroupv1_notes.md: Guaranteed pods have no QoS level
    // (`kubepods.slice/kubepods-podXXX.slice/...`); ids here from the sample above.
    #[test]
    fn containerd_kubernetes_systemd_guaranteed() {
        let c = ContainerIdentity::from_path(
            "/kubepods.slice/kubepods-pod48d25824_cbe2_4fdc_9928_5bb49e05473d.slice/cri-containerd-c40dff48f1d53c3f07a50aa12bb9ae0e58c0927dc6b1d77e3f166784722642ad.scope",
        );
        assert_eq!(c.pod.map(|p| p.qos), Some(QosClass::Guaranteed));
        assert_eq!(c.runtime, Some(Runtime::Containerd));
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (containerd_cgroupfs).
    #[test]
    fn containerd_kubernetes_cgroupfs_besteffort() {
        let c = ContainerIdentity::from_path(
            "/kubepods/besteffort/podac04f3f2-1f2c-11e9-b015-1ebee232acfa/605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
        );
        assert_eq!(
            c.pod,
            Some(PodIdentity {
                uid: uid("ac04f3f2-1f2c-11e9-b015-1ebee232acfa"),
                qos: QosClass::BestEffort
            })
        );
        assert_eq!(c.runtime, Some(Runtime::Containerd));
        assert_eq!(c.cgroup_driver, Some(CgroupDriver::Cgroupfs));
        assert_eq!(
            c.container_id.as_ref().map(ContainerId::short),
            Some("605439acbd4f")
        );
    }

    // CJLove/rt-operator, notes/cgroupv1_notes.md (K3s: `kubepods/podXXXXX/YYYYYYYYY/` for
    // Guaranteed pods); ids from the sample above.
    #[test]
    fn containerd_kubernetes_cgroupfs_guaranteed_and_burstable() {
        let guaranteed = ContainerIdentity::from_path(
            "/kubepods/podac04f3f2-1f2c-11e9-b015-1ebee232acfa/605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
        );
        assert_eq!(guaranteed.pod.map(|p| p.qos), Some(QosClass::Guaranteed));
        let burstable = ContainerIdentity::from_path(
            "/kubepods/burstable/podac04f3f2-1f2c-11e9-b015-1ebee232acfa/605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
        );
        assert_eq!(burstable.pod.map(|p| p.qos), Some(QosClass::Burstable));
        assert!(burstable.container_id.is_some());
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (crio_systemd, crio_cgroupfs).
    #[test]
    fn crio_systemd_and_cgroupfs() {
        let systemd = ContainerIdentity::from_path(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod63b3ebfc_2890_11e9_8154_16bf8ef8d9dc.slice/crio-17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f.scope",
        );
        assert_eq!(systemd.runtime, Some(Runtime::CriO));
        assert_eq!(
            systemd.container_id,
            Some(id(
                "17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f"
            ))
        );
        assert_eq!(
            systemd.pod.as_ref().map(|p| (p.uid.as_str(), p.qos)),
            Some(("63b3ebfc-2890-11e9-8154-16bf8ef8d9dc", QosClass::BestEffort))
        );
        let cgroupfs = ContainerIdentity::from_path(
            "/kubepods/besteffort/pod63b3ebfc-2890-11e9-8154-16bf8ef8d9dc/crio-73bfe475650de66df8e2affdc98d440dcbe84f8df83b6f75a68a82eb7026136a",
        );
        assert_eq!(
            (cgroupfs.runtime, cgroupfs.cgroup_driver),
            (Some(Runtime::CriO), Some(CgroupDriver::Cgroupfs))
        );
        assert_eq!(
            cgroupfs.container_id.as_ref().map(ContainerId::short),
            Some("73bfe475650d")
        );
    }

    // CRI-O puts conmon in `crio-conmon-<id>.scope` beside the container (cri-o's
    // internal/oci/runtime_oci.go, `createConmonUnitName`): it is the pod's, not the container's.
    #[test]
    fn crio_conmon_is_not_the_container() {
        let c = ContainerIdentity::from_path(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod63b3ebfc_2890_11e9_8154_16bf8ef8d9dc.slice/crio-conmon-17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f.scope",
        );
        assert_eq!(c.container_id, None);
        assert_eq!(c.runtime, None);
        assert_eq!(
            c.pod.as_ref().map(|p| p.uid.as_str()),
            Some("63b3ebfc-2890-11e9-8154-16bf8ef8d9dc")
        );
        assert!(c.is_containerised());
        assert_eq!(c.display_name(None), "pod 63b3ebfc");
        assert_eq!(c.key(), ContainerKey::Cgroup(c.cgroup_path.clone()));
    }

    // podman inspect's `CgroupPath` as printed in a public podman fixture; the `container` child is
    // what podman makes when systemd runs inside (falcosecurity/plugins' podman matcher lists
    // `/libpod-<id>.scope/container`).
    #[test]
    fn podman() {
        let path = "/machine.slice/libpod-55ea3863351726184e26ca7418f577d04c96dac0009e1f088f6c0c7a1dc2ed7c.scope";
        let expected = (
            Some(Runtime::Podman),
            Some(id(
                "55ea3863351726184e26ca7418f577d04c96dac0009e1f088f6c0c7a1dc2ed7c",
            )),
            Some(CgroupDriver::Systemd),
        );
        assert_eq!(container(path), expected);
        assert_eq!(container(&format!("{path}/container")), expected);
        assert_eq!(
            container(
                "/machine.slice/libpod-conmon-55ea3863351726184e26ca7418f577d04c96dac0009e1f088f6c0c7a1dc2ed7c.scope"
            ),
            (None, None, None)
        );
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (containerd, containerd_namespaced)
    // and containerd's default namespace `default`; a 64-hex id as `ctr run` generates it.
    #[test]
    fn containerd_without_kubernetes() {
        let c = ContainerIdentity::from_path(
            "/default/605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
        );
        assert_eq!(c.runtime, Some(Runtime::Containerd));
        assert_eq!(c.pod, None);
        assert!(c.container_id.is_some());
        // `ctr run` accepts any name; a name that is not an id is no container id.
        let named = ContainerIdentity::from_path("/default/test_container");
        assert_eq!(named.container_id, None);
        assert_eq!(named.host_unit.as_deref(), Some("test_container"));
    }

    // kind runs each Kubernetes node as a docker container with the kubelet's cgroup root at
    // `/kubelet`; the inner path below is as a kubelet error log quoted in public code printed it
    // (`/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/...`). The node is
    // the container the runtime created: its pods are its own naming, shown, not believed (a tenant
    // can make the same path inside its own container).
    #[test]
    fn kind_node_inside_docker() {
        let c = ContainerIdentity::from_path(
            "/system.slice/docker-7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-poda45947e4_314c_4694_8f05_5e1425a02de4.slice/cri-containerd-abb37780fc913b3720641a4039186adb06f5d1de0229de0e8707f12e2fde5a21.scope",
        );
        assert_eq!(c.runtime, Some(Runtime::Docker));
        assert_eq!(
            c.container_id,
            Some(id(
                "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8"
            ))
        );
        assert_eq!(c.pod, None);
        assert_eq!(
            c.nested_claim.as_deref(),
            Some("kubelet-kubepods-burstable-poda45947e4_314c_4694_8f05_5e1425a02de4.slice")
        );
    }

    // Children of a container's cgroup stay the container's, whatever they are called.
    #[test]
    fn children_of_a_container_are_the_container() {
        let base = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod48d25824_cbe2_4fdc_9928_5bb49e05473d.slice/cri-containerd-c40dff48f1d53c3f07a50aa12bb9ae0e58c0927dc6b1d77e3f166784722642ad.scope";
        let outer = ContainerIdentity::from_path(base);
        for (child, claim) in [
            ("init.scope", None),
            ("container", None),
            // A child named like another container does not re-attribute the process.
            (
                "docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope",
                Some(
                    "docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope",
                ),
            ),
            (
                "kubepods-pod63b3ebfc_2890_11e9_8154_16bf8ef8d9dc.slice/crio-17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f.scope",
                Some("kubepods-pod63b3ebfc_2890_11e9_8154_16bf8ef8d9dc.slice"),
            ),
        ] {
            let c = ContainerIdentity::from_path(&format!("{base}/{child}"));
            assert_eq!(c.container_id, outer.container_id, "{child}");
            assert_eq!(c.pod, outer.pod, "{child}");
            assert_eq!(c.runtime, outer.runtime, "{child}");
            assert_eq!(c.nested_claim.as_deref(), claim, "{child}");
        }
    }

    /// A victim's coordinates (pod UID and container id) as a tenant can spell them below its own
    /// container, in each runtime's shapes.
    const VICTIM_POD: &str = "3d274242-8ee0-11e9-a8a6-1e68d864ef1a";
    const VICTIM_ID: &str = "abb37780fc913b3720641a4039186adb06f5d1de0229de0e8707f12e2fde5a21";
    const ATTACKER_ID: &str = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";

    /// The victim's own cgroup paths, and nested copies of them below an attacker's container made
    /// by every runtime and driver: each nested copy is the attacker's container, flagged.
    #[test]
    fn a_victims_path_nested_in_an_attackers_container_is_the_attackers() {
        let pod_sd = VICTIM_POD.replace('-', "_");
        let victim_paths = [
            format!("/kubepods/burstable/pod{VICTIM_POD}/{VICTIM_ID}"),
            format!("/kubepods/pod{VICTIM_POD}/{VICTIM_ID}"),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_sd}.slice/cri-containerd-{VICTIM_ID}.scope"
            ),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod_sd}.slice/crio-{VICTIM_ID}.scope"
            ),
            format!("/docker/{VICTIM_ID}"),
            format!("/system.slice/docker-{VICTIM_ID}.scope"),
            format!("/machine.slice/libpod-{VICTIM_ID}.scope"),
        ];
        let attacker_bases = [
            (
                format!("/system.slice/docker-{ATTACKER_ID}.scope"),
                Runtime::Docker,
            ),
            (format!("/docker/{ATTACKER_ID}"), Runtime::Docker),
            (
                format!("/machine.slice/libpod-{ATTACKER_ID}.scope"),
                Runtime::Podman,
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-pod48d25824_cbe2_4fdc_9928_5bb49e05473d.slice/cri-containerd-{ATTACKER_ID}.scope"
                ),
                Runtime::Containerd,
            ),
            (
                format!(
                    "/kubepods/besteffort/pod48d25824-cbe2-4fdc-9928-5bb49e05473d/{ATTACKER_ID}"
                ),
                Runtime::Containerd,
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod48d25824_cbe2_4fdc_9928_5bb49e05473d.slice/crio-{ATTACKER_ID}.scope"
                ),
                Runtime::CriO,
            ),
        ];
        for victim in &victim_paths {
            let v = ContainerIdentity::from_path(victim);
            assert_eq!(v.container_id, Some(id(VICTIM_ID)), "{victim}");
            assert_eq!(v.nested_claim, None, "{victim}");
            for (base, runtime) in &attacker_bases {
                let a = ContainerIdentity::from_path(base);
                for nested in [format!("{base}{victim}"), format!("{base}/init{victim}")] {
                    let c = ContainerIdentity::from_path(&nested);
                    assert_eq!(c.container_id, Some(id(ATTACKER_ID)), "{nested}");
                    assert_eq!(c.runtime, Some(*runtime), "{nested}");
                    assert_eq!(c.pod, a.pod, "{nested}: the attacker's pod, if any");
                    assert_eq!(c.key(), a.key(), "{nested}");
                    assert!(c.nested_claim.is_some(), "{nested}: flagged");
                }
            }
        }
        // Through /proc/<pid>/cgroup, on a v1 host too: the most specific line is still the
        // attacker's.
        let text = format!(
            "12:memory:/docker/{ATTACKER_ID}/kubepods/pod{VICTIM_POD}/{VICTIM_ID}\n0::/docker/{ATTACKER_ID}/kubepods/pod{VICTIM_POD}/{VICTIM_ID}\n"
        );
        let c = ContainerIdentity::from_proc_cgroup(&text).unwrap();
        assert_eq!(c.container_id, Some(id(ATTACKER_ID)));
        assert_eq!(c.pod, None);
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (containerd_unknown): runc's
    // `slice:prefix:name` form.
    #[test]
    fn runc_systemd_colon_form() {
        let c = ContainerIdentity::from_path(
            "/kubepods-burstable-podbd12dd3393227d950605a2444b13c27a.slice:cri-containerd:d52db56a9c80d536a91354c0951c061187ca46249e64865a12703003d8f42366",
        );
        assert_eq!(c.runtime, Some(Runtime::Containerd));
        assert_eq!(
            c.container_id.as_ref().map(ContainerId::short),
            Some("d52db56a9c80")
        );
        // A static pod's UID is the 32-hex hash of its manifest.
        assert_eq!(
            c.pod.map(|p| p.uid),
            Some(uid("bd12dd3393227d950605a2444b13c27a"))
        );
    }

    // falcosecurity/plugins, plugins/container/test/matchers.cpp (non_container_cgroup).
    #[test]
    fn host_processes() {
        let session = ContainerIdentity::from_path(
            "/user.slice/user-1000.slice/user@1000.service/init.scope",
        );
        assert!(!session.is_containerised());
        assert_eq!(session.host_unit.as_deref(), Some("user@1000.service"));
        assert_eq!(session.display_name(None), "user@1000.service");
        let root = ContainerIdentity::from_path("/");
        assert_eq!(root.host_unit, None);
        assert_eq!(root.display_name(None), "host");
        assert_eq!(root.key(), ContainerKey::Cgroup("/".into()));
    }

    // A cgroup v2 host: one `0::` line.
    #[test]
    fn proc_cgroup_v2() {
        let c = ContainerIdentity::from_proc_cgroup(
        "0::/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope\n",
    )
    .unwrap();
        assert_eq!(c.runtime, Some(Runtime::Docker));
        assert_eq!(
            c.key(),
            ContainerKey::Container(id(
                "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"
            ))
        );
    }

    // A cgroup v1 host. Lines from the Datadog tracer's ContainerInfoTest, as vendored in
    // open-telemetry/opentelemetry-java-instrumentation (dd-trace-ot/src/test/groovy/datadog/
    // opentracing/ContainerInfoTest.groovy).
    #[test]
    fn proc_cgroup_v1() {
        let text = "\
11:perf_event:/kubepods/besteffort/pod3d274242-8ee0-11e9-a8a6-1e68d864ef1a/3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1
9:memory:/kubepods/besteffort/pod3d274242-8ee0-11e9-a8a6-1e68d864ef1a/3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1
8:cpu,cpuacct:/kubepods/besteffort/pod3d274242-8ee0-11e9-a8a6-1e68d864ef1a/3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1
1:name=systemd:/kubepods/besteffort/pod3d274242-8ee0-11e9-a8a6-1e68d864ef1a/3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1
";
        let c = ContainerIdentity::from_proc_cgroup(text).unwrap();
        assert_eq!(
            c.container_id,
            Some(id(
                "3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1"
            ))
        );
        assert_eq!(
            c.pod.map(|p| (p.uid, p.qos)),
            Some((
                uid("3d274242-8ee0-11e9-a8a6-1e68d864ef1a"),
                QosClass::BestEffort
            ))
        );
        let docker = ContainerIdentity::from_proc_cgroup(
        "13:name=systemd:/docker/3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860\n",
    )
    .unwrap();
        assert_eq!(docker.runtime, Some(Runtime::Docker));
    }

    // A hybrid host where the v2 line is `/` (a process entered with `runc exec`) or a session scope
    // while the v1 controllers name the container (v1 lines: neuvector/neuvector,
    // share/system/cgroup_test.go, TestDockerIDCentOS): the most specific line wins.
    #[test]
    fn proc_cgroup_hybrid_prefers_the_most_specific_line() {
        let v1 = "\
10:devices:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope
8:memory:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope
1:name=systemd:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope
";
        for v2 in ["0::/\n", "0::/user.slice/user-0.slice/session-3.scope\n"] {
            let c = ContainerIdentity::from_proc_cgroup(&format!("{v1}{v2}")).unwrap();
            assert_eq!(
                c.container_id,
                Some(id(
                    "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"
                )),
                "{v2}"
            );
        }
        // Equally specific lines: the v2 line is the one reported.
        let c = ContainerIdentity::from_proc_cgroup(
            "4:memory:/system.slice/cron.service\n0::/system.slice/ssh.service\n",
        )
        .unwrap();
        assert_eq!(c.cgroup_path, "/system.slice/ssh.service");
        // A v1-only host process at the root everywhere.
        let root = ContainerIdentity::from_proc_cgroup("4:memory:/\n1:name=systemd:/\n").unwrap();
        assert_eq!(root.cgroup_path, "/");
        assert_eq!(ContainerIdentity::from_proc_cgroup("garbage\n"), None);
        assert_eq!(ContainerIdentity::from_proc_cgroup(""), None);
    }

    #[test]
    fn ids_and_uids_are_validated() {
        assert!(ContainerId::parse(&"a".repeat(64)).is_some());
        assert!(ContainerId::parse(&"a".repeat(63)).is_none());
        assert!(ContainerId::parse(&"A".repeat(64)).is_none());
        assert!(ContainerId::parse(&"g".repeat(64)).is_none());
        assert_eq!(
            PodUid::parse("3D274242_8EE0_11E9_A8A6_1E68D864EF1A").map(|u| u.to_string()),
            Some("3d274242-8ee0-11e9-a8a6-1e68d864ef1a".into())
        );
        assert!(PodUid::parse("3d274242-8ee0-11e9-a8a6").is_none());
        assert!(PodUid::parse("3d2742428ee011e9a8a61e68d864ef1a00").is_none());
        // Slices that look like pods but have no valid UID are not pods.
        let c = ContainerIdentity::from_path("/kubepods.slice/kubepods-podnotauid.slice");
        assert_eq!(c.pod, None);
    }

    #[test]
    fn display_names_from_the_runtime() {
        let c = ContainerIdentity::from_path(
            "/kubepods/besteffort/podac04f3f2-1f2c-11e9-b015-1ebee232acfa/605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
        );
        let k8s = ContainerNames {
            container_name: Some("trainer".into()),
            pod: Some(PodNames {
                namespace: "ml".into(),
                name: "resnet-0".into(),
            }),
        };
        assert_eq!(c.display_name(Some(&k8s)), "ml/resnet-0/trainer");
        let pod_only = ContainerNames {
            container_name: None,
            ..k8s
        };
        assert_eq!(c.display_name(Some(&pod_only)), "ml/resnet-0/605439acbd4f");
        let docker = ContainerNames {
            container_name: Some("jupyter".into()),
            pod: None,
        };
        assert_eq!(c.display_name(Some(&docker)), "jupyter");
    }

    proptest! {
        // A container can name its cgroup children anything: no input panics, and an id is an id.
        #[test]
        fn any_path_parses_without_panic(path in ".{0,300}") {
            let c = ContainerIdentity::from_path(&path);
            if let Some(id) = &c.container_id {
                prop_assert_eq!(id.as_str().len(), 64);
                prop_assert!(id.as_str().bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            }
            let _ = c.display_name(None);
            let _ = ContainerIdentity::from_proc_cgroup(&path);
        }

        #[test]
        fn structured_hostile_paths_parse(
            segments in proptest::collection::vec(
                prop_oneof![
                    Just("kubepods.slice".to_owned()),
                    Just("kubepods".to_owned()),
                    Just("burstable".to_owned()),
                    Just("..".to_owned()),
                    "(kubepods-(burstable-)?pod|pod)[0-9a-f_-]{0,40}(\\.slice)?",
                    "(cri-containerd-|crio-|crio-conmon-|docker-|libpod-)?[0-9a-f]{60,68}(\\.scope)?",
                    "[a-z:._-]{0,20}",
                ],
                0..8,
            )
        ) {
            let path = format!("/{}", segments.join("/"));
            let c = ContainerIdentity::from_path(&path);
            if let Some(id) = &c.container_id {
                prop_assert!(ContainerId::parse(id.as_str()).is_some());
            }
            if let Some(pod) = &c.pod {
                prop_assert!(PodUid::parse(pod.uid.as_str()).is_some());
                prop_assert!(!pod.uid.as_str().contains('_'));
            }
            let text = format!("1:name=systemd:{path}\n0::{path}\n");
            prop_assert!(ContainerIdentity::from_proc_cgroup(&text).is_some());
        }
    }
}
