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
    stat.wait_for("tracing for", ATTACH_TIMEOUT);
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

    // The library was attached with its two NCCL link sets only (communicators' creation and
    // end as `lifecycle`, the calls a budget samples as `nccl`), every traced symbol found.
    let libs = report["probes"]["libraries"].as_array().unwrap();
    let nccl = libs
        .iter()
        .find(|l| l["path"].as_str().unwrap().ends_with("libnccl.so.2"))
        .expect("libnccl.so.2 attached");
    assert_eq!(
        nccl["kinds_attached"],
        serde_json::json!(["lifecycle", "nccl"]),
        "{nccl}"
    );
    assert_eq!(nccl["symbols_attached"], 18, "{nccl}");
    assert_eq!(nccl["symbols_missing"], serde_json::json!([]), "{nccl}");
    assert!(
        !report["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("does not export")),
        "{}",
        report["warnings"]
    );
    assert_eq!(nccl["found_by"]["by"], "process", "{nccl}");
}

/// NCCL's communicator id (`commId` in its INFO lines) of a unique id printed in hex by
/// cuda-exercise.
fn comm_id_hex(unique_id: &str) -> String {
    let bytes: Vec<u8> = (0..unique_id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&unique_id[i..i + 2], 16).unwrap())
        .collect();
    let id: [u8; agent_common::api::NCCL_UNIQUE_ID_BYTES] = bytes.try_into().unwrap();
    format!("{:#x}", agent_common::api::comm_id_of(&id))
}

/// Builds testing/fake-nccl (always-succeeding NCCL entry points that hand out fake
/// communicators) as `dir/libnccl.so.2`.
fn fake_libnccl(dir: &std::path::Path) -> std::path::PathBuf {
    fake_libnccl_with(dir, &[])
}

/// As [`fake_libnccl`], with more compiler flags.
fn fake_libnccl_with(dir: &std::path::Path, flags: &[&str]) -> std::path::PathBuf {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testing/fake-nccl/fake_nccl.c");
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("libnccl.so.2");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O0"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc runs (gcc is installed by cargo xtask setup)");
    assert!(status.success(), "building the fake NCCL failed");
    out
}

#[test]
fn communicators_are_tracked_with_rank_size_and_their_calls() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = fake_libnccl(&dir.path().join("lib"));
    let mut cmd = exercise(&lib);
    // 3 ranks (this process is rank 2; ncclCommInitAll makes ranks 0..3); collectives on the first
    // communicator made, so ncclReduce's comm comes from the stack slot [rsp+8].
    cmd.args(["nccl", "--per-api", "2", "--nranks", "3", "--use-comm"]);
    let workload = Workload::start(cmd, dir.path());
    let mut stat = Stat::start(&["--no-calibrate"]);
    stat.wait_for("libnccl.so.2 [", ATTACH_TIMEOUT);
    stat.wait_for("tracing for", ATTACH_TIMEOUT);
    let pid = workload.pid();
    workload.go();
    let made = workload.finish();
    let report = stat.finish();
    let row = process(&report, pid);

    let calls = made["calls"].as_object().unwrap();
    let mut data_calls = 0;
    let mut data_bytes = 0;
    for (name, c) in calls {
        let want = (
            c["calls"].as_u64().unwrap(),
            c["errors"].as_u64().unwrap(),
            c["bytes"].as_u64().unwrap(),
        );
        assert_eq!(want.1, 0, "the fake NCCL always succeeds: {name}");
        assert_eq!(api(row, name), want, "{name}: (calls, errors, bytes)");
        if want.2 > 0 {
            data_calls += want.0;
            data_bytes += want.2;
        }
    }
    // 10 data APIs x 2 calls.
    assert_eq!(data_calls, 20);
    // ncclReduce named the communicator on the stack: its bytes are in the row with the comm.
    let reduce_bytes = calls["ncclReduce"]["bytes"].as_u64().unwrap();
    assert!(reduce_bytes > 0);

    let made_comms: Vec<&str> = made["communicators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    // 2 calls each of InitRank, InitRankConfig, InitRankScalable (1 communicator) and InitAll (3).
    assert_eq!(made_comms.len(), 12);
    let comms = row["communicators"].as_array().unwrap();
    assert_eq!(comms.len(), 12, "{comms:#?}");
    let by_comm = |c: &str| {
        comms
            .iter()
            .find(|r| r["comm"] == c)
            .unwrap_or_else(|| panic!("communicator {c} not reported: {comms:#?}"))
    };
    let want_comm_id = comm_id_hex(made["unique_id"].as_str().unwrap());
    let used = made["collectives_comm"].as_str().unwrap();
    assert_eq!(used, made_comms[0]);
    let expect = [
        ("ncclCommInitRank", 2),
        ("ncclCommInitRank", 2),
        ("ncclCommInitRankConfig", 2),
        ("ncclCommInitRankConfig", 2),
        ("ncclCommInitAll", 0),
        ("ncclCommInitAll", 1),
        ("ncclCommInitAll", 2),
        ("ncclCommInitAll", 0),
        ("ncclCommInitAll", 1),
        ("ncclCommInitAll", 2),
        ("ncclCommInitRankScalable", 2),
        ("ncclCommInitRankScalable", 2),
    ];
    for (c, (created_by, rank)) in made_comms.iter().zip(expect) {
        let r = by_comm(c);
        assert_eq!(r["created_by"], created_by, "{r}");
        assert_eq!(
            (r["rank"].as_u64(), r["nranks"].as_u64()),
            (Some(rank), Some(3)),
            "{r}"
        );
        assert_eq!(r["destroyed"], true, "destroyed at the end: {r}");
        assert_eq!(r["errors"], 0, "{r}");
        // NCCL's communicator id, hashed from the unique id the call was given (by value on the
        // stack, or the first of ncclCommInitRankScalable's array); ncclCommInitAll makes its own
        // inside NCCL, which the probes do not see.
        if created_by == "ncclCommInitAll" {
            assert!(r.get("comm_id").is_none(), "{r}");
        } else {
            assert_eq!(r["comm_id"], want_comm_id, "{r}");
        }
        if *c == used {
            // Its creation, every data call, its destruction.
            assert_eq!(r["calls"].as_u64(), Some(1 + data_calls + 1), "{r}");
            assert_eq!(r["bytes"].as_u64(), Some(data_bytes), "{r}");
        } else {
            // ncclCommInitAll's communicators are not the call's key (it made 3): only the
            // destruction names them. The others: creation and destruction.
            let want = if created_by == "ncclCommInitAll" {
                1
            } else {
                2
            };
            assert_eq!(r["calls"].as_u64(), Some(want), "{r}");
            assert_eq!(r["bytes"], 0, "{r}");
        }
    }
}

/// Two processes, ranks 0 and 1 of one communicator (rank 0 made the unique id and passed it on
/// through a file, as torchrun's store does): each process has its own `ncclComm_t`, and both
/// report the same NCCL communicator id, with the calls and bytes each rank issued.
#[test]
fn two_ranks_in_two_processes_report_one_communicator_id() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = fake_libnccl(&dir.path().join("lib"));
    let id_file = dir.path().join("unique-id");
    // Rank r issues 5 + r all-reduces of 1000 + r float32 elements.
    let start = |r: u64| {
        let d = dir.path().join(format!("rank{r}"));
        std::fs::create_dir_all(&d).unwrap();
        let mut cmd = exercise(&lib);
        cmd.args(["nccl-rank", "--nranks", "2", "--rank", &r.to_string()])
            .arg("--unique-id-file")
            .arg(&id_file)
            .args(["--all-reduce", &(5 + r).to_string()])
            .args(["--count", &(1000 + r).to_string(), "--datatype", "7"]);
        Workload::start(cmd, &d)
    };
    let ranks = [start(0), start(1)];
    let mut stat = Stat::start(&["--no-calibrate"]);
    stat.wait_for("libnccl.so.2 [", ATTACH_TIMEOUT);
    stat.wait_for("tracing for", ATTACH_TIMEOUT);
    let pids: Vec<u32> = ranks.iter().map(Workload::pid).collect();
    for w in &ranks {
        w.go();
    }
    let made: Vec<serde_json::Value> = ranks.into_iter().map(Workload::finish).collect();
    let report = stat.finish();

    assert_eq!(made[0]["unique_id"], made[1]["unique_id"], "{made:?}");
    let want_id = comm_id_hex(made[0]["unique_id"].as_str().unwrap());
    let mut addresses = vec![];
    for (r, (pid, m)) in pids.iter().zip(&made).enumerate() {
        let r = r as u64;
        let row = process(&report, *pid);
        let comms = row["communicators"].as_array().unwrap();
        assert_eq!(comms.len(), 1, "{comms:#?}");
        let c = &comms[0];
        assert_eq!(c["comm"], m["comm"], "{c}");
        assert_eq!(c["comm_id"], want_id.as_str(), "{c}");
        assert_eq!(
            (c["rank"].as_u64(), c["nranks"].as_u64()),
            (Some(r), Some(2))
        );
        assert_eq!(c["created_by"], "ncclCommInitRankConfig");
        // Its creation, the all-reduces, its destruction; bytes = count x 4 per all-reduce.
        let all_reduce = 5 + r;
        assert_eq!(c["calls"].as_u64(), Some(1 + all_reduce + 1), "{c}");
        assert_eq!(
            c["bytes"].as_u64(),
            Some(all_reduce * (1000 + r) * 4),
            "{c}"
        );
        assert_eq!(
            api(row, "ncclAllReduce"),
            (all_reduce, 0, all_reduce * (1000 + r) * 4)
        );
        addresses.push(c["comm"].clone());
    }
    // The fake hands out 0x10000 first in every process: an ncclComm_t names a communicator only
    // within its process, and equal addresses in two processes say nothing. The id does.
    assert_eq!(addresses[0], addresses[1]);
}

/// A CET build (every entry point starts with `endbr64`, as Ubuntu's libnccl does): the probes go
/// on the push after the `endbr64` (the kernel single-steps an `endbr64`, at 4-5 times the price
/// of an emulated push), and still see every call once, with its arguments.
#[test]
fn a_cet_build_is_probed_past_its_endbr64_and_every_call_counted() {
    let _serial = serial();
    if !privileged() {
        return;
    }
    let dir = tempdir();
    let lib = fake_libnccl_with(&dir.path().join("lib"), &["-fcf-protection=full"]);
    let mut cmd = exercise(&lib);
    cmd.args(["nccl", "--per-api", "2", "--nranks", "3", "--use-comm"]);
    let workload = Workload::start(cmd, dir.path());
    let mut stat = Stat::start(&["--no-calibrate"]);
    stat.wait_for("libnccl.so.2 [", ATTACH_TIMEOUT);
    stat.wait_for("tracing for", ATTACH_TIMEOUT);
    let pid = workload.pid();
    workload.go();
    let made = workload.finish();
    let report = stat.finish();

    let libs = report["probes"]["libraries"].as_array().unwrap();
    let nccl = libs
        .iter()
        .find(|l| l["path"].as_str().unwrap().ends_with("libnccl.so.2"))
        .expect("libnccl.so.2 attached");
    let prologues = nccl["prologues"].as_object().unwrap();
    assert_eq!(
        prologues.keys().collect::<Vec<_>>(),
        ["endbr64"],
        "every entry point of a CET build starts with endbr64 then a push: {nccl}"
    );
    let row = process(&report, pid);
    for (name, c) in made["calls"].as_object().unwrap() {
        let want = (
            c["calls"].as_u64().unwrap(),
            c["errors"].as_u64().unwrap(),
            c["bytes"].as_u64().unwrap(),
        );
        assert_eq!(api(row, name), want, "{name}: (calls, errors, bytes)");
    }
    // Arguments read at the probe past the endbr64 are the call's: the communicators and the id.
    let comms = row["communicators"].as_array().unwrap();
    assert_eq!(comms.len(), 12, "{comms:#?}");
    let want_comm_id = comm_id_hex(made["unique_id"].as_str().unwrap());
    assert!(
        comms.iter().any(|c| c["comm_id"] == want_comm_id.as_str()),
        "{want_comm_id} in {comms:#?}"
    );
    assert_eq!(report["health"]["return_without_entry"], 0);
}
