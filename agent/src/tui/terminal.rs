//! The terminal: raw mode and the alternate screen on the way in, and restored on the way out
//! whatever the way out is: a normal return, an error, a panic (hook), SIGINT or SIGTERM (the
//! loop polls the stop flag and returns, and the guard restores).

use std::io::{self, Stdout};

use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        cursor::{Hide, Show},
        execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
    },
};

/// Restores the terminal when dropped.
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode and the alternate screen; safe to call more than once.
pub fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
}

/// Enters raw mode and the alternate screen and installs the panic hook that restores them.
pub fn setup() -> io::Result<(Terminal<CrosstermBackend<Stdout>>, Guard)> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    crate::signals::install();
    enable_raw_mode()?;
    let guard = Guard;
    execute!(io::stdout(), EnterAlternateScreen, Hide)?;
    let terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
    Ok((terminal, guard))
}
