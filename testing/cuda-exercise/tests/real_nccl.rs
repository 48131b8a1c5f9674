//! cuda-exercise against the real NCCL, when `VGPU_TEST_LIBNCCL` names one (`cargo xtask setup`
//! unpacks libnccl.so.2 2.28.3 from the nvidia-nccl-cu12 wheel). Without a GPU communicator
//! creation fails and collectives on a NULL communicator return ncclInvalidArgument: the test
//! checks that every call is made, counted and fails the documented way, and that none crashes.

mod common;

use agent_common::api::{APIS, ApiKind};
use common::*;
use std::path::Path;

/// Bytes per element of ncclDataType_t 0..12 (nccl.h 2.28), written out independently of
/// agent_common.
const SIZES: [u64; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];

/// Bytes of `calls` calls of the API at position `j` of the NCCL table, as cuda-exercise makes
/// them: call i has count 1000*(j+1)+i and datatype (i+j) % 12.
fn expected_bytes(j: usize, calls: u64) -> u64 {
    (0..calls as usize)
        .map(|i| (1000 * (j + 1) + i) as u64 * SIZES[(i + j) % 12])
        .sum()
}

#[test]
fn nccl_calls_against_the_real_library() {
    let Some(lib) = std::env::var_os("VGPU_TEST_LIBNCCL") else {
        eprintln!("note: VGPU_TEST_LIBNCCL is not set; skipping the test against the real NCCL");
        return;
    };
    let out = run_lib(
        Path::new(&lib),
        &["nccl", "--per-api", "3", "--bad-datatype"],
        &[],
    );
    let v = json(&out);
    assert_eq!(v["version"], 22803, "{v}");
    assert_eq!(v["missing"].as_array().unwrap().len(), 0, "{v}");
    // ncclGetUniqueId needs no GPU.
    assert_eq!(v["unique_id_result"], 0, "{v}");
    assert_eq!(
        v["communicators_created"], 0,
        "this test expects no GPU: {v}"
    );
    let nccl: Vec<&str> = APIS
        .iter()
        .filter(|a| a.kind == ApiKind::Nccl)
        .map(|a| a.name)
        .collect();
    assert_eq!(nccl.len(), 18);
    for (j, name) in nccl.iter().enumerate() {
        let codes = &v["calls"][name]["codes"];
        let (calls, bytes) = match *name {
            // --bad-datatype adds one call with datatype 99: 0 bytes.
            "ncclAllReduce" => (4, expected_bytes(j, 3)),
            "ncclCommInitRank"
            | "ncclCommInitRankConfig"
            | "ncclCommInitAll"
            | "ncclCommInitRankScalable"
            | "ncclCommDestroy"
            | "ncclCommAbort"
            | "ncclGroupStart"
            | "ncclGroupEnd" => (3, 0),
            _ => (3, expected_bytes(j, 3)),
        };
        assert_eq!(stat(&v, name, "calls"), calls, "{name}: {codes}");
        assert_eq!(stat(&v, name, "bytes"), bytes, "{name}");
        match *name {
            // No CUDA device: ncclUnhandledCudaError (1).
            "ncclCommInitRank"
            | "ncclCommInitRankConfig"
            | "ncclCommInitAll"
            | "ncclCommInitRankScalable" => assert_eq!(codes["1"], 3, "{name}: {codes}"),
            // NULL communicators are accepted by destroy/abort; empty groups succeed.
            "ncclCommDestroy" | "ncclCommAbort" | "ncclGroupStart" | "ncclGroupEnd" => {
                assert_eq!(stat(&v, name, "errors"), 0, "{name}: {codes}")
            }
            // A NULL communicator: ncclInvalidArgument (4), nothing dereferenced.
            _ => assert_eq!(codes["4"], calls, "{name}: {codes}"),
        }
    }
    assert_eq!(stat(&v, "ncclAllReduce", "errors"), 4);
}
