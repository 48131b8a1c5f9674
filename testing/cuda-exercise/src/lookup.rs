//! The `proc-address` command: an entry point resolved with cuGetProcAddress(_v2), next to the
//! addresses dlsym gives for the symbol and its versioned and per-thread-stream forms.

use serde_json::json;
use std::collections::BTreeMap;
use std::process::ExitCode;

use crate::driver::Driver;
use crate::record::print;

pub fn proc_address(
    drv: &Driver,
    symbol: &str,
    version: i32,
    flags: u64,
    v1: bool,
) -> Result<ExitCode, String> {
    let (r, addr, status) = drv.get_proc_address(symbol, version, flags, !v1)?;
    let mut exports = BTreeMap::new();
    for suffix in [
        "", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds",
    ] {
        let n = format!("{symbol}{suffix}");
        if let Some(p) = drv.symbol(&n) {
            exports.insert(n, p as usize);
        }
    }
    let resolved = exports
        .iter()
        .find(|(_, a)| **a == addr && addr != 0)
        .map(|(n, _)| n.clone());
    print(json!({
        "pid": std::process::id(),
        "symbol": symbol,
        "result": r,
        "address": addr,
        "status": if v1 { None } else { Some(status) },
        "resolved": resolved,
        "exports": exports,
    }));
    Ok(ExitCode::SUCCESS)
}
