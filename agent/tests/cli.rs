//! Command-line behaviour that needs no privileges.

mod support;

use std::process::Command;

use support::agent_bin;

/// Runs the agent without privileges: as an ordinary user when the test runs as root.
fn unprivileged(args: &[&str]) -> std::process::Output {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--",
            ])
            .arg(agent_bin())
            .args(args)
            .output()
            .expect("setpriv (util-linux) runs")
    } else {
        Command::new(agent_bin()).args(args).output().unwrap()
    }
}

#[test]
fn without_privileges_stat_exits_1_and_says_what_to_do() {
    let out = unprivileged(&["stat", "--duration", "1s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("sudo"), "{stderr}");
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn malformed_durations_are_rejected_with_the_value() {
    let out = Command::new(agent_bin())
        .args(["stat", "--duration", "10x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("10x") && stderr.contains("unknown unit"),
        "{stderr}"
    );
}
