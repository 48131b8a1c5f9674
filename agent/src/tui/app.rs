//! What `top` shows and how it is arranged: the model (the latest snapshot and the histories
//! derived from snapshots) and the view state (selection, expanded containers, sort, filter,
//! pause, open screen). Input becomes an [`Action`]; [`ViewState::update`] applies it and returns
//! an [`Effect`] for the loop to carry out (quitting, signalling a process).

use std::collections::BTreeSet;

use super::{
    history::History,
    rows::{Arrangement, Row, RowId, RowKind, SortKey, rows},
};
use crate::model::{ProcessKey, Snapshot};

/// Where snapshots come from, as the header says it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceStatus {
    /// `daemon /run/vgpu-agent/agent.sock` or `in-process`.
    pub name: String,
    /// The last error reading the source, if the last read failed.
    pub error: Option<String>,
}

/// What the views read: never changed by rendering.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub snapshot: Option<Snapshot>,
    pub history: History,
    pub source: SourceStatus,
    /// Whole seconds since the snapshot shown was taken, when it is stale (older than two
    /// intervals, or the daemon serves it again because its collector is late).
    pub stale_seconds: Option<u64>,
}

impl Model {
    pub fn apply(&mut self, snap: Snapshot) {
        self.history.record(&snap);
        self.snapshot = Some(snap);
        self.source.error = None;
    }

    /// Updates [`Model::stale_seconds`] for `now_unix_ms`; true if it changed (redraw).
    pub fn check_stale(&mut self, now_unix_ms: u64, interval: std::time::Duration) -> bool {
        let stale = self
            .snapshot
            .as_ref()
            .filter(|s| s.is_stale_at(now_unix_ms, interval))
            .map(|s| s.age_at(now_unix_ms) as u64);
        let changed = stale != self.stale_seconds;
        self.stale_seconds = stale;
        changed
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Kill => "SIGKILL",
        }
    }
}

/// What a key asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    /// Expand a collapsed container, else open the detail view.
    Enter,
    Expand,
    Collapse,
    ToggleTree,
    NextSort,
    ReverseSort,
    OpenFilter,
    FilterInput(char),
    FilterBackspace,
    FilterApply,
    /// Escape: close what is open (dialog, filter prompt, help, detail) or clear the filter.
    Back,
    AskSignal,
    ConfirmSignal(Signal),
    TogglePause,
    ToggleHelp,
    /// The dialog that explains the header's lost and errors counters and lists them.
    ToggleCounters,
    /// Open the GPU-time view of the selected row (or of the detail shown), or close it.
    GpuTime,
    Quit,
    /// A key with no meaning here.
    Nothing,
}

/// What the loop must do after an action.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    None,
    Quit,
    Signal { key: ProcessKey, signal: Signal },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Screen {
    Table,
    Detail(RowId),
    /// A row's GPU busy share per GPU by source and its top kernels.
    GpuTime(RowId),
}

/// A signal waiting for confirmation.
#[derive(Clone, Debug, PartialEq)]
pub struct Confirm {
    pub key: ProcessKey,
    pub label: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ViewState {
    pub screen: Screen,
    pub selected: Option<RowId>,
    /// Where the selection was, for when its row goes away.
    pub selected_index: usize,
    pub expanded: BTreeSet<String>,
    pub tree: bool,
    pub sort: SortKey,
    pub descending: bool,
    pub filter: String,
    pub filter_editing: bool,
    pub paused: bool,
    pub help: bool,
    /// The header's counters explained (`e`).
    pub counters: bool,
    pub confirm: Option<Confirm>,
    /// One line of feedback (e.g. the result of a signal).
    pub status: Option<String>,
    /// The refresh interval, as shown in the header.
    pub interval: std::time::Duration,
    /// Draw without colours (`NO_COLOR`).
    pub no_color: bool,
    /// Rows the table showed last (for page up/down).
    pub page: usize,
}

impl Default for ViewState {
    fn default() -> ViewState {
        ViewState {
            screen: Screen::Table,
            selected: None,
            selected_index: 0,
            expanded: BTreeSet::new(),
            tree: false,
            sort: SortKey::Memory,
            descending: true,
            filter: String::new(),
            filter_editing: false,
            paused: false,
            help: false,
            counters: false,
            confirm: None,
            status: None,
            interval: std::time::Duration::from_secs(1),
            no_color: false,
            page: 10,
        }
    }
}

impl ViewState {
    pub fn arrangement(&self) -> Arrangement<'_> {
        Arrangement {
            sort: self.sort,
            descending: self.descending,
            filter: &self.filter,
            expanded: &self.expanded,
            tree: self.tree,
        }
    }

    /// The rows of the table for this model.
    pub fn rows<'m>(&self, model: &'m Model) -> Vec<Row<'m>> {
        match &model.snapshot {
            Some(s) => rows(s, &self.arrangement()),
            None => Vec::new(),
        }
    }

    /// The index of the selected row among `rows` (the first row when nothing is selected).
    pub fn selected_in(&self, rows: &[Row]) -> Option<usize> {
        if rows.is_empty() {
            return None;
        }
        let by_id = self
            .selected
            .as_ref()
            .and_then(|id| rows.iter().position(|r| &r.id == id));
        Some(by_id.unwrap_or(self.selected_index.min(rows.len() - 1)))
    }

    fn select(&mut self, rows: &[Row], index: usize) {
        if let Some(r) = rows.get(index) {
            self.selected = Some(r.id.clone());
            self.selected_index = index;
        }
    }

    fn move_by(&mut self, rows: &[Row], delta: isize) {
        let Some(i) = self.selected_in(rows) else {
            return;
        };
        let j = (i as isize + delta).clamp(0, rows.len() as isize - 1) as usize;
        self.select(rows, j);
    }

    /// Applies an action.
    pub fn update(&mut self, action: Action, model: &Model) -> Effect {
        if !matches!(action, Action::Nothing) && self.confirm.is_none() {
            self.status = None;
        }
        let rows = self.rows(model);
        let current = self.selected_in(&rows).map(|i| &rows[i]);
        match action {
            Action::Nothing => {}
            Action::Quit => return Effect::Quit,
            Action::Up => self.move_by(&rows, -1),
            Action::Down => self.move_by(&rows, 1),
            Action::PageUp => self.move_by(&rows, -(self.page.max(1) as isize)),
            Action::PageDown => self.move_by(&rows, self.page.max(1) as isize),
            Action::Home => self.select(&rows, 0),
            Action::End => self.select(&rows, rows.len().saturating_sub(1)),
            Action::Enter => match current.map(|r| (&r.id, &r.kind)) {
                Some((
                    RowId::Container(k),
                    RowKind::Container {
                        expanded: false, ..
                    },
                )) => {
                    self.expanded.insert(k.clone());
                }
                Some((id, _)) => self.screen = Screen::Detail(id.clone()),
                None => {}
            },
            Action::Expand => {
                if let Some(RowId::Container(k)) = current.map(|r| &r.id) {
                    self.expanded.insert(k.clone());
                }
            }
            Action::Collapse => match current.map(|r| &r.id) {
                Some(RowId::Container(k)) => {
                    self.expanded.remove(k);
                }
                Some(RowId::Process(p)) => {
                    // Collapse the parent and select it, as htop's tree does.
                    let parent = model
                        .snapshot
                        .as_ref()
                        .and_then(|s| s.process(*p))
                        .map(|p| p.container.clone());
                    if let Some(k) = parent {
                        self.expanded.remove(&k);
                        self.tree = false;
                        self.selected = Some(RowId::Container(k));
                    }
                }
                None => {}
            },
            Action::ToggleTree => self.tree = !self.tree,
            Action::NextSort => self.sort = self.sort.next(),
            Action::ReverseSort => self.descending = !self.descending,
            Action::OpenFilter => self.filter_editing = true,
            Action::FilterInput(c) => self.filter.push(c),
            Action::FilterBackspace => {
                self.filter.pop();
            }
            Action::FilterApply => self.filter_editing = false,
            Action::Back => {
                if self.confirm.take().is_some() {
                    self.status = Some("cancelled".into());
                } else if self.filter_editing {
                    self.filter_editing = false;
                    self.filter.clear();
                } else if self.help {
                    self.help = false;
                } else if self.counters {
                    self.counters = false;
                } else if self.screen != Screen::Table {
                    self.screen = Screen::Table;
                } else {
                    self.filter.clear();
                }
            }
            Action::AskSignal => match current.map(|r| &r.kind) {
                Some(RowKind::Process { process, .. }) => {
                    self.confirm = Some(Confirm {
                        key: process.key,
                        label: format!("{} {}", process.key.pid, process.comm),
                    });
                }
                _ => {
                    self.status =
                        Some("select a process to signal (Enter expands a container)".into())
                }
            },
            Action::ConfirmSignal(signal) => {
                if let Some(c) = self.confirm.take() {
                    return Effect::Signal { key: c.key, signal };
                }
            }
            Action::TogglePause => self.paused = !self.paused,
            Action::ToggleHelp => self.help = !self.help,
            Action::ToggleCounters => self.counters = !self.counters,
            Action::GpuTime => match &self.screen {
                Screen::GpuTime(_) => self.screen = Screen::Table,
                Screen::Detail(id) => self.screen = Screen::GpuTime(id.clone()),
                Screen::Table => {
                    if let Some(r) = current {
                        self.screen = Screen::GpuTime(r.id.clone());
                    }
                }
            },
        }
        Effect::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::fixture;

    fn model() -> Model {
        let mut m = Model::default();
        m.apply(fixture::snapshot());
        m
    }

    #[test]
    fn moving_expanding_and_details() {
        let m = model();
        let mut v = ViewState::default();
        let first = v.rows(&m)[0].id.clone();
        assert_eq!(
            first,
            RowId::Container(fixture::TRAIN_ID.into()),
            "largest memory first"
        );
        v.update(Action::Enter, &m);
        assert!(v.expanded.contains(fixture::TRAIN_ID), "Enter expands");
        assert_eq!(
            v.rows(&m).len(),
            m.snapshot.as_ref().unwrap().containers.len() + 2
        );
        v.update(Action::Down, &m);
        assert!(matches!(v.selected, Some(RowId::Process(_))));
        v.update(Action::Enter, &m);
        assert!(
            matches!(v.screen, Screen::Detail(RowId::Process(_))),
            "Enter on a process opens its detail"
        );
        v.update(Action::Back, &m);
        assert_eq!(v.screen, Screen::Table);
        v.update(Action::Collapse, &m);
        assert_eq!(v.selected, Some(RowId::Container(fixture::TRAIN_ID.into())));
        assert!(!v.expanded.contains(fixture::TRAIN_ID));
        v.update(Action::End, &m);
        v.update(Action::Down, &m);
        assert_eq!(
            v.selected_in(&v.rows(&m)),
            Some(v.rows(&m).len() - 1),
            "clamped at the end"
        );
        v.update(Action::Home, &m);
        v.update(Action::Up, &m);
        assert_eq!(v.selected_in(&v.rows(&m)), Some(0));
    }

    #[test]
    fn signalling_needs_a_process_and_a_confirmation() {
        let m = model();
        let mut v = ViewState::default();
        assert_eq!(v.update(Action::AskSignal, &m), Effect::None);
        assert!(
            v.confirm.is_none() && v.status.is_some(),
            "a container cannot be signalled"
        );
        v.update(Action::Enter, &m);
        v.update(Action::Down, &m);
        v.update(Action::AskSignal, &m);
        let c = v.confirm.clone().expect("asks first");
        assert_eq!(v.update(Action::Back, &m), Effect::None);
        assert!(v.confirm.is_none());
        v.update(Action::AskSignal, &m);
        assert_eq!(
            v.update(Action::ConfirmSignal(Signal::Kill), &m),
            Effect::Signal {
                key: c.key,
                signal: Signal::Kill
            }
        );
    }

    #[test]
    fn filter_sort_pause_help_quit() {
        let m = model();
        let mut v = ViewState::default();
        v.update(Action::OpenFilter, &m);
        for c in "vllm".chars() {
            v.update(Action::FilterInput(c), &m);
        }
        v.update(Action::FilterApply, &m);
        assert_eq!(v.rows(&m).len(), 2, "llm-serve and its process");
        v.update(Action::Back, &m);
        assert!(v.filter.is_empty(), "Escape clears the filter");
        v.update(Action::NextSort, &m);
        assert_eq!(v.sort, SortKey::Gpu);
        v.update(Action::ReverseSort, &m);
        assert!(!v.descending);
        v.update(Action::TogglePause, &m);
        assert!(v.paused);
        v.update(Action::ToggleHelp, &m);
        assert!(v.help);
        v.update(Action::Back, &m);
        assert!(!v.help);
        v.update(Action::ToggleCounters, &m);
        assert!(v.counters);
        v.update(Action::Back, &m);
        assert!(!v.counters);
        assert_eq!(v.update(Action::Quit, &m), Effect::Quit);
    }

    #[test]
    fn the_gpu_time_view_opens_on_the_selected_row_and_from_its_detail() {
        let m = model();
        let mut v = ViewState::default();
        v.update(Action::GpuTime, &m);
        assert_eq!(
            v.screen,
            Screen::GpuTime(RowId::Container(fixture::TRAIN_ID.into()))
        );
        v.update(Action::GpuTime, &m);
        assert_eq!(v.screen, Screen::Table, "the same key closes it");
        v.update(Action::Enter, &m);
        v.update(Action::Down, &m);
        v.update(Action::Enter, &m);
        let Screen::Detail(RowId::Process(k)) = v.screen.clone() else {
            panic!("{:?}", v.screen)
        };
        v.update(Action::GpuTime, &m);
        assert_eq!(v.screen, Screen::GpuTime(RowId::Process(k)));
        v.update(Action::Back, &m);
        assert_eq!(v.screen, Screen::Table, "Esc goes back to the table");
    }

    #[test]
    fn selection_follows_its_row_when_the_order_changes() {
        let m = model();
        let mut v = ViewState::default();
        v.update(Action::Down, &m);
        let picked = v.selected.clone();
        v.update(Action::ReverseSort, &m);
        let rows = v.rows(&m);
        assert_eq!(Some(rows[v.selected_in(&rows).unwrap()].id.clone()), picked);
    }
}
