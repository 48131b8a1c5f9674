//! Configuration from the environment, compatible with HAMi-core's variables.
//!
//! Read once, at the first CUDA call, never on a call and never in a process that does not use
//! CUDA. Parsing is pure: [`Config::from_vars`] takes the variables as pairs (the limiter passes
//! the process environment's), so it is tested without touching the process environment. A
//! malformed value is an error naming the variable and the value; the limiter then fails every
//! intercepted call rather than run unlimited.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use agent_common::MAX_DEVICES;

use crate::gpu_time::SampleRate;
use crate::qos::Tier;

pub(crate) const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
pub(crate) const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
pub(crate) const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
pub(crate) const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
pub const REAL_LIBCUDA: &str = "VGPU_REAL_LIBCUDA";
pub const REAL_LIBNVML: &str = "VGPU_REAL_LIBNVML";
pub(crate) const CONTEXT_BYTES: &str = "VGPU_CONTEXT_BYTES";
pub(crate) const DEBUG_PANIC_IN: &str = "VGPU_DEBUG_PANIC_IN";
pub(crate) const DEBUG_HOOK_DELAY_NS: &str = "VGPU_DEBUG_HOOK_DELAY_NS";
pub(crate) const SM_PERIOD_MS: &str = "VGPU_SM_PERIOD_MS";
pub(crate) const SM_FEEDBACK: &str = "VGPU_SM_FEEDBACK";
pub(crate) const GPU_TIME_SAMPLE: &str = "VGPU_GPU_TIME_SAMPLE";
pub(crate) const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
pub(crate) const OOM_WAIT: &str = "VGPU_OOM_WAIT";
pub(crate) const FREEZE_AFTER: &str = "VGPU_FREEZE_AFTER";
pub(crate) const FREEZE_IN_PROCESS: &str = "VGPU_FREEZE_IN_PROCESS";
/// Where the agent's freeze pool listens (`region::freeze_pool::SOCKET_ENV`: the limiter's tests
/// check that the two agree; this crate does not depend on `region`).
pub const FREEZE_POOL_SOCKET: &str = "VGPU_FREEZE_POOL_SOCKET";
/// The longest `VGPU_FREEZE_AFTER` accepted (a week).
pub(crate) const MAX_FREEZE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest `VGPU_OOM_WAIT` accepted: an allocation is never held longer than this.
pub(crate) const MAX_OOM_WAIT: Duration = Duration::from_secs(3600);
pub(crate) const QOS_TIER: &str = "VGPU_QOS_TIER";
pub(crate) const QOS_GUARANTEE: &str = "VGPU_QOS_GUARANTEE";
pub(crate) const QOS_BOARD: &str = "VGPU_QOS_BOARD";
/// HAMi-core's priority: 0 high, 1 low (its default).
pub(crate) const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";

/// The SM controller's period when `VGPU_SM_PERIOD_MS` is unset (see [`crate::sm`]).
pub(crate) const DEFAULT_SM_PERIOD_MS: u64 = 100;
/// Accepted `VGPU_SM_PERIOD_MS` values.
pub(crate) const SM_PERIOD_RANGE_MS: std::ops::RangeInclusive<u64> = 10..=1000;

/// HAMi-core's region path when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset; used when a memory
/// limit is set, so that the limit holds across all processes of the container.
pub(crate) const DEFAULT_SHARED_CACHE: &str = "/tmp/cudevshr.cache";

/// Context memory charged per process and device by default. Measured on the GPU machine
/// (NVIDIA H200, driver 580.159.04, 2026-11-22): nvidia-smi showed 518 MiB per process beyond
/// its allocations (scripts/gpu/validate-limiter.sh, docs/gpu-validation.md); 544 MiB leaves 5%
/// for other GPUs and drivers, so that what nvidia-smi shows stays under the limit. Set
/// `VGPU_CONTEXT_BYTES` to what your GPU shows.
pub(crate) const DEFAULT_CONTEXT_BYTES: u64 = 544 << 20;

/// HAMi-core's `LIBCUDA_LOG_LEVEL` scale.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// 0: nothing at all, not even configuration errors.
    Silent = 0,
    /// 1 (default): errors.
    Error = 1,
    /// 2: warnings.
    Warn = 2,
    /// 3: information.
    Info = 3,
    /// 4: debugging detail.
    Debug = 4,
}

impl Level {
    pub(crate) const DEFAULT: Level = Level::Error;

    pub(crate) const fn from_u8(v: u8) -> Option<Level> {
        match v {
            0 => Some(Level::Silent),
            1 => Some(Level::Error),
            2 => Some(Level::Warn),
            3 => Some(Level::Info),
            4 => Some(Level::Debug),
            _ => None,
        }
    }

    /// How a message of this level is tagged.
    pub const fn tag(self) -> &'static str {
        match self {
            Level::Silent => "",
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        }
    }
}

/// Why a byte count does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytesError {
    #[error("empty value")]
    Empty,
    #[error("expected digits followed by an optional k, m, g or t suffix")]
    Syntax,
    #[error("does not fit in 64 bits")]
    Overflow,
}

/// A configuration error: the variable, its value and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A memory limit that is not a byte count.
    #[error("{var}={value:?}: invalid byte count: {reason}")]
    Bytes {
        var: String,
        value: String,
        #[source]
        reason: BytesError,
    },
    /// An SM limit outside 0..=100.
    #[error("{var}={value:?}: expected a percentage from 0 to 100")]
    SmLimit { var: String, value: String },
    /// A log level outside 0..=4.
    #[error("{var}={value:?}: expected a log level from 0 (silent) to 4 (debug)")]
    LogLevel { var: String, value: String },
    /// A per-device suffix that is not a device index below [`MAX_DEVICES`].
    #[error("{var}: the suffix after {prefix}_ must be a device index from 0 to {max}", max = MAX_DEVICES - 1)]
    DeviceIndex { var: String, prefix: &'static str },
    /// An empty path.
    #[error("{var} is set but empty")]
    EmptyPath { var: String },
    /// A variable of ours whose name or value is not UTF-8.
    #[error("{var}: value is not valid UTF-8")]
    NotUnicode { var: String },
    /// Any other malformed value, with what was expected.
    #[error("{var}={value:?}: {reason}")]
    Invalid {
        var: String,
        value: String,
        reason: String,
    },
}

/// The limiter's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Memory limit per device in bytes; `None` (unset or `0`) means no limit.
    pub memory_limit: [Option<u64>; MAX_DEVICES],
    /// SM share per device in percent; `None` (unset, `0` or `100`) means no SM limit.
    pub sm_limit: [Option<u8>; MAX_DEVICES],
    /// The SM controller's period in milliseconds (`VGPU_SM_PERIOD_MS`).
    pub sm_period_ms: u64,
    /// The closed-loop correction of SM shares and what it measures (`VGPU_SM_FEEDBACK`).
    pub sm_feedback: SmFeedback,
    /// Path of the shared accounting region (`CUDA_DEVICE_MEMORY_SHARED_CACHE`).
    pub shared_cache: Option<PathBuf>,
    pub log_level: Level,
    /// Where the real driver is (`VGPU_REAL_LIBCUDA`); `None` means `libcuda.so.1`.
    pub real_libcuda: Option<PathBuf>,
    /// Where the real NVML is (`VGPU_REAL_LIBNVML`); `None` means `libnvidia-ml.so.1`.
    pub real_libnvml: Option<PathBuf>,
    /// Context memory charged per process and device at its first allocation there
    /// (`VGPU_CONTEXT_BYTES`, default [`DEFAULT_CONTEXT_BYTES`]; `0` charges none).
    pub context_bytes: u64,
    /// Test knob (`VGPU_DEBUG_PANIC_IN=<hooked symbol>`): the limiter's logic of that hook panics,
    /// to show that the panic is caught, counted and the call still reaches the driver.
    pub debug_panic_in: Option<String>,
    /// Test knob (`VGPU_DEBUG_HOOK_DELAY_NS`): every launch hook busy-waits this long and records
    /// it as hook self-time, so that attribution can be checked against a known limiter cost.
    pub debug_hook_delay_ns: u64,
    /// How often launches are timed on the GPU (`VGPU_GPU_TIME_SAMPLE`: `auto`, the default,
    /// about 200 samples per second per launching thread; `N`: every Nth launch; `0` or `off`:
    /// never).
    pub gpu_time_sample: SampleRate,
    /// HAMi's `CUDA_OVERSUBSCRIBE=true` (set when its device memory scaling is above 1): the
    /// containers' limits may add up to more than the GPU. Only the exact value `true` counts, as
    /// HAMi-core compares it. No limit is loosened by it; it says that the GPU running out before
    /// a limit is expected, so the limiter reports it as information instead of a warning.
    pub oversubscribe: bool,
    /// How long an allocation that the GPU has no physical room for waits for memory to free
    /// (`VGPU_OOM_WAIT`, a duration; unset, `0` or `off`: not at all, the caller gets
    /// `CUDA_ERROR_OUT_OF_MEMORY` at once).
    pub oom_wait: Option<Duration>,
    /// How long the container may stay idle (no CUDA call) before the agent freezes it
    /// (`VGPU_FREEZE_AFTER`, a duration; unset, `0` or `off`: the operator's `--freeze-after`
    /// alone), published in the region for the agent (docs/oversubscription.md).
    pub freeze_after: Option<Duration>,
    /// Whether a freeze of this container moves its memory itself, in-process
    /// (`VGPU_FREEZE_IN_PROCESS`: `1` or `on`; unset, `0` or `off`: the driver's checkpoint API
    /// alone): the limiter backs the allocations of `cuMemAlloc` with the virtual memory API so
    /// that it can release their physical memory and map it again at the same addresses
    /// (docs/oversubscription.md).
    pub freeze_in_process: bool,
    /// The agent's freeze pool socket (`VGPU_FREEZE_POOL_SOCKET`; unset or empty: the default
    /// path, `region::freeze_pool::DEFAULT_SOCKET`): where an in-process freeze borrows host
    /// memory populated beforehand (docs/oversubscription.md).
    pub freeze_pool_socket: Option<PathBuf>,
    /// The container's QoS tier (`VGPU_QOS_TIER` and `VGPU_QOS_GUARANTEE`, else HAMi's
    /// `CUDA_TASK_PRIORITY`: 0 is latency, 1 best effort); `None`: no tier, the SM limit alone.
    pub qos_tier: Option<Tier>,
    /// The node's QoS board (`VGPU_QOS_BOARD`): a file every container on the node maps, where
    /// each publishes its tier and use and reads the others'.
    pub qos_board: Option<PathBuf>,
}

/// What the SM share's closed loop measures the container's share with (`VGPU_SM_FEEDBACK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmFeedback {
    /// `auto` or `1` (the default): the GPU time the container's limiters sample where they
    /// sampled enough of it, else NVML's per-process samples.
    Auto,
    /// `gpu-time`: only the limiters' sampled GPU time (no correction without it).
    GpuTime,
    /// `nvml`: only NVML's per-process samples.
    Nvml,
    /// `off` or `0`: open loop, no thread.
    Off,
}

impl Config {
    /// The region path: `CUDA_DEVICE_MEMORY_SHARED_CACHE` when set, else HAMi-core's default
    /// path when some device has a memory limit, else none (accounting stays in the process).
    pub fn region_path(&self) -> Option<PathBuf> {
        self.shared_cache.clone().or_else(|| {
            self.memory_limit
                .iter()
                .any(Option::is_some)
                .then(|| PathBuf::from(DEFAULT_SHARED_CACHE))
        })
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            memory_limit: [None; MAX_DEVICES],
            sm_limit: [None; MAX_DEVICES],
            sm_period_ms: DEFAULT_SM_PERIOD_MS,
            sm_feedback: SmFeedback::Auto,
            shared_cache: None,
            log_level: Level::DEFAULT,
            real_libcuda: None,
            real_libnvml: None,
            context_bytes: DEFAULT_CONTEXT_BYTES,
            debug_panic_in: None,
            debug_hook_delay_ns: 0,
            gpu_time_sample: SampleRate::default(),
            oversubscribe: false,
            oom_wait: None,
            freeze_after: None,
            freeze_in_process: false,
            freeze_pool_socket: None,
            qos_tier: None,
            qos_board: None,
        }
    }
}

/// Parses a byte count: decimal digits with an optional binary suffix `k`, `m`, `g` or `t` (either
/// case), as HAMi-core accepts: `"4g"`, `"4096m"`, `"1073741824"`. The one parser of sizes: the
/// limiter reads its environment with it, and the agent the limits it writes.
pub fn parse_bytes(s: &str) -> Result<u64, BytesError> {
    if s.is_empty() {
        return Err(BytesError::Empty);
    }
    let (digits, shift) = match s.as_bytes()[s.len() - 1].to_ascii_lowercase() {
        b'k' => (&s[..s.len() - 1], 10),
        b'm' => (&s[..s.len() - 1], 20),
        b'g' => (&s[..s.len() - 1], 30),
        b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BytesError::Syntax);
    }
    let n: u64 = digits.parse().map_err(|_| BytesError::Overflow)?;
    n.checked_mul(1u64 << shift).ok_or(BytesError::Overflow)
}

/// Why a duration does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("expected digits followed by a unit: ms, s, m or h (e.g. 500ms, 30s, 2m, 1h)")]
    Syntax,
    #[error("longer than {0} s")]
    TooLong(u64),
}

/// Parses a duration: decimal digits followed by `ms`, `s`, `m` or `h` (`"500ms"`, `"30s"`,
/// `"2m"`, `"1h"`), at most [`MAX_OOM_WAIT`]. Whole numbers only, as byte counts are: the
/// limiter's variables are written by programs, and one spelling per value keeps them comparable.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    parse_duration_within(s, MAX_OOM_WAIT)
}

/// [`parse_duration`], at most `max`.
pub(crate) fn parse_duration_within(s: &str, max: Duration) -> Result<Duration, DurationError> {
    let too_long = DurationError::TooLong(max.as_secs());
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(DurationError::Syntax)?;
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(DurationError::Syntax);
    }
    let n: u64 = digits.parse().map_err(|_| too_long.clone())?;
    let secs = |per: u64| {
        n.checked_mul(per)
            .map(Duration::from_secs)
            .ok_or(too_long.clone())
    };
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => secs(60)?,
        "h" => secs(3600)?,
        _ => return Err(DurationError::Syntax),
    };
    if d > max {
        return Err(too_long);
    }
    Ok(d)
}

/// What a variable name means to us.
enum Var {
    Memory(Option<usize>),
    Sm(Option<usize>),
    SharedCache,
    LogLevel,
    RealLibcuda,
    RealLibnvml,
    ContextBytes,
    DebugPanicIn,
    DebugHookDelayNs,
    SmPeriodMs,
    SmFeedback,
    GpuTimeSample,
    Oversubscribe,
    OomWait,
    FreezeAfter,
    FreezeInProcess,
    FreezePoolSocket,
    QosTier,
    QosGuarantee,
    QosBoard,
    TaskPriority,
}

fn classify(name: &str) -> Result<Option<Var>, ConfigError> {
    fn indexed(name: &str, prefix: &'static str) -> Result<Option<Option<usize>>, ConfigError> {
        let Some(rest) = name.strip_prefix(prefix) else {
            return Ok(None);
        };
        if rest.is_empty() {
            return Ok(Some(None));
        }
        let Some(idx) = rest.strip_prefix('_') else {
            return Ok(None);
        };
        let bad = || ConfigError::DeviceIndex {
            var: name.to_owned(),
            prefix,
        };
        if idx.is_empty()
            || !idx.bytes().all(|b| b.is_ascii_digit())
            || (idx.len() > 1 && idx.starts_with('0'))
        {
            return Err(bad());
        }
        match idx.parse::<usize>() {
            Ok(i) if i < MAX_DEVICES => Ok(Some(Some(i))),
            _ => Err(bad()),
        }
    }
    // CUDA_DEVICE_MEMORY_SHARED_CACHE shares the prefix CUDA_DEVICE_MEMORY_: match it first.
    if name == SHARED_CACHE {
        return Ok(Some(Var::SharedCache));
    }
    if name == LOG_LEVEL {
        return Ok(Some(Var::LogLevel));
    }
    match name {
        REAL_LIBCUDA => return Ok(Some(Var::RealLibcuda)),
        REAL_LIBNVML => return Ok(Some(Var::RealLibnvml)),
        CONTEXT_BYTES => return Ok(Some(Var::ContextBytes)),
        DEBUG_PANIC_IN => return Ok(Some(Var::DebugPanicIn)),
        DEBUG_HOOK_DELAY_NS => return Ok(Some(Var::DebugHookDelayNs)),
        SM_PERIOD_MS => return Ok(Some(Var::SmPeriodMs)),
        SM_FEEDBACK => return Ok(Some(Var::SmFeedback)),
        GPU_TIME_SAMPLE => return Ok(Some(Var::GpuTimeSample)),
        OVERSUBSCRIBE => return Ok(Some(Var::Oversubscribe)),
        OOM_WAIT => return Ok(Some(Var::OomWait)),
        FREEZE_AFTER => return Ok(Some(Var::FreezeAfter)),
        FREEZE_IN_PROCESS => return Ok(Some(Var::FreezeInProcess)),
        FREEZE_POOL_SOCKET => return Ok(Some(Var::FreezePoolSocket)),
        QOS_TIER => return Ok(Some(Var::QosTier)),
        QOS_GUARANTEE => return Ok(Some(Var::QosGuarantee)),
        QOS_BOARD => return Ok(Some(Var::QosBoard)),
        TASK_PRIORITY => return Ok(Some(Var::TaskPriority)),
        _ => {}
    }
    if let Some(i) = indexed(name, MEMORY_LIMIT)? {
        return Ok(Some(Var::Memory(i)));
    }
    if let Some(i) = indexed(name, SM_LIMIT)? {
        return Ok(Some(Var::Sm(i)));
    }
    Ok(None)
}

impl Config {
    /// Builds the configuration from `(name, value)` pairs. Per-device variables override the
    /// global one whatever their order; the first error found is returned.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        let mut mem_global = None;
        let mut mem_dev = [None; MAX_DEVICES];
        let mut sm_global = None;
        let mut sm_dev = [None; MAX_DEVICES];
        // The tier named, the guarantee (per mille) and HAMi's priority, resolved at the end.
        let (mut tier, mut guarantee, mut priority) = (None::<&'static str>, None, None);
        for (name, value) in vars {
            // Names that are not UTF-8 cannot be ours.
            let Some(name) = name.to_str() else { continue };
            let Some(var) = classify(name)? else { continue };
            let value = value.into_string().map_err(|_| ConfigError::NotUnicode {
                var: name.to_owned(),
            })?;
            match var {
                Var::Memory(idx) => {
                    let bytes = parse_bytes(&value).map_err(|reason| ConfigError::Bytes {
                        var: name.to_owned(),
                        value: value.clone(),
                        reason,
                    })?;
                    let limit = (bytes != 0).then_some(bytes);
                    match idx {
                        None => mem_global = Some(limit),
                        Some(i) => mem_dev[i] = Some(limit),
                    }
                }
                Var::Sm(idx) => {
                    let pct = match value.parse::<u8>() {
                        Ok(p) if p <= 100 && !value.starts_with('+') => p,
                        _ => {
                            return Err(ConfigError::SmLimit {
                                var: name.to_owned(),
                                value,
                            });
                        }
                    };
                    let limit = (pct != 0 && pct != 100).then_some(pct);
                    match idx {
                        None => sm_global = Some(limit),
                        Some(i) => sm_dev[i] = Some(limit),
                    }
                }
                Var::SharedCache => {
                    if value.is_empty() {
                        return Err(ConfigError::EmptyPath {
                            var: name.to_owned(),
                        });
                    }
                    cfg.shared_cache = Some(PathBuf::from(value));
                }
                Var::RealLibcuda => {
                    if value.is_empty() {
                        return Err(ConfigError::EmptyPath {
                            var: name.to_owned(),
                        });
                    }
                    cfg.real_libcuda = Some(PathBuf::from(value));
                }
                Var::RealLibnvml => {
                    if value.is_empty() {
                        return Err(ConfigError::EmptyPath {
                            var: name.to_owned(),
                        });
                    }
                    cfg.real_libnvml = Some(PathBuf::from(value));
                }
                Var::ContextBytes => {
                    cfg.context_bytes =
                        parse_bytes(&value).map_err(|reason| ConfigError::Bytes {
                            var: name.to_owned(),
                            value: value.clone(),
                            reason,
                        })?;
                }
                Var::DebugPanicIn => cfg.debug_panic_in = Some(value),
                Var::DebugHookDelayNs => {
                    cfg.debug_hook_delay_ns = value
                        .parse::<u64>()
                        .ok()
                        .filter(|ns| *ns <= 1_000_000_000)
                        .ok_or_else(|| ConfigError::Invalid {
                            var: name.to_owned(),
                            value: value.clone(),
                            reason: "expected nanoseconds, 0 to 1000000000".into(),
                        })?;
                }
                Var::SmPeriodMs => {
                    cfg.sm_period_ms = value
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| SM_PERIOD_RANGE_MS.contains(ms) && !value.starts_with('+'))
                        .ok_or_else(|| ConfigError::Invalid {
                            var: name.to_owned(),
                            value: value.clone(),
                            reason: format!(
                                "expected milliseconds, {} to {}",
                                SM_PERIOD_RANGE_MS.start(),
                                SM_PERIOD_RANGE_MS.end()
                            ),
                        })?;
                }
                Var::GpuTimeSample => {
                    cfg.gpu_time_sample = match value.as_str() {
                        "auto" => SampleRate::default(),
                        "0" | "off" => SampleRate::Off,
                        n => n
                            .parse::<u32>()
                            .ok()
                            .filter(|_| !n.starts_with('+'))
                            .map(SampleRate::Every)
                            .ok_or_else(|| ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: "expected auto, off, or N (time every Nth launch)".into(),
                            })?,
                    };
                }
                // HAMi-core: `strcmp(getenv("CUDA_OVERSUBSCRIBE"), "true") == 0`; anything else
                // (including `1` or `TRUE`) leaves it off, and is no error.
                Var::Oversubscribe => cfg.oversubscribe = value == "true",
                Var::OomWait => {
                    cfg.oom_wait = match value.as_str() {
                        "0" | "off" => None,
                        v => Some(parse_duration(v).map_err(|reason| ConfigError::Invalid {
                            var: name.to_owned(),
                            value: value.clone(),
                            reason: reason.to_string(),
                        })?)
                        .filter(|d| !d.is_zero()),
                    };
                }
                Var::FreezeAfter => {
                    cfg.freeze_after = match value.as_str() {
                        "0" | "off" => None,
                        v => Some(parse_duration_within(v, MAX_FREEZE_AFTER).map_err(
                            |reason| ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: reason.to_string(),
                            },
                        )?)
                        .filter(|d| !d.is_zero()),
                    };
                }
                Var::FreezeInProcess => {
                    cfg.freeze_in_process = match value.as_str() {
                        "1" | "on" => true,
                        "0" | "off" | "" => false,
                        _ => {
                            return Err(ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: "expected 1 (or on) or 0 (or off)".into(),
                            });
                        }
                    };
                }
                Var::SmFeedback => {
                    cfg.sm_feedback = match value.as_str() {
                        "1" | "auto" => SmFeedback::Auto,
                        "gpu-time" => SmFeedback::GpuTime,
                        "nvml" => SmFeedback::Nvml,
                        "0" | "off" => SmFeedback::Off,
                        _ => {
                            return Err(ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: "expected auto (or 1), gpu-time, nvml, or off (or 0)"
                                    .into(),
                            });
                        }
                    };
                }
                Var::QosTier => {
                    tier = Some(match value.as_str() {
                        "latency" => "latency",
                        "guaranteed" => "guaranteed",
                        "best-effort" => "best-effort",
                        _ => {
                            return Err(ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: "expected latency, guaranteed or best-effort".into(),
                            });
                        }
                    });
                }
                Var::QosGuarantee => {
                    let pct = value
                        .parse::<u8>()
                        .ok()
                        .filter(|p| (1..=100).contains(p) && !value.starts_with('+'))
                        .ok_or_else(|| ConfigError::Invalid {
                            var: name.to_owned(),
                            value: value.clone(),
                            reason: "expected a share of the GPU in percent, 1 to 100".into(),
                        })?;
                    guarantee = Some((u16::from(pct) * 10, value));
                }
                Var::QosBoard => {
                    cfg.qos_board = (!value.is_empty()).then(|| PathBuf::from(&value));
                }
                Var::FreezePoolSocket => {
                    cfg.freeze_pool_socket = (!value.is_empty()).then(|| PathBuf::from(&value));
                }
                Var::TaskPriority => {
                    // HAMi-core reads it with atoi: accept its two meaningful values.
                    priority = Some(match value.trim() {
                        "0" => Tier::Latency,
                        "1" => Tier::BestEffort,
                        _ => {
                            return Err(ConfigError::Invalid {
                                var: name.to_owned(),
                                value: value.clone(),
                                reason: "expected 0 (high priority) or 1 (low)".into(),
                            });
                        }
                    });
                }
                Var::LogLevel => {
                    cfg.log_level = value
                        .parse::<u8>()
                        .ok()
                        .filter(|_| !value.starts_with('+'))
                        .and_then(Level::from_u8)
                        .ok_or_else(|| ConfigError::LogLevel {
                            var: name.to_owned(),
                            value,
                        })?;
                }
            }
        }
        for i in 0..MAX_DEVICES {
            cfg.memory_limit[i] = mem_dev[i].unwrap_or(mem_global.flatten());
            cfg.sm_limit[i] = sm_dev[i].unwrap_or(sm_global.flatten());
        }
        cfg.qos_tier = match (tier, guarantee) {
            (Some("guaranteed") | None, Some((g, _))) => Some(Tier::Guaranteed(g)),
            (Some("guaranteed"), None) => {
                return Err(ConfigError::Invalid {
                    var: QOS_TIER.to_owned(),
                    value: "guaranteed".into(),
                    reason: format!("the guaranteed tier needs {QOS_GUARANTEE} (percent)"),
                });
            }
            (Some(t), Some((_, value))) => {
                return Err(ConfigError::Invalid {
                    var: QOS_GUARANTEE.to_owned(),
                    value,
                    reason: format!("only the guaranteed tier takes a guarantee, not {t}"),
                });
            }
            (Some("latency"), None) => Some(Tier::Latency),
            (Some(_), None) => Some(Tier::BestEffort),
            (None, None) => priority,
        };
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.sm_feedback, SmFeedback::Auto);
        for (v, feedback) in [
            ("1", SmFeedback::Auto),
            ("auto", SmFeedback::Auto),
            ("gpu-time", SmFeedback::GpuTime),
            ("nvml", SmFeedback::Nvml),
            ("0", SmFeedback::Off),
            ("off", SmFeedback::Off),
        ] {
            assert_eq!(
                vars(&[("VGPU_SM_FEEDBACK", v)]).unwrap().sm_feedback,
                feedback,
                "{v}"
            );
        }
        assert_eq!(c.gpu_time_sample, SampleRate::default());
        for (v, rate) in [
            ("auto", SampleRate::default()),
            ("off", SampleRate::Off),
            ("0", SampleRate::Off),
            ("1", SampleRate::Every(1)),
            ("64", SampleRate::Every(64)),
        ] {
            let c = vars(&[("VGPU_GPU_TIME_SAMPLE", v)]).unwrap();
            assert_eq!(c.gpu_time_sample, rate, "{v}");
        }
        for bad in ["", "-1", "+3", "often"] {
            assert!(vars(&[("VGPU_GPU_TIME_SAMPLE", bad)]).is_err(), "{bad:?}");
        }
        for bad in ["", "yes", "2", "Auto", "gpu_time"] {
            let e = vars(&[("VGPU_SM_FEEDBACK", bad)]).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { var, .. } if var == SM_FEEDBACK),
                "{bad}: {e}"
            );
        }
        // QoS tiers: the project's variables, else HAMi's priority.
        assert_eq!(c.qos_tier, None);
        for (pairs, tier) in [
            (&[("VGPU_QOS_TIER", "latency")][..], Tier::Latency),
            (&[("VGPU_QOS_TIER", "best-effort")][..], Tier::BestEffort),
            (
                &[
                    ("VGPU_QOS_TIER", "guaranteed"),
                    ("VGPU_QOS_GUARANTEE", "30"),
                ][..],
                Tier::Guaranteed(300),
            ),
            (&[("VGPU_QOS_GUARANTEE", "70")][..], Tier::Guaranteed(700)),
            (&[("CUDA_TASK_PRIORITY", "0")][..], Tier::Latency),
            (&[("CUDA_TASK_PRIORITY", "1")][..], Tier::BestEffort),
            (
                &[("CUDA_TASK_PRIORITY", "1"), ("VGPU_QOS_TIER", "latency")][..],
                Tier::Latency,
            ),
        ] {
            assert_eq!(vars(pairs).unwrap().qos_tier, Some(tier), "{pairs:?}");
        }
        for bad in [
            &[("VGPU_QOS_TIER", "gold")][..],
            &[("VGPU_QOS_TIER", "guaranteed")][..],
            &[("VGPU_QOS_TIER", "latency"), ("VGPU_QOS_GUARANTEE", "30")][..],
            &[("VGPU_QOS_GUARANTEE", "0")][..],
            &[("VGPU_QOS_GUARANTEE", "101")][..],
            &[("VGPU_QOS_GUARANTEE", "30%")][..],
            &[("CUDA_TASK_PRIORITY", "2")][..],
        ] {
            assert!(vars(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            vars(&[("VGPU_QOS_BOARD", "/run/vgpu/qos.board")])
                .unwrap()
                .qos_board,
            Some(PathBuf::from("/run/vgpu/qos.board"))
        );
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

    #[test]
    fn oversubscribe_is_on_only_for_the_exact_value_hami_sets() {
        assert!(!vars(&[]).unwrap().oversubscribe);
        assert!(
            vars(&[("CUDA_OVERSUBSCRIBE", "true")])
                .unwrap()
                .oversubscribe
        );
        for other in ["TRUE", "1", "yes", "", "true "] {
            let c = vars(&[("CUDA_OVERSUBSCRIBE", other)]).unwrap();
            assert!(!c.oversubscribe, "{other:?}");
        }
    }

    #[test]
    fn oom_wait_is_off_by_default_and_takes_a_bounded_duration() {
        assert_eq!(vars(&[]).unwrap().oom_wait, None);
        let wait = |v: &str| vars(&[("VGPU_OOM_WAIT", v)]).map(|c| c.oom_wait);
        assert_eq!(wait("500ms"), Ok(Some(Duration::from_millis(500))));
        assert_eq!(wait("30s"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(wait("2m"), Ok(Some(Duration::from_secs(120))));
        assert_eq!(wait("60m"), Ok(Some(MAX_OOM_WAIT)));
        for off in ["0", "off", "0s", "0ms"] {
            assert_eq!(wait(off), Ok(None), "{off:?}");
        }
        for bad in [
            "",
            "5",
            "ms",
            "1.5s",
            "-1s",
            "+1s",
            "2h",
            "61m",
            "99999999999999999999s",
        ] {
            let e = wait(bad).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { var, .. } if var == "VGPU_OOM_WAIT"),
                "{bad:?}: {e}"
            );
        }
        assert_eq!(parse_duration("3601s"), Err(DurationError::TooLong(3600)));
        assert_eq!(parse_duration("1x"), Err(DurationError::Syntax));
    }

    #[test]
    fn the_in_process_freeze_is_off_by_default_and_a_malformed_value_is_an_error() {
        assert!(!vars(&[]).unwrap().freeze_in_process);
        let on = |v: &str| vars(&[("VGPU_FREEZE_IN_PROCESS", v)]).map(|c| c.freeze_in_process);
        assert_eq!(on("1"), Ok(true));
        assert_eq!(on("on"), Ok(true));
        assert_eq!(on("0"), Ok(false));
        assert_eq!(on("off"), Ok(false));
        for bad in ["yes", "2", "true"] {
            assert!(
                matches!(on(bad), Err(ConfigError::Invalid { var, .. }) if var == "VGPU_FREEZE_IN_PROCESS"),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_freeze_pool_socket_is_a_path_and_empty_means_the_default() {
        assert_eq!(vars(&[]).unwrap().freeze_pool_socket, None);
        let socket = |v: &str| {
            vars(&[("VGPU_FREEZE_POOL_SOCKET", v)])
                .unwrap()
                .freeze_pool_socket
        };
        assert_eq!(socket(""), None);
        assert_eq!(
            socket("/run/pool/p.sock"),
            Some(PathBuf::from("/run/pool/p.sock"))
        );
    }

    #[test]
    fn freeze_after_is_off_by_default_and_takes_a_duration_up_to_a_week() {
        assert_eq!(vars(&[]).unwrap().freeze_after, None);
        let ttl = |v: &str| vars(&[("VGPU_FREEZE_AFTER", v)]).map(|c| c.freeze_after);
        assert_eq!(ttl("10m"), Ok(Some(Duration::from_secs(600))));
        assert_eq!(ttl("2h"), Ok(Some(Duration::from_secs(7200))));
        assert_eq!(ttl("168h"), Ok(Some(MAX_FREEZE_AFTER)));
        assert_eq!(ttl("0"), Ok(None));
        assert_eq!(ttl("off"), Ok(None));
        assert_eq!(ttl("0s"), Ok(None));
        for bad in ["", "10", "1d", "169h", "1.5h", "-1m"] {
            let e = ttl(bad).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { var, .. } if var == "VGPU_FREEZE_AFTER"),
                "{bad:?}: {e}"
            );
        }
    }
}
