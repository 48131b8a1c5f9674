//! Rendering: pure functions of the model and the view state. Nothing here changes either.

mod counters;
mod detail;
mod header;
mod popup;
mod table;
#[cfg(test)]
mod tests;

use ratatui::{
    Frame,
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
};

use super::app::{Model, Screen, ViewState};

/// Styles, with or without colour (`NO_COLOR`): without, only bold and reverse video are used.
#[derive(Clone, Copy, Debug)]
pub struct Theme {
    color: bool,
}

impl Theme {
    pub fn new(no_color: bool) -> Theme {
        Theme { color: !no_color }
    }

    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    pub fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn heading(&self) -> Style {
        if self.color {
            Style::new().fg(Color::Black).bg(Color::Green)
        } else {
            Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)
        }
    }

    pub fn selected(&self) -> Style {
        if self.color {
            Style::new().bg(Color::Blue).fg(Color::White)
        } else {
            Style::new().add_modifier(Modifier::REVERSED)
        }
    }

    pub fn good(&self) -> Style {
        self.fg(Color::Green)
    }

    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow)
    }

    pub fn bad(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn dim(&self) -> Style {
        self.fg(Color::DarkGray)
    }

    pub fn key(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
}

/// Draws everything: header, the table or the detail view, the footer, then any dialog.
pub fn render(frame: &mut Frame, model: &Model, state: &ViewState) {
    let theme = Theme::new(state.no_color);
    let header = header::lines(model, state, &theme, frame.area().width);
    let [top, body, footer] = Layout::vertical([
        Constraint::Length(header.len() as u16),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    header::render(frame, top, header);
    match &state.screen {
        Screen::Table => table::render(frame, body, model, state, &theme),
        Screen::Detail(id) => detail::render(frame, body, model, id, &theme),
    }
    popup::footer(frame, footer, state, &theme);
    if state.help {
        popup::help(frame, &theme);
    }
    if state.counters {
        counters::render(frame, model, &theme);
    }
    if let Some(c) = &state.confirm {
        popup::confirm(frame, c, &theme);
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
