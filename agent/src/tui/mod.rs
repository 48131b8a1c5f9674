//! `vgpu-agent top`: the live terminal view of the model. Snapshots come from the daemon's socket
//! when one answers, else from a collector in this process (`source`); keys become actions
//! (`input`) that change the view state (`app`); the views (`view`) draw the model and the view
//! state and change neither. The loop is generic over the ratatui backend.

pub mod app;
#[cfg(test)]
pub mod fixture;
pub mod gpu_time;
pub mod history;
pub mod input;
pub mod rows;
pub mod source;
pub mod terminal;
pub mod view;

use std::{io, path::PathBuf, sync::mpsc::Receiver, time::Duration};

use ratatui::{
    Terminal,
    backend::Backend,
    crossterm::event::{self, Event},
};

use self::{
    app::{Effect, Model, Signal, ViewState},
    source::Plan,
};
use crate::{
    client::{self, ClientError},
    collector::CollectorOptions,
    model::{ProcessKey, Snapshot},
};

pub struct TopOptions {
    pub interval: Duration,
    /// The daemon's socket; `None`: never read from a daemon.
    pub socket: Option<PathBuf>,
    pub collector: CollectorOptions,
}

/// Chooses the source: a daemon that answers, else collection in this process, which needs the
/// privileges to load probes (a clear error naming sudo otherwise).
pub fn plan(opts: TopOptions) -> anyhow::Result<Plan> {
    if let Some(socket) = &opts.socket {
        match client::fetch(socket, Duration::from_secs(2)) {
            Ok(_) => return Ok(Plan::Daemon(socket.clone())),
            Err(ClientError::Connect { source, .. })
                if source.kind() == io::ErrorKind::PermissionDenied =>
            {
                anyhow::bail!(
                    "the agent daemon's socket {} is not readable by this user: run `sudo vgpu-agent top`",
                    socket.display()
                );
            }
            Err(e) => log::debug!("no daemon: {e}"),
        }
    }
    if let Err(msg) = crate::collector::check_privileges() {
        anyhow::bail!(
            "{msg}\n(no agent daemon answers{}; `sudo vgpu-agent run` starts one)",
            opts.socket
                .as_ref()
                .map(|s| format!(" on {}", s.display()))
                .unwrap_or_default()
        );
    }
    Ok(Plan::InProcess(Box::new(opts.collector)))
}

/// Runs `top` in this terminal until the user quits or SIGINT/SIGTERM arrives.
pub fn run(opts: TopOptions) -> anyhow::Result<()> {
    let interval = opts.interval;
    let plan = plan(opts)?;
    let mut model = Model::default();
    model.source.name = plan.name();
    let snapshots = source::spawn(plan, interval)?;
    let mut state = ViewState {
        interval,
        no_color: std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        ..ViewState::default()
    };
    // Log lines on stderr would tear the screen; what matters is in the snapshots' status.
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Off);
    let (mut terminal, guard) = terminal::setup()?;
    let result = run_loop(
        &mut terminal,
        &mut model,
        &mut state,
        &snapshots,
        |timeout| {
            if event::poll(timeout)? {
                event::read().map(Some)
            } else {
                Ok(None)
            }
        },
    );
    drop(guard);
    log::set_max_level(level);
    result?;
    Ok(())
}

/// The loop: apply snapshots (unless paused), draw, wait a little for input, act on it.
pub fn run_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    model: &mut Model,
    state: &mut ViewState,
    snapshots: &Receiver<Result<Snapshot, String>>,
    mut next_event: impl FnMut(Duration) -> io::Result<Option<Event>>,
) -> io::Result<()>
where
    io::Error: From<B::Error>,
{
    let mut dirty = true;
    while !crate::signals::stop_requested() {
        loop {
            match snapshots.try_recv() {
                Ok(Ok(s)) if !state.paused => {
                    model.apply(s);
                    dirty = true;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    model.source.error = Some(e);
                    dirty = true;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    if model.source.error.is_none() {
                        model.source.error = Some("the snapshot reader stopped".into());
                        dirty = true;
                    }
                    break;
                }
            }
        }
        // A paused view is old on purpose; otherwise the header says when what it shows is stale.
        if !state.paused {
            dirty |= model.check_stale(crate::model::now_unix_ms(), state.interval);
        }
        if dirty {
            let height = terminal.size()?.height;
            state.page = view::page_rows(height.saturating_sub(6));
            terminal.draw(|f| view::render(f, model, state))?;
            dirty = false;
        }
        match next_event(Duration::from_millis(100))? {
            Some(Event::Key(key)) => {
                let action = input::action(key, state);
                match state.update(action, model) {
                    Effect::Quit => return Ok(()),
                    Effect::Signal { key, signal } => {
                        state.status = Some(signal_process(key, signal));
                    }
                    Effect::None => {}
                }
                dirty = true;
            }
            Some(Event::Resize(..)) => {
                terminal.autoresize()?;
                dirty = true;
            }
            Some(_) | None => {}
        }
    }
    Ok(())
}

/// Why a process must not be signalled, if it must not.
fn refuse(key: ProcessKey, own_pid: u32) -> Option<String> {
    if key.pid <= 1 {
        return Some(format!("refusing to signal pid {}", key.pid));
    }
    if key.pid == own_pid {
        return Some("refusing to signal the agent itself".into());
    }
    None
}

/// Sends `signal` to the process if it is still the one in the model (same pid and start time);
/// returns what happened, for the status line.
pub fn signal_process(key: ProcessKey, signal: Signal) -> String {
    if let Some(why) = refuse(key, std::process::id()) {
        return why;
    }
    let now = crate::identity::process::ProcessFacts::read(std::path::Path::new("/proc"), key.pid);
    if now.as_ref().map(|f| f.start_ticks) != Some(key.start_ticks) {
        return format!(
            "process {} has exited (or its pid was reused): not signalled",
            key.pid
        );
    }
    let sig = match signal {
        Signal::Term => crate::sys::process::Signal::Term,
        Signal::Kill => crate::sys::process::Signal::Kill,
    };
    match crate::sys::process::send_signal(key.pid, sig) {
        Ok(()) => format!("sent {} to {}", signal.name(), key.pid),
        Err(e) => format!("{} to {} failed: {e}", signal.name(), key.pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::process::ProcessFacts;

    #[test]
    fn never_signals_init_pid_0_or_itself() {
        let own = std::process::id();
        for pid in [0, 1, own] {
            let key = ProcessKey {
                pid,
                start_ticks: 0,
            };
            assert!(refuse(key, own).is_some(), "{pid}");
            assert!(signal_process(key, Signal::Kill).starts_with("refusing"));
        }
        assert_eq!(
            refuse(
                ProcessKey {
                    pid: 4242,
                    start_ticks: 0
                },
                own
            ),
            None
        );
    }

    #[test]
    fn signals_the_process_it_names_and_not_a_reused_pid() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let facts = ProcessFacts::read(std::path::Path::new("/proc"), pid).unwrap();
        let wrong = ProcessKey {
            pid,
            start_ticks: facts.start_ticks + 1,
        };
        assert!(signal_process(wrong, Signal::Term).contains("not signalled"));
        let right = ProcessKey {
            pid,
            start_ticks: facts.start_ticks,
        };
        assert_eq!(
            signal_process(right, Signal::Term),
            format!("sent SIGTERM to {pid}")
        );
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}
