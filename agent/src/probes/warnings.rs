//! The warnings the agent keeps and shows in every snapshot: bounded, whatever a tenant does.
//! Each warning has a key (what kind of problem, about which process or library, in which
//! tenant); a warning made again is counted on the one kept, not kept twice. Each tenant keeps
//! at most [`PER_TENANT`] and all together at most [`TOTAL`]; past that a warning is counted as
//! suppressed for its tenant instead of kept. A warning about a process goes when the process
//! exits; one about a tenant's library after [`TTL`] without being made again; the agent's own
//! (no tenant) stay.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

/// Warnings kept per tenant at most.
pub const PER_TENANT: usize = 16;
/// Warnings kept in all at most.
pub const TOTAL: usize = 256;
/// A tenant's warning not about a process is dropped this long after it was last made.
pub const TTL: Duration = Duration::from_secs(600);
/// The label of the agent's own warnings (host libraries, calibration, ...).
pub const AGENT: &str = "agent";

/// What a warning is about: its tenant (`None`: the agent itself), its kind, and its subject (a
/// process, a library), so that the same problem made again is counted, not kept again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WarningKey {
    pub tenant: Option<String>,
    pub kind: &'static str,
    pub subject: String,
}

#[derive(Clone, Debug)]
struct Kept {
    message: String,
    /// Times made.
    count: u64,
    /// The process it is about (dropped when it exits).
    pid: Option<u32>,
    last: Instant,
    /// Order of arrival, to list warnings oldest first.
    seq: u64,
}

/// The bounded store (see the module docs).
#[derive(Debug)]
pub struct WarningStore {
    kept: HashMap<WarningKey, Kept>,
    per_tenant: HashMap<Option<String>, usize>,
    /// Warnings not kept, by tenant label.
    suppressed: BTreeMap<String, u64>,
    per_tenant_cap: usize,
    total_cap: usize,
    seq: u64,
}

impl Default for WarningStore {
    fn default() -> WarningStore {
        WarningStore::with_caps(PER_TENANT, TOTAL)
    }
}

impl WarningStore {
    pub fn with_caps(per_tenant: usize, total: usize) -> WarningStore {
        WarningStore {
            kept: HashMap::new(),
            per_tenant: HashMap::new(),
            suppressed: BTreeMap::new(),
            per_tenant_cap: per_tenant,
            total_cap: total,
            seq: 0,
        }
    }

    /// Records a warning (logging it the first time it is kept). Returns whether it is new.
    pub fn warn(
        &mut self,
        key: WarningKey,
        pid: Option<u32>,
        message: String,
        now: Instant,
    ) -> bool {
        if let Some(k) = self.kept.get_mut(&key) {
            k.count += 1;
            k.last = now;
            return false;
        }
        let in_tenant = self.per_tenant.get(&key.tenant).copied().unwrap_or(0);
        // The agent's own warnings are few and fixed in number: they only count against the total.
        let tenant_full = key.tenant.is_some() && in_tenant >= self.per_tenant_cap;
        if tenant_full || self.kept.len() >= self.total_cap {
            *self
                .suppressed
                .entry(label(key.tenant.as_deref()).to_owned())
                .or_default() += 1;
            log::debug!("warning suppressed (over its bound): {message}");
            return false;
        }
        log::warn!("{message}");
        *self.per_tenant.entry(key.tenant.clone()).or_default() += 1;
        self.seq += 1;
        self.kept.insert(
            key,
            Kept {
                message,
                count: 1,
                pid,
                last: now,
                seq: self.seq,
            },
        );
        true
    }

    /// An agent warning (no tenant), keyed by its text.
    pub fn agent(&mut self, kind: &'static str, message: String) {
        let key = WarningKey {
            tenant: None,
            kind,
            subject: message.clone(),
        };
        self.warn(key, None, message, Instant::now());
    }

    /// Drops the warnings about processes that exited and tenants' warnings past [`TTL`].
    pub fn expire(&mut self, alive: impl Fn(u32) -> bool, now: Instant) {
        let per_tenant = &mut self.per_tenant;
        self.kept.retain(|key, k| {
            let keep = match k.pid {
                Some(pid) => alive(pid),
                None => key.tenant.is_none() || now.duration_since(k.last) < TTL,
            };
            if !keep && let Some(n) = per_tenant.get_mut(&key.tenant) {
                *n -= 1;
            }
            keep
        });
        per_tenant.retain(|_, n| *n > 0);
    }

    /// Drops the warnings about one subject (a library forgotten).
    pub fn forget_subject(&mut self, subject: &str) {
        let per_tenant = &mut self.per_tenant;
        self.kept.retain(|key, _| {
            let keep = key.subject != subject;
            if !keep && let Some(n) = per_tenant.get_mut(&key.tenant) {
                *n -= 1;
            }
            keep
        });
        per_tenant.retain(|_, n| *n > 0);
    }

    /// The kept warnings, oldest first; one made more than once says how often.
    pub fn list(&self) -> Vec<String> {
        let mut v: Vec<&Kept> = self.kept.values().collect();
        v.sort_by_key(|k| k.seq);
        v.into_iter()
            .map(|k| match k.count {
                1 => k.message.clone(),
                n => format!("{} (made {n} times)", k.message),
            })
            .collect()
    }

    /// Warnings not kept because of the bounds, by tenant label.
    pub fn suppressed(&self) -> &BTreeMap<String, u64> {
        &self.suppressed
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// How a tenant is named in counts.
pub fn label(tenant: Option<&str>) -> &str {
    tenant.unwrap_or(AGENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, kind: &'static str, subject: &str) -> WarningKey {
        WarningKey {
            tenant: Some(tenant.into()),
            kind,
            subject: subject.into(),
        }
    }

    #[test]
    fn a_repeated_warning_is_counted_on_the_one_kept() {
        let mut s = WarningStore::default();
        let now = Instant::now();
        assert!(s.warn(key("a", "refused", "1:2"), Some(7), "x".into(), now));
        assert!(!s.warn(key("a", "refused", "1:2"), Some(7), "x".into(), now));
        assert!(!s.warn(key("a", "refused", "1:2"), Some(7), "x".into(), now));
        assert_eq!(s.list(), vec!["x (made 3 times)".to_string()]);
        assert!(s.suppressed().is_empty());
    }

    #[test]
    fn each_tenant_keeps_its_share_and_the_rest_is_counted_as_suppressed() {
        let mut s = WarningStore::with_caps(16, 40);
        let now = Instant::now();
        for i in 0..5000 {
            s.warn(
                key("attacker", "refused", &i.to_string()),
                Some(9),
                format!("a{i}"),
                now,
            );
        }
        assert_eq!(s.len(), 16);
        assert_eq!(s.suppressed()["attacker"], 5000 - 16);
        // Another tenant still gets its own warnings in.
        assert!(s.warn(key("victim", "refused", "1"), Some(3), "v".into(), now));
        // And the total bound holds across tenants.
        for t in 0..10 {
            for i in 0..16 {
                s.warn(
                    key(&format!("t{t}"), "k", &i.to_string()),
                    None,
                    "m".into(),
                    now,
                );
            }
        }
        assert_eq!(s.len(), 40);
        assert!(s.suppressed().values().sum::<u64>() > 5000 - 16);
        // The agent's own warnings count against the total only.
        let mut s = WarningStore::with_caps(1, 3);
        s.agent("host", "one".into());
        s.agent("host", "two".into());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn warnings_go_with_their_process_or_after_their_ttl() {
        let mut s = WarningStore::default();
        let now = Instant::now();
        s.warn(key("a", "refused", "p1"), Some(1), "p1".into(), now);
        s.warn(key("a", "refused", "p2"), Some(2), "p2".into(), now);
        s.warn(key("a", "not_a_driver", "lib"), None, "lib".into(), now);
        s.agent("host", "agent".into());
        s.expire(|pid| pid == 2, now);
        assert_eq!(s.list(), vec!["p2", "lib", "agent"]);
        s.expire(|_| true, now + TTL);
        assert_eq!(s.list(), vec!["p2", "agent"]);
        // The freed room is usable again.
        let mut s = WarningStore::with_caps(1, 10);
        s.warn(key("a", "k", "1"), Some(1), "1".into(), now);
        assert!(!s.warn(key("a", "k", "2"), Some(2), "2".into(), now));
        s.expire(|pid| pid != 1, now);
        assert!(s.warn(key("a", "k", "2"), Some(2), "2".into(), now));
        s.forget_subject("2");
        assert!(s.is_empty());
    }
}
