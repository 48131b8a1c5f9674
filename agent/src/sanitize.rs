//! Tenant strings made inert: a process name, a command line, a container or pod name, a path
//! inside a container can hold any bytes its tenant chose, terminal escape sequences included.
//! [`inert`] replaces every control character (C0, DEL, C1, and the Unicode bidirectional
//! controls that reorder what a terminal shows) with a visible escape (`\x1b`, `\n`,
//! `\u{9b}`); everything else is unchanged.
//!
//! Where it applies: once, where strings enter the model ([`snapshot`], at the end of every
//! collection), so that every view of the model (`stat`, `attribute`, `top`, `/metrics` label
//! values, the JSON of the socket and of `--json`, OTLP attributes) shows only inert text
//! whatever view is added later; and at the binary's edge for what does not come from the model:
//! every log line (the logger's format) and the lines and errors `limit` prints (`main.rs`).
//! Escaping rather than dropping keeps what was there visible to the operator.

use std::{borrow::Cow, fmt::Write};

use crate::model::Snapshot;

/// Whether `c` must not reach a terminal as is.
fn is_control(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control character escaped (borrowed when there is none).
pub fn inert(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_control(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_control(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Makes `s` inert in place.
fn fix(s: &mut String) {
    if let Cow::Owned(clean) = inert(s) {
        *s = clean;
    }
}

fn fix_all<'a>(strings: impl IntoIterator<Item = &'a mut String>) {
    strings.into_iter().for_each(fix);
}

fn fix_opt(s: &mut Option<String>) {
    if let Some(s) = s {
        fix(s);
    }
}

/// Makes every string of the model inert (the map keys are the agent's own names).
pub fn snapshot(snap: &mut Snapshot) {
    fix(&mut snap.schema);
    fix(&mut snap.hostname);
    fix_opt(&mut snap.driver_version);
    fix_opt(&mut snap.cuda_driver_version);
    let a = &mut snap.agent;
    fix_opt(&mut a.probes_unavailable);
    for l in &mut a.libraries {
        fix(&mut l.path);
        fix(&mut l.attach_path);
        fix_all(&mut l.symbols_missing);
        fix_all(&mut l.kinds_attached);
    }
    if let Some(c) = &mut a.probe_cost {
        fix(&mut c.target);
        for class in &mut c.classes {
            fix(&mut class.target);
        }
    }
    if let Some(s) = &mut a.sampling {
        for k in &mut s.kinds {
            fix(&mut k.kind);
        }
    }
    fix_all(&mut a.nvml_problems);
    fix_all(&mut a.warnings);
    // Tenant labels are container ids or cgroup paths, which a tenant may name.
    a.warnings_suppressed = std::mem::take(&mut a.warnings_suppressed)
        .into_iter()
        .map(|(mut k, v)| {
            fix(&mut k);
            (k, v)
        })
        .collect();
    a.libraries_skipped = std::mem::take(&mut a.libraries_skipped)
        .into_iter()
        .map(|(mut k, v)| {
            fix(&mut k);
            (k, v)
        })
        .collect();
    fix_all(&mut a.claims_refused);
    for c in &mut a.region_listing_cuts {
        fix(&mut c.path);
    }
    a.maps_scan.deferred_by_tenant = std::mem::take(&mut a.maps_scan.deferred_by_tenant)
        .into_iter()
        .map(|(mut k, v)| {
            fix(&mut k);
            (k, v)
        })
        .collect();
    for b in &mut a.maps_scan.blocked {
        fix(&mut b.tenant);
    }
    for u in &mut a.regions_unread {
        fix(&mut u.path);
        fix(&mut u.reason);
    }
    for g in &mut snap.gpus {
        fix_opt(&mut g.uuid);
        fix_opt(&mut g.name);
    }
    for c in &mut snap.containers {
        fix(&mut c.key);
        fix(&mut c.name);
        for s in [
            &mut c.runtime,
            &mut c.container_id,
            &mut c.pod_uid,
            &mut c.pod_name,
            &mut c.namespace,
            &mut c.qos,
        ] {
            fix_opt(s);
        }
        for r in &mut c.regions {
            fix(&mut r.path);
            fix(&mut r.format);
            fix_all(&mut r.problems);
            fix_opt(&mut r.writable_by_others);
        }
    }
    for p in &mut snap.processes {
        fix(&mut p.comm);
        fix(&mut p.cmdline);
        fix(&mut p.container);
        fix_opt(&mut p.cgroup_path);
        if let Some(d) = &mut p.memory.drift {
            fix(&mut d.between);
        }
        for api in &mut p.apis {
            fix(&mut api.api);
            fix(&mut api.kind);
            fix_opt(&mut api.latency);
        }
        if let Some(l) = &mut p.limiter {
            fix(&mut l.region);
            fix_all(&mut l.shard_problems);
            // Kernel names are the tenant's bytes (at most 64, read from its region).
            for k in &mut l.kernels {
                fix(&mut k.name);
            }
        }
        for c in &mut p.communicators {
            fix(&mut c.comm);
            fix_opt(&mut c.created_by);
        }
        for s in &mut p.alloc_sizes {
            fix(&mut s.api);
        }
        for n in &mut p.nvml {
            fix_opt(&mut n.use_unavailable);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    proptest! {
        #[test]
        fn no_output_char_is_a_control_character(s in any::<String>()) {
            let out = inert(&s);
            prop_assert!(!out.chars().any(is_control), "{out:?}");
            prop_assert!(!out.bytes().any(|b| b < 0x20 || b == 0x7f), "{out:?}");
            // Once inert, always inert.
            prop_assert_eq!(inert(&out), out.clone());
        }

        #[test]
        fn printable_input_is_unchanged(s in "[^\\p{Cc}\\p{Cf}]*") {
            prop_assert_eq!(inert(&s), s.as_str());
        }

        #[test]
        fn escape_sequences_are_shown_not_sent(
            before in "[a-z]{0,8}",
            seq in prop::sample::select(vec!["\x1b[31m", "\x1b]0;owned\x07", "\u{9b}2J", "\x1bc", "\u{202e}"]),
            after in "[a-z]{0,8}",
        ) {
            let s = format!("{before}{seq}{after}");
            let out = inert(&s);
            prop_assert!(out.starts_with(&before) && out.ends_with(&after), "{out:?}");
            prop_assert!(out.contains('\\'), "{out:?}");
        }
    }

    #[test]
    fn escapes_are_readable() {
        assert_eq!(inert("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(inert("x\ny\tz\r"), "x\\ny\\tz\\r");
        assert_eq!(inert("\u{9b}1m\u{7f}"), "\\u{9b}1m\\x7f");
        assert_eq!(inert("évil ☃ name"), "évil ☃ name");
    }

    /// JSON pointers to every string value of a document.
    fn string_pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::String(_) => out.push(at),
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    string_pointers(v, format!("{at}/{i}"), out);
                }
            }
            Value::Object(o) => {
                for (k, v) in o {
                    let k = k.replace('~', "~0").replace('/', "~1");
                    string_pointers(v, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }

    fn poison(v: &mut Value, pointer: &str) {
        if let Some(Value::String(s)) = v.pointer_mut(pointer) {
            s.push_str("\x1b[31m\u{9b}\u{202e}");
        }
    }

    /// The walk covers every string field of the model: a snapshot whose every string value
    /// (each one that can hold any string: enum variants cannot) carries escape sequences comes
    /// out with none.
    #[test]
    fn every_string_of_the_model_is_made_inert() {
        let mut s = crate::tui::fixture::snapshot();
        s.agent.regions_unread.push(crate::model::RegionUnread {
            path: "/r".into(),
            reason: "time".into(),
            slots: 1,
            blocked_seconds: 0.0,
        });
        s.agent.probes_unavailable = Some("why".into());
        s.agent.warnings.push("w".into());
        s.agent.nvml_problems.push("n".into());
        for r in s.containers.iter_mut().flat_map(|c| &mut c.regions) {
            r.writable_by_others = Some("mode 0666: any local user can write it".into());
        }
        let clean = serde_json::to_value(&s).unwrap();
        let mut pointers = Vec::new();
        string_pointers(&clean, String::new(), &mut pointers);
        // Strings that can hold anything: poisoning them alone still gives a snapshot.
        let free: Vec<&String> = pointers
            .iter()
            .filter(|p| {
                let mut v = clean.clone();
                poison(&mut v, p);
                serde_json::from_value::<Snapshot>(v).is_ok()
            })
            .collect();
        assert!(
            free.len() > 50,
            "the fixture has strings to check: {}",
            free.len()
        );
        let mut v = clean.clone();
        for p in &free {
            poison(&mut v, p);
        }
        let mut poisoned: Snapshot = serde_json::from_value(v).unwrap();
        snapshot(&mut poisoned);
        let after = serde_json::to_value(&poisoned).unwrap();
        let missed: Vec<(&String, &Value)> = free
            .iter()
            .filter_map(|p| Some((*p, after.pointer(p)?)))
            .filter(|(_, v)| v.as_str().is_some_and(|s| s.chars().any(is_control)))
            .collect();
        assert!(missed.is_empty(), "strings the walk missed: {missed:?}");
    }
}
