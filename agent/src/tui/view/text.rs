//! Figures as text in the few characters a cell has.

use std::time::Duration;

/// `1s`, `300ms`, `1.5s`.
pub fn format_interval(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Rows of the table that fit in a body of `height` lines (for paging).
pub fn page_rows(height: u16) -> usize {
    height.saturating_sub(1).max(1) as usize
}

/// `512M`, `6.0G`: bytes in at most 5 characters.
pub fn short_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if v < 10.0 {
        format!("{v:.1}{}", UNITS[i])
    } else {
        format!("{v:.0}{}", UNITS[i])
    }
}

/// `0.5`, `85`, `9.4k`, `2.1M`.
pub fn rate(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else if v < 1_000.0 {
        format!("{v:.0}")
    } else if v < 1_000_000.0 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{:.1}M", v / 1e6)
    }
}

/// A share of time as a percentage.
pub fn percent(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

/// A text sparkline of the last `width` values, scaled to `max` (or their own maximum).
pub fn spark(values: &[u64], width: usize, max: Option<u64>) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let skip = values.len().saturating_sub(width);
    let values = &values[skip..];
    let top = max
        .unwrap_or_else(|| values.iter().copied().max().unwrap_or(0))
        .max(1);
    values
        .iter()
        .map(|v| {
            let i = ((*v).min(top) as f64 / top as f64 * 7.0).round() as usize;
            BARS[i]
        })
        .collect()
}

/// Cuts `s` to `width` characters, ending with `…` when cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// A bar of `width` cells filled to `used / limit`.
pub fn bar(used: u64, limit: u64, width: usize) -> String {
    let filled = if limit == 0 {
        0
    } else {
        ((used as f64 / limit as f64).min(1.0) * width as f64).round() as usize
    };
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(format_interval(Duration::from_secs(1)), "1s");
        assert_eq!(format_interval(Duration::from_millis(300)), "300ms");
        assert_eq!(format_interval(Duration::from_millis(1500)), "1.5s");
    }
}
