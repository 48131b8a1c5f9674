//! What a user names on the command line: the CDI kind (`vendor/class`) and the devices
//! (`NAME:mem=4g,sm=40`), validated by the rules of CDI spec 0.5.0 and the limiter's limits.

use std::{fmt, str::FromStr};

use super::{error::CdiError, names::PROFILE_SYNTAX};

/// A CDI kind, `vendor/class` (`vgpu-agent.dev/limit`): what users write before `=` in
/// `--device vendor/class=name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kind {
    vendor: String,
    class: String,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

impl FromStr for Kind {
    type Err = CdiError;

    /// The vendor may hold letters, digits, `_`, `-` and `.` (a domain such as
    /// `vgpu-agent.dev`); the class the same without `.` (dots in the class need CDI 0.6.0, which
    /// podman 4.3 does not read). Both start with a letter and end with a letter or digit.
    fn from_str(s: &str) -> Result<Kind, CdiError> {
        let bad = |why: String| CdiError::Kind {
            kind: s.to_owned(),
            why,
        };
        let (vendor, class) = s
            .split_once('/')
            .ok_or_else(|| bad("expected vendor/class, e.g. vgpu-agent.dev/limit".into()))?;
        check_name(vendor, "vendor", true, |c| matches!(c, '_' | '-' | '.')).map_err(bad)?;
        check_name(class, "class", true, |c| matches!(c, '_' | '-')).map_err(bad)?;
        Ok(Kind {
            vendor: vendor.to_owned(),
            class: class.to_owned(),
        })
    }
}

/// One CDI device: a name and the limits a container that asks for it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// The container's GPU memory limit on each device, bytes (`CUDA_DEVICE_MEMORY_LIMIT`).
    pub memory: Option<u64>,
    /// The SM share in percent, 1..=99 (`CUDA_DEVICE_SM_LIMIT`).
    pub sm: Option<u8>,
    /// The QoS tier (`VGPU_QOS_TIER`: latency, guaranteed, best-effort; docs/qos.md).
    pub tier: Option<String>,
    /// The guaranteed share in percent, 1..=100 (`VGPU_QOS_GUARANTEE`).
    pub guarantee: Option<u8>,
}

impl FromStr for Profile {
    type Err = CdiError;

    fn from_str(s: &str) -> Result<Profile, CdiError> {
        let bad = |why: String| CdiError::Device {
            device: s.to_owned(),
            why,
        };
        let (name, settings) = s
            .split_once(':')
            .ok_or_else(|| bad(format!("expected {PROFILE_SYNTAX}")))?;
        // Device names may also hold ':' in CDI; here it separates the name from its limits.
        check_name(name, "device name", false, |c| matches!(c, '_' | '-' | '.')).map_err(bad)?;
        let mut profile = Profile {
            name: name.to_owned(),
            memory: None,
            sm: None,
            tier: None,
            guarantee: None,
        };
        for setting in settings.split(',') {
            let (key, value) = setting.split_once('=').ok_or_else(|| {
                bad(format!(
                    "{setting:?}: expected key=value (mem, sm, tier or guarantee)"
                ))
            })?;
            match key {
                "mem" | "memory" => {
                    if profile.memory.is_some() {
                        return Err(bad("mem is given twice".into()));
                    }
                    profile.memory = Some(parse_memory(value).map_err(bad)?);
                }
                "sm" => {
                    if profile.sm.is_some() {
                        return Err(bad("sm is given twice".into()));
                    }
                    profile.sm = Some(parse_sm(value).map_err(bad)?);
                }
                "tier" => {
                    if !matches!(value, "latency" | "guaranteed" | "best-effort") {
                        return Err(bad(format!(
                            "tier={value:?}: expected latency, guaranteed or best-effort"
                        )));
                    }
                    profile.tier = Some(value.to_owned());
                }
                "guarantee" => {
                    let g = value
                        .strip_suffix('%')
                        .unwrap_or(value)
                        .parse::<u8>()
                        .ok()
                        .filter(|g| (1..=100).contains(g))
                        .ok_or_else(|| {
                            bad(format!(
                                "guarantee={value:?}: expected a percentage from 1 to 100"
                            ))
                        })?;
                    profile.guarantee = Some(g);
                }
                other => {
                    return Err(bad(format!(
                        "unknown setting {other:?}: the settings are mem, sm, tier and guarantee"
                    )));
                }
            }
        }
        match (profile.tier.as_deref(), profile.guarantee) {
            (Some("guaranteed"), None) => {
                return Err(bad("tier=guaranteed needs guarantee=PERCENT".into()));
            }
            (Some(t @ ("latency" | "best-effort")), Some(_)) => {
                return Err(bad(format!(
                    "guarantee goes with the guaranteed tier, not {t}"
                )));
            }
            _ => {}
        }
        if profile.memory.is_none()
            && profile.sm.is_none()
            && profile.tier.is_none()
            && profile.guarantee.is_none()
        {
            return Err(bad(
                "no limit: give mem=SIZE, sm=PERCENT, tier=TIER and/or guarantee=PERCENT".into(),
            ));
        }
        Ok(profile)
    }
}

fn parse_memory(value: &str) -> Result<u64, String> {
    let bytes = crate::limit::parse_memory(value)
        .map_err(|_| format!("mem={value:?}: expected a size such as 4g or 1536m"))?;
    if bytes == 0 {
        return Err(format!(
            "mem={value} is no limit; leave mem out for a device without a memory limit"
        ));
    }
    if bytes > region::MAX_RESERVABLE {
        return Err(format!(
            "mem={value} is above the largest limit a region holds ({} bytes)",
            region::MAX_RESERVABLE
        ));
    }
    Ok(bytes)
}

fn parse_sm(value: &str) -> Result<u8, String> {
    let pct = value
        .strip_suffix('%')
        .unwrap_or(value)
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| format!("sm={value:?}: expected a percentage from 1 to 99"))?;
    match pct {
        0 | 100 => Err(format!(
            "sm={value} is no limit; leave sm out for a device without an SM limit"
        )),
        p => Ok(p),
    }
}

/// A name of letters, digits and `extra` characters that starts with a letter (a digit too
/// when `letter_first` is false) and ends with a letter or digit.
fn check_name(
    name: &str,
    what: &str,
    letter_first: bool,
    extra: impl Fn(char) -> bool,
) -> Result<(), String> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(format!("the {what} is empty"));
    };
    let first_ok = if letter_first {
        first.is_ascii_alphabetic()
    } else {
        first.is_ascii_alphanumeric()
    };
    if !first_ok {
        let must = if letter_first {
            "a letter"
        } else {
            "a letter or digit"
        };
        return Err(format!("the {what} {name:?} must start with {must}"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || extra(*c)))
    {
        return Err(format!("the {what} {name:?} may not contain {c:?}"));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "the {what} {name:?} must end with a letter or digit"
        ));
    }
    Ok(())
}

/// Bytes in the largest binary unit that divides them (`4g`, `1536m`, `4097`): what the
/// limiter and HAMi-core read, and what a person reads back.
pub fn format_bytes(bytes: u64) -> String {
    for (shift, suffix) in [(40, 't'), (30, 'g'), (20, 'm'), (10, 'k')] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}
