//! How `cuGetProcAddress` turns a base name into an exported symbol, as the real driver does.
//!
//! 1. Versioned names: a base name maps to the newest variant whose introduction version is
//!    `<= cudaVersion` (table [`VERSIONED`]): `cuMemAlloc` at 3020 or later is `cuMemAlloc_v2`,
//!    below that the plain `cuMemAlloc` (which this library does not export: the 32-bit ABI).
//! 2. With `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` in `flags`, the per-thread-stream form
//!    of the result is used where one is exported: `<name>_ptds` (synchronous copies) or
//!    `<name>_ptsz` (everything else).
//! 3. A name that is already an exported symbol (e.g. `cuMemAlloc_v2`) resolves to itself; the
//!    real driver is stricter here, the sim is lenient so tests can ask for exact symbols.

use crate::types::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

/// Base name -> (introduced in version, symbol), newest first.
pub const VERSIONED: &[(&str, &[(i32, &str)])] = &[
    ("cuMemAlloc", &[(3020, "cuMemAlloc_v2")]),
    ("cuMemFree", &[(3020, "cuMemFree_v2")]),
    ("cuMemAllocPitch", &[(3020, "cuMemAllocPitch_v2")]),
    ("cuMemGetInfo", &[(3020, "cuMemGetInfo_v2")]),
    ("cuDeviceTotalMem", &[(3020, "cuDeviceTotalMem_v2")]),
    ("cuMemcpyHtoD", &[(3020, "cuMemcpyHtoD_v2")]),
    ("cuMemcpyDtoH", &[(3020, "cuMemcpyDtoH_v2")]),
    ("cuMemcpyDtoD", &[(3020, "cuMemcpyDtoD_v2")]),
    ("cuMemcpyHtoDAsync", &[(3020, "cuMemcpyHtoDAsync_v2")]),
    ("cuMemcpyDtoHAsync", &[(3020, "cuMemcpyDtoHAsync_v2")]),
    ("cuMemcpyDtoDAsync", &[(3020, "cuMemcpyDtoDAsync_v2")]),
    (
        "cuCtxCreate",
        &[
            (12050, "cuCtxCreate_v4"),
            (11040, "cuCtxCreate_v3"),
            (3020, "cuCtxCreate_v2"),
        ],
    ),
    ("cuCtxDestroy", &[(4000, "cuCtxDestroy_v2")]),
    ("cuStreamDestroy", &[(4000, "cuStreamDestroy_v2")]),
    ("cuEventDestroy", &[(4000, "cuEventDestroy_v2")]),
    (
        "cuDevicePrimaryCtxRelease",
        &[(11000, "cuDevicePrimaryCtxRelease_v2")],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[(11000, "cuDevicePrimaryCtxReset_v2")],
    ),
    ("cuDeviceGetUuid", &[(11040, "cuDeviceGetUuid_v2")]),
    (
        "cuGraphInstantiate",
        &[
            (12000, "cuGraphInstantiateWithFlags"),
            (11000, "cuGraphInstantiate_v2"),
        ],
    ),
    ("cuGetProcAddress", &[(12000, "cuGetProcAddress_v2")]),
];

/// The symbol that `cuGetProcAddress(symbol, _, version, flags)` returns, given the set of
/// exported names (`exported(name)`), or `None` when there is none.
pub fn resolve(
    symbol: &str,
    version: i32,
    flags: u64,
    exported: impl Fn(&str) -> bool,
) -> Option<String> {
    let base = VERSIONED
        .iter()
        .find(|(b, _)| *b == symbol)
        .and_then(|(_, vs)| vs.iter().find(|(v, _)| *v <= version))
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| symbol.to_string());
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        for suffix in ["_ptds", "_ptsz"] {
            let name = format!("{base}{suffix}");
            if exported(&name) {
                return Some(name);
            }
        }
    }
    exported(&base).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exported(n: &str) -> bool {
        crate::EXPORTED.contains(&n)
    }

    #[test]
    fn versions_and_per_thread_forms() {
        assert_eq!(
            resolve("cuMemAlloc", 12020, 0, exported).as_deref(),
            Some("cuMemAlloc_v2")
        );
        assert_eq!(resolve("cuMemAlloc", 3000, 0, exported), None);
        assert_eq!(
            resolve("cuCtxCreate", 12020, 0, exported).as_deref(),
            Some("cuCtxCreate_v3")
        );
        assert_eq!(
            resolve("cuCtxCreate", 12050, 0, exported).as_deref(),
            Some("cuCtxCreate_v4")
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 12020, 2, exported).as_deref(),
            Some("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 12020, 0, exported).as_deref(),
            Some("cuMemcpyHtoD_v2")
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12020, 2, exported).as_deref(),
            Some("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 12020, 2, exported).as_deref(),
            Some("cuMemAllocAsync_ptsz")
        );
        assert_eq!(
            resolve("cuMemcpy", 12020, 2, exported).as_deref(),
            Some("cuMemcpy_ptds")
        );
        assert_eq!(
            resolve("cuInit", 12020, 2, exported).as_deref(),
            Some("cuInit")
        );
        assert_eq!(
            resolve("cuGraphInstantiate", 12020, 0, exported).as_deref(),
            Some("cuGraphInstantiateWithFlags")
        );
        assert_eq!(resolve("cuNoSuchThing", 12020, 0, exported), None);
        assert_eq!(
            resolve("cuMemAlloc_v2", 12020, 0, exported).as_deref(),
            Some("cuMemAlloc_v2")
        );
    }
}
