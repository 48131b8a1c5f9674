//! What tenants made the agent skip, gathered per tenant from the agent's status: driver-named
//! libraries not attached, warnings not kept, and processes whose maps were not read (left for a
//! later cycle by the budget, or whose read blocks). `stat` and `top` show these rows.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{AgentStatus, MapsBlocked};

/// One tenant's skips (a container id, or a cgroup path outside containers).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantSkips {
    pub tenant: String,
    /// Driver-named files its processes map that are not attached, by reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub libraries_skipped: BTreeMap<String, u64>,
    /// Its warnings not kept over the bound.
    pub warnings_suppressed: u64,
    /// Its processes due for a maps read that the last cycle left for later.
    pub maps_deferred: usize,
    /// Its processes whose maps read has not returned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub maps_blocked: Vec<MapsBlocked>,
}

impl TenantSkips {
    /// One line: `libraries skipped 4992 (mappings 4984, not_a_driver 8), warnings suppressed
    /// 12, maps deferred 9, maps read blocked: pid 100 for 12.3s`, naming only what is not 0.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let libraries: u64 = self.libraries_skipped.values().sum();
        if libraries > 0 {
            let reasons: Vec<String> = self
                .libraries_skipped
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(why, n)| format!("{why} {n}"))
                .collect();
            parts.push(format!(
                "libraries skipped {libraries} ({})",
                reasons.join(", ")
            ));
        }
        if self.warnings_suppressed > 0 {
            parts.push(format!("warnings suppressed {}", self.warnings_suppressed));
        }
        if self.maps_deferred > 0 {
            parts.push(format!("maps deferred {}", self.maps_deferred));
        }
        if !self.maps_blocked.is_empty() {
            let pids: Vec<String> = self
                .maps_blocked
                .iter()
                .map(|b| format!("pid {} for {:.1}s", b.pid, b.seconds))
                .collect();
            parts.push(format!("maps read blocked: {}", pids.join(", ")));
        }
        parts.join(", ")
    }
}

/// Every tenant with something skipped, by tenant name. The agent's own warnings (tenant
/// `agent`) are a row too.
pub fn by_tenant(a: &AgentStatus) -> Vec<TenantSkips> {
    let mut tenants: BTreeSet<&str> = BTreeSet::new();
    tenants.extend(
        a.libraries_skipped
            .iter()
            .filter(|(_, r)| r.values().any(|n| *n > 0))
            .map(|(t, _)| t.as_str()),
    );
    tenants.extend(
        a.warnings_suppressed
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, _)| t.as_str()),
    );
    tenants.extend(
        a.maps_scan
            .deferred_by_tenant
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, _)| t.as_str()),
    );
    tenants.extend(a.maps_scan.blocked.iter().map(|b| b.tenant.as_str()));
    tenants
        .into_iter()
        .map(|t| TenantSkips {
            tenant: t.to_string(),
            libraries_skipped: a
                .libraries_skipped
                .get(t)
                .map(|r| {
                    r.iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|(k, n)| (k.clone(), *n))
                        .collect()
                })
                .unwrap_or_default(),
            warnings_suppressed: a.warnings_suppressed.get(t).copied().unwrap_or(0),
            maps_deferred: a.maps_scan.deferred_by_tenant.get(t).copied().unwrap_or(0),
            maps_blocked: a
                .maps_scan
                .blocked
                .iter()
                .filter(|b| b.tenant == t)
                .cloned()
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_gets_one_row_with_what_it_made_the_agent_skip() {
        let mut a = AgentStatus::default();
        a.libraries_skipped.insert(
            "/hostile".into(),
            [
                ("mappings".to_string(), 4984),
                ("not_a_driver".to_string(), 8),
            ]
            .into(),
        );
        a.warnings_suppressed.insert("/hostile".into(), 12);
        a.warnings_suppressed.insert("agent".into(), 0);
        a.maps_scan.deferred_by_tenant.insert("/other".into(), 3);
        a.maps_scan.blocked.push(MapsBlocked {
            pid: 100,
            tenant: "/hostile".into(),
            seconds: 12.34,
        });
        let rows = by_tenant(&a);
        assert_eq!(
            rows.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
            ["/hostile", "/other"]
        );
        assert_eq!(
            rows[0].summary(),
            "libraries skipped 4992 (mappings 4984, not_a_driver 8), warnings suppressed 12, \
             maps read blocked: pid 100 for 12.3s"
        );
        assert_eq!(rows[1].summary(), "maps deferred 3");
        assert!(by_tenant(&AgentStatus::default()).is_empty());
    }
}
