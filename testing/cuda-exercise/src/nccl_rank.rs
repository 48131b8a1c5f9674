//! `nccl-rank`: one rank of a communicator shared by several processes, as a torchrun job makes
//! it. Rank 0 gets the unique id (ncclGetUniqueId) and publishes it in a file; the other ranks
//! read it there. Each creates its communicator with ncclCommInitRankConfig (what PyTorch calls),
//! issues N ncclAllReduce of a known size on it, and destroys it.

use serde_json::json;
use std::ffi::c_int;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::driver::Driver;
use crate::nccl;
use crate::record::{Recorder, print};
use crate::wait::wait_for_file;

pub struct RankArgs<'a> {
    pub nranks: c_int,
    pub rank: c_int,
    pub unique_id_file: &'a Path,
    pub all_reduce: u64,
    pub count: usize,
    pub datatype: c_int,
}

fn publish(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn rank(lib: &Driver, a: &RankArgs<'_>) -> Result<ExitCode, String> {
    let mut rec = Recorder::default();
    let id = if a.rank == 0 {
        let (r, id) = nccl::unique_id(lib);
        rec.record_bytes("ncclGetUniqueId", r, 0);
        if r != Some(0) {
            return Err(format!("ncclGetUniqueId returned {r:?}"));
        }
        publish(a.unique_id_file, &nccl::hex(&id))?;
        id
    } else {
        wait_for_file(a.unique_id_file, Duration::from_secs(60))?;
        let text = std::fs::read_to_string(a.unique_id_file)
            .map_err(|e| format!("{}: {e}", a.unique_id_file.display()))?;
        nccl::from_hex(&text)?
    };
    let (r, comm) = nccl::init_rank_config(lib, a.nranks, id, a.rank);
    rec.record_bytes("ncclCommInitRankConfig", r, 0);
    let args = nccl::Args {
        count: a.count,
        datatype: a.datatype,
    };
    for _ in 0..a.all_reduce {
        let o = nccl::call_default(lib, "ncclAllReduce", id, args, 1, comm)?;
        rec.record_bytes("ncclAllReduce", o.result, args.bytes());
    }
    if !comm.is_null() {
        rec.record_bytes("ncclCommDestroy", nccl::destroy(lib, comm), 0);
    }
    print(json!({
        "pid": std::process::id(),
        "rank": a.rank,
        "nranks": a.nranks,
        "unique_id": nccl::hex(&id),
        "comm": (!comm.is_null()).then(|| format!("{comm:p}")),
        "calls": rec.calls,
    }));
    Ok(ExitCode::SUCCESS)
}
