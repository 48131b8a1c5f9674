//! Keys to actions, htop/nvitop style. What a key means depends on what is open: the kill
//! confirmation, the filter prompt, help, or the table and detail views.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::{Action, Signal, ViewState};

pub fn action(key: KeyEvent, state: &ViewState) -> Action {
    // Key releases and repeats (reported by some terminals) are not presses.
    if key.kind == KeyEventKind::Release {
        return Action::Nothing;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c')) {
        return Action::Quit;
    }
    if state.confirm.is_some() {
        return match key.code {
            KeyCode::Enter | KeyCode::Char('y') | KeyCode::Char('t') => {
                Action::ConfirmSignal(Signal::Term)
            }
            KeyCode::Char('9') | KeyCode::Char('K') => Action::ConfirmSignal(Signal::Kill),
            KeyCode::Esc | KeyCode::Char('n') | KeyCode::Char('q') => Action::Back,
            _ => Action::Nothing,
        };
    }
    if state.filter_editing {
        return match key.code {
            KeyCode::Enter => Action::FilterApply,
            KeyCode::Esc => Action::Back,
            KeyCode::Backspace => Action::FilterBackspace,
            KeyCode::Char(c) if !ctrl => Action::FilterInput(c),
            _ => Action::Nothing,
        };
    }
    if state.help {
        return match key.code {
            KeyCode::Char('q') => Action::Quit,
            KeyCode::Char('?') | KeyCode::F(1) => Action::ToggleHelp,
            KeyCode::Char('e') => Action::ToggleCounters,
            _ => Action::Back,
        };
    }
    if state.counters {
        return match key.code {
            KeyCode::Char('q') => Action::Quit,
            _ => Action::Back,
        };
    }
    match key.code {
        KeyCode::Char('q') | KeyCode::F(10) => Action::Quit,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Home,
        KeyCode::End | KeyCode::Char('G') => Action::End,
        KeyCode::Enter => Action::Enter,
        KeyCode::Right | KeyCode::Char('l') | KeyCode::Char('+') => Action::Expand,
        KeyCode::Left | KeyCode::Char('h') | KeyCode::Char('-') => Action::Collapse,
        KeyCode::Char('t') | KeyCode::F(5) => Action::ToggleTree,
        KeyCode::Char('s') | KeyCode::F(6) => Action::NextSort,
        KeyCode::Char('r') | KeyCode::Char('I') => Action::ReverseSort,
        KeyCode::Char('/') | KeyCode::F(3) => Action::OpenFilter,
        KeyCode::Char('K') | KeyCode::F(9) => Action::AskSignal,
        KeyCode::Char('p') | KeyCode::Char(' ') => Action::TogglePause,
        KeyCode::Char('?') | KeyCode::F(1) => Action::ToggleHelp,
        KeyCode::Char('e') => Action::ToggleCounters,
        KeyCode::Char('u') => Action::GpuTime,
        KeyCode::Esc | KeyCode::Backspace => Action::Back,
        _ => Action::Nothing,
    }
}

/// The keys, as the help screen lists them.
pub const HELP: &[(&str, &str)] = &[
    ("Up/Down j/k", "move (PgUp/PgDn; g/G: first/last)"),
    ("Enter", "expand a container, else open its details"),
    ("Right/l Left/h", "expand / collapse a container"),
    ("t, F5", "tree: expand every container"),
    ("s, F6", "sort by the next column (r or I: reverse)"),
    ("/, F3", "filter: name, id, command, pid (Esc clears)"),
    ("K, F9", "signal the process: SIGTERM (or 9: SIGKILL)"),
    ("p, Space", "pause / resume refreshing"),
    ("Esc", "back: close a dialog or details, clear the filter"),
    ("u", "GPU time: busy share per GPU by source, top kernels"),
    ("?, F1", "this help"),
    (
        "e",
        "the header's lost and errors: what they count, each one",
    ),
    ("q, F10, Ctrl-C", "quit"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::app::Confirm;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn table_keys() {
        let s = ViewState::default();
        assert_eq!(action(key(KeyCode::Char('j')), &s), Action::Down);
        assert_eq!(action(key(KeyCode::Char('k')), &s), Action::Up);
        assert_eq!(action(key(KeyCode::F(6)), &s), Action::NextSort);
        assert_eq!(action(key(KeyCode::Char('s')), &s), Action::NextSort);
        assert_eq!(action(key(KeyCode::Char('K')), &s), Action::AskSignal);
        assert_eq!(action(key(KeyCode::F(9)), &s), Action::AskSignal);
        assert_eq!(action(key(KeyCode::Char('/')), &s), Action::OpenFilter);
        assert_eq!(action(key(KeyCode::Char('q')), &s), Action::Quit);
        assert_eq!(action(key(KeyCode::Char('e')), &s), Action::ToggleCounters);
        assert_eq!(action(key(KeyCode::Char('u')), &s), Action::GpuTime);
        let counters = ViewState {
            counters: true,
            ..ViewState::default()
        };
        assert_eq!(action(key(KeyCode::Char('j')), &counters), Action::Back);
        assert_eq!(
            action(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL), &s),
            Action::Quit
        );
        let mut release = key(KeyCode::Char('q'));
        release.kind = KeyEventKind::Release;
        assert_eq!(action(release, &s), Action::Nothing);
    }

    #[test]
    fn the_filter_prompt_takes_every_character() {
        let s = ViewState {
            filter_editing: true,
            ..ViewState::default()
        };
        assert_eq!(
            action(key(KeyCode::Char('q')), &s),
            Action::FilterInput('q')
        );
        assert_eq!(
            action(key(KeyCode::Char('k')), &s),
            Action::FilterInput('k')
        );
        assert_eq!(action(key(KeyCode::Enter), &s), Action::FilterApply);
        assert_eq!(action(key(KeyCode::Esc), &s), Action::Back);
    }

    #[test]
    fn the_confirmation_needs_an_explicit_answer() {
        let s = ViewState {
            confirm: Some(Confirm {
                key: crate::model::ProcessKey {
                    pid: 9,
                    start_ticks: 1,
                },
                label: "9 x".into(),
            }),
            ..ViewState::default()
        };
        assert_eq!(
            action(key(KeyCode::Enter), &s),
            Action::ConfirmSignal(Signal::Term)
        );
        assert_eq!(
            action(key(KeyCode::Char('9')), &s),
            Action::ConfirmSignal(Signal::Kill)
        );
        assert_eq!(action(key(KeyCode::Char('j')), &s), Action::Nothing);
        assert_eq!(action(key(KeyCode::Esc), &s), Action::Back);
    }
}
