//! Configuration from the environment, read once per process.

use std::sync::OnceLock;
use std::time::Duration;

/// Default device memory capacity: 80 GiB.
pub const DEFAULT_CAPACITY: u64 = 80 << 30;
/// Default reported driver version (CUDA 12.2).
pub const DEFAULT_DRIVER_VERSION: i32 = 12020;

/// One `name=value` rule; `name` is an exported symbol name or a kind name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule<T> {
    pub name: String,
    pub value: T,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes per device (`SIMCUDA_CAPACITY`).
    pub capacity: u64,
    /// Number of devices (`SIMCUDA_DEVICES`).
    pub devices: i32,
    /// Whether calls before `cuInit` fail with `CUDA_ERROR_NOT_INITIALIZED` (`SIMCUDA_REQUIRE_INIT`).
    pub require_init: bool,
    /// Delay applied to every call without a more specific rule (`SIMCUDA_DELAY_US=N`).
    pub delay_default: Duration,
    /// Per-symbol or per-kind delays (`SIMCUDA_DELAY_US=name=us,...`).
    pub delays: Vec<Rule<Duration>>,
    /// Simulated device time of one launch (`SIMCUDA_LAUNCH_US`).
    pub launch: Duration,
    /// Device time of launches of named kernels instead (`SIMCUDA_KERNEL_US=name=us,...`).
    pub kernels: Vec<Rule<Duration>>,
    /// Failure injection: `name:every_n` (`SIMCUDA_FAIL`).
    pub fail: Vec<Rule<u64>>,
    /// `SIMCUDA_LOG=1`: log configuration and calls to stderr.
    pub log: bool,
    /// Reported by `cuDriverGetVersion` (`SIMCUDA_DRIVER_VERSION`).
    pub driver_version: i32,
    /// Bytes of a private buffer read at the end of every call of a named symbol or kind
    /// (`SIMCUDA_SWEEP=name=bytes,...`): a driver whose work evicts the caller's caches.
    pub sweeps: Vec<Rule<u64>>,
    /// A file through which the launches of every process naming it share one device
    /// (`SIMCUDA_SHARED_DEVICE`): see `shared.rs`.
    pub shared_device: Option<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            capacity: DEFAULT_CAPACITY,
            devices: 1,
            require_init: true,
            delay_default: Duration::ZERO,
            delays: Vec::new(),
            launch: Duration::ZERO,
            kernels: Vec::new(),
            fail: Vec::new(),
            log: false,
            driver_version: DEFAULT_DRIVER_VERSION,
            sweeps: Vec::new(),
            shared_device: None,
        }
    }
}

/// Parses a byte count with an optional `k`, `m`, `g` or `t` suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let lower = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match lower.chars().last()? {
        'k' => (&lower[..lower.len() - 1], 10),
        'm' => (&lower[..lower.len() - 1], 20),
        'g' => (&lower[..lower.len() - 1], 30),
        't' => (&lower[..lower.len() - 1], 40),
        _ => (lower, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

/// Parses `SIMCUDA_DELAY_US`: `N` (all calls) and/or `name=N` rules, comma separated.
pub fn parse_delays(s: &str) -> Result<(Duration, Vec<Rule<Duration>>), String> {
    let mut default = Duration::ZERO;
    let mut rules = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((name, us)) => {
                let us: u64 = us
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad delay {part:?}"))?;
                rules.push(Rule {
                    name: name.trim().to_string(),
                    value: Duration::from_micros(us),
                });
            }
            None => {
                let us: u64 = part.parse().map_err(|_| format!("bad delay {part:?}"))?;
                default = Duration::from_micros(us);
            }
        }
    }
    Ok((default, rules))
}

/// Parses `SIMCUDA_SWEEP`: `name=bytes` rules (byte counts as in [`parse_bytes`]), comma
/// separated.
pub fn parse_sweeps(s: &str) -> Result<Vec<Rule<u64>>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (name, bytes) = part
                .split_once('=')
                .ok_or_else(|| format!("bad sweep rule {part:?} (want name=bytes)"))?;
            let value = parse_bytes(bytes).ok_or_else(|| format!("bad sweep size {part:?}"))?;
            Ok(Rule {
                name: name.trim().to_string(),
                value,
            })
        })
        .collect()
}

/// Parses `SIMCUDA_FAIL`: `name:every_n` rules, comma separated.
pub fn parse_fail(s: &str) -> Result<Vec<Rule<u64>>, String> {
    let mut rules = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, n) = part
            .split_once(':')
            .ok_or_else(|| format!("bad fail rule {part:?}"))?;
        let n: u64 = n
            .trim()
            .parse()
            .map_err(|_| format!("bad fail rule {part:?}"))?;
        if n == 0 {
            return Err(format!("bad fail rule {part:?}: every_n must be >= 1"));
        }
        rules.push(Rule {
            name: name.trim().to_string(),
            value: n,
        });
    }
    Ok(rules)
}

impl Config {
    /// Reads the configuration from a variable lookup (the environment in the library).
    /// Malformed values are reported in the returned warnings and replaced by defaults.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        if let Some(v) = get("SIMCUDA_CAPACITY") {
            match parse_bytes(&v) {
                Some(b) => c.capacity = b,
                None => warnings.push(format!("SIMCUDA_CAPACITY={v:?} is not a byte count")),
            }
        }
        if let Some(v) = get("SIMCUDA_DEVICES") {
            match v.trim().parse::<i32>() {
                Ok(n) if n >= 0 => c.devices = n,
                _ => warnings.push(format!("SIMCUDA_DEVICES={v:?} is not a device count")),
            }
        }
        if let Some(v) = get("SIMCUDA_REQUIRE_INIT") {
            c.require_init = !matches!(v.trim(), "0" | "false" | "no");
        }
        if let Some(v) = get("SIMCUDA_DELAY_US") {
            match parse_delays(&v) {
                Ok((d, r)) => (c.delay_default, c.delays) = (d, r),
                Err(e) => warnings.push(format!("SIMCUDA_DELAY_US: {e}")),
            }
        }
        if let Some(v) = get("SIMCUDA_LAUNCH_US") {
            match v.trim().parse::<u64>() {
                Ok(us) => c.launch = Duration::from_micros(us),
                Err(_) => warnings.push(format!("SIMCUDA_LAUNCH_US={v:?} is not a number")),
            }
        }
        if let Some(v) = get("SIMCUDA_KERNEL_US") {
            match parse_delays(&v) {
                Ok((d, r)) if d.is_zero() => c.kernels = r,
                _ => warnings.push(format!("SIMCUDA_KERNEL_US={v:?}: want name=us,...")),
            }
        }
        if let Some(v) = get("SIMCUDA_FAIL") {
            match parse_fail(&v) {
                Ok(r) => c.fail = r,
                Err(e) => warnings.push(format!("SIMCUDA_FAIL: {e}")),
            }
        }
        if let Some(v) = get("SIMCUDA_SWEEP") {
            match parse_sweeps(&v) {
                Ok(r) => c.sweeps = r,
                Err(e) => warnings.push(format!("SIMCUDA_SWEEP: {e}")),
            }
        }
        if let Some(v) = get("SIMCUDA_SHARED_DEVICE") {
            if v.is_empty() {
                warnings.push("SIMCUDA_SHARED_DEVICE is empty".to_string());
            } else {
                c.shared_device = Some(v);
            }
        }
        if let Some(v) = get("SIMCUDA_LOG") {
            c.log = v.trim() == "1";
        }
        if let Some(v) = get("SIMCUDA_DRIVER_VERSION") {
            match v.trim().parse::<i32>() {
                Ok(n) => c.driver_version = n,
                Err(_) => warnings.push(format!("SIMCUDA_DRIVER_VERSION={v:?} is not a number")),
            }
        }
        (c, warnings)
    }

    /// The delay of one call of `name` (kind `kind`): a rule naming the symbol wins over one
    /// naming its kind, which wins over the global default.
    pub fn delay_for(&self, name: &str, kind: Option<&str>) -> Duration {
        lookup(&self.delays, name, kind).unwrap_or(self.delay_default)
    }

    /// Bytes swept at the end of each call of `name` (kind `kind`); 0 = none.
    pub fn sweep_for(&self, name: &str, kind: Option<&str>) -> u64 {
        lookup(&self.sweeps, name, kind).unwrap_or(0)
    }

    /// Every how many calls `name` fails with error 999 (0 = never).
    pub fn fail_every(&self, name: &str, kind: Option<&str>) -> u64 {
        lookup(&self.fail, name, kind).unwrap_or(0)
    }
}

fn lookup<T: Copy>(rules: &[Rule<T>], name: &str, kind: Option<&str>) -> Option<T> {
    rules
        .iter()
        .rev()
        .find(|r| r.name == name)
        .or_else(|| kind.and_then(|k| rules.iter().rev().find(|r| r.name == k)))
        .map(|r| r.value)
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process-wide configuration, read from the environment on first use.
pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (c, warnings) = Config::from_lookup(|k| std::env::var(k).ok());
        if c.log {
            eprintln!("simcuda: {c:?}");
        }
        for w in warnings {
            // Malformed configuration is worth a line even without SIMCUDA_LOG: a test would
            // otherwise silently run with defaults.
            eprintln!("simcuda: warning: {w}");
        }
        c
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("80g"), Some(80 << 30));
        assert_eq!(parse_bytes("512"), Some(512));
        assert_eq!(parse_bytes("4K"), Some(4096));
        assert_eq!(parse_bytes("3m"), Some(3 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn delays_and_failures() {
        let env = |k: &str| match k {
            "SIMCUDA_DELAY_US" => Some("5, alloc=100,cuMemAlloc_v2=200".to_string()),
            "SIMCUDA_FAIL" => Some("cuLaunchKernel:3,sync:2".to_string()),
            "SIMCUDA_CAPACITY" => Some("1m".to_string()),
            _ => None,
        };
        let (c, w) = Config::from_lookup(env);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.capacity, 1 << 20);
        assert_eq!(
            c.delay_for("cuMemAlloc_v2", Some("alloc")),
            Duration::from_micros(200)
        );
        assert_eq!(
            c.delay_for("cuMemAllocManaged", Some("alloc")),
            Duration::from_micros(100)
        );
        assert_eq!(
            c.delay_for("cuInit", Some("lifecycle")),
            Duration::from_micros(5)
        );
        assert_eq!(c.delay_for("cuDeviceGet", None), Duration::from_micros(5));
        assert_eq!(c.fail_every("cuLaunchKernel", Some("launch")), 3);
        assert_eq!(c.fail_every("cuCtxSynchronize", Some("sync")), 2);
        assert_eq!(c.fail_every("cuMemAlloc_v2", Some("alloc")), 0);
    }

    #[test]
    fn sweeps() {
        let env = |k: &str| match k {
            "SIMCUDA_SWEEP" => Some("alloc=64m, cuMemFree_v2=1k".to_string()),
            _ => None,
        };
        let (c, w) = Config::from_lookup(env);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.sweep_for("cuMemAlloc_v2", Some("alloc")), 64 << 20);
        assert_eq!(c.sweep_for("cuMemFree_v2", Some("free")), 1024);
        assert_eq!(c.sweep_for("cuCtxGetDevice", None), 0);
    }

    #[test]
    fn malformed_values_warn_and_keep_defaults() {
        let env = |k: &str| match k {
            "SIMCUDA_CAPACITY" => Some("lots".to_string()),
            "SIMCUDA_FAIL" => Some("cuInit:0".to_string()),
            "SIMCUDA_REQUIRE_INIT" => Some("0".to_string()),
            "SIMCUDA_SWEEP" => Some("alloc".to_string()),
            _ => None,
        };
        let (c, w) = Config::from_lookup(env);
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(c.capacity, DEFAULT_CAPACITY);
        assert!(c.fail.is_empty());
        assert!(c.sweeps.is_empty());
        assert!(!c.require_init);
    }
}
