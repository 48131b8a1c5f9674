//! Can this process load eBPF programs and attach uprobes? Checked first, so that a user without
//! privileges gets one clear message instead of a kernel error deep inside a load.

use std::fs;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities from a `/proc/<pid>/status` text.
pub fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// `Ok` if the capabilities allow loading and attaching probes; otherwise a message that says
/// what to do.
pub fn check_caps(caps: u64) -> Result<(), String> {
    if has(caps, CAP_SYS_ADMIN) || (has(caps, CAP_BPF) && has(caps, CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(c, _)| !has(caps, *c))
        .map(|(_, n)| n)
        .collect();
    Err(format!(
        "vgpu-agent needs privileges to load its eBPF probes (missing {}): run it with sudo, \
         or give the binary CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep vgpu-agent)",
        missing.join(" and ")
    ))
}

/// Checks the running process.
pub fn check_current_process() -> Result<(), String> {
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    let caps = effective_caps(&status).ok_or("no CapEff line in /proc/self/status")?;
    check_caps(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_bpf_capabilities_pass_others_get_an_actionable_message() {
        assert!(check_caps(0x000001ffffffffff).is_ok(), "root's full set");
        assert!(check_caps(1 << CAP_SYS_ADMIN).is_ok());
        assert!(check_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
        let msg = check_caps(1 << CAP_BPF).unwrap_err();
        assert!(
            msg.contains("sudo") && msg.contains("(missing CAP_PERFMON)"),
            "{msg}"
        );
        let msg = check_caps(0).unwrap_err();
        assert!(msg.contains("(missing CAP_BPF and CAP_PERFMON)"), "{msg}");
    }

    #[test]
    fn parses_status() {
        let status = "Name:\tbash\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ffffffffff));
        assert_eq!(effective_caps("Name: x\n"), None);
    }
}
