//! The NCCL probes against the real libnccl.so.2 (2.28.3 from the nvidia-nccl-cu12 wheel, unpacked
//! by `cargo xtask setup`) in the real kernel (root). The library is found through the workload's
//! /proc/<pid>/maps, as PyTorch's own copy would be. Without a GPU communicator creation fails and
//! collectives on a NULL communicator fail with ncclInvalidArgument: the calls are still counted,
//! and their bytes (count x datatype size) are known exactly.

mod support;

use std::time::Duration;

use support::*;

const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

fn real_libnccl() -> Option<std::path::PathBuf> {
    let p = std::path::PathBuf::from(std::env::var_os("VGPU_TEST_LIBNCCL")?);
    p.exists().then_some(p)
}

#[test]
fn real_libnccl_every_call_is_counted_with_its_bytes() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let Some(lib) = real_libnccl() else {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PRIVILEGED").is_none(),
            "VGPU_TEST_LIBNCCL must point at libnccl.so.2 (cargo xtask setup unpacks it)"
        );
        eprintln!("skipping: VGPU_TEST_LIBNCCL is not set");
        return;
    };
    let dir = tempdir();
    let mut cmd = exercise(&lib);
    cmd.args(["nccl", "--per-api", "3", "--bad-datatype"]);
    let workload = Workload::start(cmd, dir.path());
    let mut stat = Stat::start(&["--no-calibrate"]);
    stat.wait_for("libnccl.so.2 [", ATTACH_TIMEOUT);
    let pid = workload.pid();
    workload.go();
    let made = workload.finish();
    let report = stat.finish();

    let row = process(&report, pid);
    let calls = made["calls"].as_object().unwrap();
    assert_eq!(calls.len(), 18, "{made}");
    let mut total = (0, 0, 0);
    for (name, c) in calls {
        let want = (
            c["calls"].as_u64().unwrap(),
            c["errors"].as_u64().unwrap(),
            c["bytes"].as_u64().unwrap(),
        );
        assert_eq!(
            api(row, name),
            want,
            "{name}: (calls, errors, bytes) reported vs made"
        );
        total = (total.0 + want.0, total.1 + want.1, total.2 + want.2);
        let a = row["apis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["api"] == name.as_str())
            .unwrap();
        assert_eq!(a["kind"], "nccl", "{a}");
        assert_eq!(a["latency"], "host_enqueue", "{a}");
    }
    // 18 APIs x 3 calls + the call with an unknown datatype.
    assert_eq!(total.0, 55);
    // Only group calls and destroy/abort of NULL succeed without a GPU.
    assert_eq!(total.1, 55 - 4 * 3);
    assert!(total.2 > 1_000_000, "{total:?}");
    // No communicator was created, and calls on a NULL communicator are not listed as one.
    assert_eq!(row["communicators"].as_array().unwrap().len(), 0, "{row}");
    assert!(
        report["health"]["nccl_unknown_datatype"].as_u64().unwrap() >= 1,
        "{}",
        report["health"]
    );
    assert_eq!(report["health"]["return_without_entry"], 0);

    // The library was attached with the NCCL kind only, every traced symbol found.
    let libs = report["probes"]["libraries"].as_array().unwrap();
    let nccl = libs
        .iter()
        .find(|l| l["path"].as_str().unwrap().ends_with("libnccl.so.2"))
        .expect("libnccl.so.2 attached");
    assert_eq!(
        nccl["kinds_attached"],
        serde_json::json!(["nccl"]),
        "{nccl}"
    );
    assert_eq!(nccl["symbols_attached"], 18, "{nccl}");
    assert_eq!(nccl["found_by"]["by"], "process", "{nccl}");
}
