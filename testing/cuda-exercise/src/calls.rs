//! The call-counting commands (`counts`, `nccl`): each traced CUDA or NCCL API called N times with
//! harmless arguments, and the calls, errors and bytes recorded per API.

use agent_common::api::{APIS, ApiKind};
use serde_json::json;
use std::process::ExitCode;

use crate::driver::Driver;
use crate::nccl;
use crate::record::{Recorder, print};

pub fn counts(
    drv: &mut Driver,
    per_api: u64,
    apis: Option<Vec<String>>,
    init: bool,
    size: usize,
    stream: bool,
) -> Result<ExitCode, String> {
    const KINDS: [ApiKind; 6] = [
        ApiKind::Alloc,
        ApiKind::Free,
        ApiKind::Sync,
        ApiKind::Copy,
        ApiKind::Launch,
        ApiKind::Lifecycle,
    ];
    let names: Vec<String> = match apis {
        Some(list) => list
            .into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => APIS
            .iter()
            .filter(|a| KINDS.contains(&a.kind))
            .map(|a| a.name.to_string())
            .collect(),
    };
    let mut rec = Recorder::default();
    if init {
        rec.record("cuInit", drv.init(), 0);
    }
    // Not a counted call: the stream is set up before the counted ones.
    let stream = if stream {
        Some(drv.create_stream()?)
    } else {
        None
    };
    for name in &names {
        let bytes = Driver::default_size(name, size) as u64;
        if !drv.has(name) {
            rec.missing.insert(name.clone());
            continue;
        }
        for _ in 0..per_api {
            let r = drv.call_default(name, size)?;
            rec.record(name, r, bytes);
        }
    }
    print(json!({
        "pid": std::process::id(),
        "calls": rec.calls,
        "missing": rec.missing,
        "stream": stream,
    }));
    Ok(ExitCode::SUCCESS)
}

pub fn nccl_counts(
    lib: &Driver,
    per_api: u64,
    bad_datatype: bool,
    nranks: usize,
    use_comm: bool,
) -> Result<ExitCode, String> {
    let (version_result, version) = nccl::version(lib);
    let (unique_id_result, id) = nccl::unique_id(lib);
    let mut rec = Recorder::default();
    let mut created = Vec::new();
    for (j, name) in nccl::traced().enumerate() {
        if !lib.has(name) {
            rec.missing.insert(name.to_string());
            continue;
        }
        for i in 0..per_api {
            let args = nccl::Args::nth(j, i);
            let comm = match created.first() {
                Some(&c) if use_comm => c,
                _ => std::ptr::null_mut(),
            };
            let o = nccl::call_default(lib, name, id, args, nranks, comm)?;
            rec.record_bytes(name, o.result, if o.data { args.bytes() } else { 0 });
            created.extend(o.created);
        }
    }
    if bad_datatype {
        let args = nccl::Args {
            count: 4096,
            datatype: 99,
        };
        let o = nccl::call_default(lib, "ncclAllReduce", id, args, nranks, std::ptr::null_mut())?;
        rec.record_bytes("ncclAllReduce", o.result, args.bytes());
    }
    let communicators: Vec<String> = created.iter().map(|&c| format!("{c:p}")).collect();
    let used = match created.first() {
        Some(&c) if use_comm => Some(format!("{c:p}")),
        _ => None,
    };
    for c in created {
        rec.record_bytes("ncclCommDestroy", nccl::destroy(lib, c), 0);
    }
    print(json!({
        "pid": std::process::id(),
        "version": version,
        "version_result": version_result,
        "unique_id_result": unique_id_result,
        "unique_id": nccl::hex(&id),
        "communicators_created": communicators.len(),
        "communicators": communicators,
        "collectives_comm": used,
        "calls": rec.calls,
        "missing": rec.missing,
    }));
    Ok(ExitCode::SUCCESS)
}
