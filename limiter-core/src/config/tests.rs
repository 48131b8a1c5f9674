//! Tests of the configuration: HAMi-compatible variables, byte counts, errors that name the
//! variable and the value.

use super::*;

fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_vars(
        pairs
            .iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v))),
    )
}

#[test]
fn byte_counts_parse_like_hami() {
    assert_eq!(parse_bytes("4g"), Ok(4 << 30));
    assert_eq!(parse_bytes("4G"), Ok(4 << 30));
    assert_eq!(parse_bytes("4096m"), Ok(4 << 30));
    assert_eq!(parse_bytes("4096M"), Ok(4 << 30));
    assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
    assert_eq!(parse_bytes("512k"), Ok(512 << 10));
    assert_eq!(parse_bytes("2t"), Ok(2 << 40));
    assert_eq!(parse_bytes("0"), Ok(0));
}

#[test]
fn malformed_byte_counts_are_errors() {
    assert_eq!(parse_bytes("4x"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes("-1"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes("+1"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes(""), Err(BytesError::Empty));
    assert_eq!(parse_bytes("g"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes(" 4g"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes("4.5g"), Err(BytesError::Syntax));
    assert_eq!(parse_bytes("4gb"), Err(BytesError::Syntax));
    assert_eq!(
        parse_bytes("18446744073709551616"),
        Err(BytesError::Overflow)
    );
    assert_eq!(parse_bytes("17179869184g"), Err(BytesError::Overflow));
    assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
}

#[test]
fn empty_environment_means_no_limits() {
    assert_eq!(vars(&[]), Ok(Config::default()));
}

#[test]
fn per_device_overrides_global_in_any_order() {
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
    ])
    .unwrap();
    assert_eq!(c.memory_limit[0], Some(4 << 30));
    assert_eq!(c.memory_limit[1], Some(1 << 30));
    assert_eq!(c.memory_limit[15], Some(4 << 30));
    // A per-device 0 lifts the global limit for that device.
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_2", "0"),
    ])
    .unwrap();
    assert_eq!(c.memory_limit[2], None);
    assert_eq!(c.memory_limit[3], Some(4 << 30));
    let c = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "100m")]).unwrap();
    assert_eq!(c.memory_limit[0], Some(100 << 20));
    assert_eq!(c.memory_limit[1], None);
}

#[test]
fn errors_name_the_variable_and_the_value() {
    let e = vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "4x")]).unwrap_err();
    assert!(matches!(
        e,
        ConfigError::Bytes {
            reason: BytesError::Syntax,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("CUDA_DEVICE_MEMORY_LIMIT") && msg.contains("\"4x\""),
        "{msg}"
    );
    let e = vars(&[("CUDA_DEVICE_MEMORY_LIMIT_3", "")]).unwrap_err();
    assert_eq!(
        e,
        ConfigError::Bytes {
            var: "CUDA_DEVICE_MEMORY_LIMIT_3".into(),
            value: String::new(),
            reason: BytesError::Empty
        }
    );
}

#[test]
fn device_suffixes_must_be_indices() {
    for name in [
        "CUDA_DEVICE_MEMORY_LIMIT_16",
        "CUDA_DEVICE_MEMORY_LIMIT_x",
        "CUDA_DEVICE_MEMORY_LIMIT_",
        "CUDA_DEVICE_SM_LIMIT_01",
    ] {
        let e = vars(&[(name, "1g")]).unwrap_err();
        assert!(matches!(e, ConfigError::DeviceIndex { .. }), "{name}: {e}");
    }
    // Other names that merely share a prefix are not ours.
    assert_eq!(
        vars(&[("CUDA_DEVICE_MEMORY_LIMITX", "junk")]),
        Ok(Config::default())
    );
}

#[test]
fn sm_limits_are_percentages() {
    let c = vars(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("CUDA_DEVICE_SM_LIMIT_1", "100"),
        ("CUDA_DEVICE_SM_LIMIT_2", "0"),
    ])
    .unwrap();
    assert_eq!(c.sm_limit[0], Some(30));
    assert_eq!(c.sm_limit[1], None);
    assert_eq!(c.sm_limit[2], None);
    for bad in ["101", "-1", "", "50%", "+5", "256"] {
        let e = vars(&[("CUDA_DEVICE_SM_LIMIT", bad)]).unwrap_err();
        assert!(matches!(e, ConfigError::SmLimit { .. }), "{bad}: {e}");
    }
    assert_eq!(c.sm_period_ms, DEFAULT_SM_PERIOD_MS);
    let c = vars(&[("VGPU_SM_PERIOD_MS", "50")]).unwrap();
    assert_eq!(c.sm_period_ms, 50);
    for bad in ["9", "1001", "", "+50", "50ms", "-1"] {
        let e = vars(&[("VGPU_SM_PERIOD_MS", bad)]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { var, .. } if var == SM_PERIOD_MS),
            "{bad}: {e}"
        );
    }
    assert!(c.sm_feedback);
    assert!(!vars(&[("VGPU_SM_FEEDBACK", "0")]).unwrap().sm_feedback);
    assert!(vars(&[("VGPU_SM_FEEDBACK", "1")]).unwrap().sm_feedback);
    for bad in ["", "yes", "2", "off"] {
        let e = vars(&[("VGPU_SM_FEEDBACK", bad)]).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { var, .. } if var == SM_FEEDBACK),
            "{bad}: {e}"
        );
    }
}

#[test]
fn log_level_and_paths() {
    let c = vars(&[
        ("LIBCUDA_LOG_LEVEL", "4"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x.cache"),
        ("VGPU_REAL_LIBCUDA", "/opt/libcuda.so.1"),
    ])
    .unwrap();
    assert_eq!(c.log_level, Level::Debug);
    assert_eq!(c.shared_cache, Some(PathBuf::from("/tmp/x.cache")));
    assert_eq!(c.real_libcuda, Some(PathBuf::from("/opt/libcuda.so.1")));
    assert!(matches!(
        vars(&[("LIBCUDA_LOG_LEVEL", "5")]),
        Err(ConfigError::LogLevel { .. })
    ));
    assert!(matches!(
        vars(&[("LIBCUDA_LOG_LEVEL", "debug")]),
        Err(ConfigError::LogLevel { .. })
    ));
    assert!(matches!(
        vars(&[("VGPU_REAL_LIBCUDA", "")]),
        Err(ConfigError::EmptyPath { .. })
    ));
}

#[test]
fn region_path_rules() {
    // No variable and no limit: accounting stays in the process.
    assert_eq!(vars(&[]).unwrap().region_path(), None);
    // A limit without a path: HAMi-core's default path, so the limit holds container-wide.
    assert_eq!(
        vars(&[("CUDA_DEVICE_MEMORY_LIMIT_3", "1g")])
            .unwrap()
            .region_path(),
        Some(PathBuf::from(DEFAULT_SHARED_CACHE))
    );
    // An explicit path always wins, limited or not.
    for limit in ["0", "2g"] {
        let c = vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", limit),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/r/c.cache"),
        ])
        .unwrap();
        assert_eq!(c.region_path(), Some(PathBuf::from("/r/c.cache")));
    }
}

#[test]
fn context_bytes_and_debug_knobs() {
    let c = vars(&[]).unwrap();
    assert_eq!(c.context_bytes, DEFAULT_CONTEXT_BYTES);
    assert_eq!(c.debug_panic_in, None);
    let c = vars(&[
        ("VGPU_CONTEXT_BYTES", "300m"),
        ("VGPU_DEBUG_PANIC_IN", "cuMemAlloc_v2"),
        ("VGPU_REAL_LIBNVML", "/x/libnvidia-ml.so.1"),
    ])
    .unwrap();
    assert_eq!(c.context_bytes, 300 << 20);
    assert_eq!(c.debug_panic_in.as_deref(), Some("cuMemAlloc_v2"));
    assert_eq!(c.real_libnvml, Some(PathBuf::from("/x/libnvidia-ml.so.1")));
    assert_eq!(
        vars(&[("VGPU_CONTEXT_BYTES", "0")]).unwrap().context_bytes,
        0
    );
    assert!(matches!(
        vars(&[("VGPU_CONTEXT_BYTES", "big")]),
        Err(ConfigError::Bytes { .. })
    ));
}
