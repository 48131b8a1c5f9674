//! Rendering: pure functions of the model and the view state. Nothing here changes either.

mod counters;
mod detail;
mod header;
mod popup;
mod table;
mod text;
mod theme;

use ratatui::{
    Frame,
    layout::{Constraint, Layout},
};

pub use self::text::page_rows;
use self::theme::Theme;
use super::app::{Model, Screen, ViewState};

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
        Screen::GpuTime(id) => detail::render_gpu_time(frame, body, model, id, &theme),
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

#[cfg(test)]
mod tests {
    //! Every screen recorded at 80x24 and 160x48 from the synthetic model (`tui::fixture`). The
    //! `.snap` files under `snapshots/` are what users see: review them when they change
    //! (`cargo insta review`, or `INSTA_UPDATE=always` and `git diff`). The model is synthetic, so no
    //! pid, time or id needs filtering.

    use ratatui::{Terminal, backend::TestBackend, style::Color};

    use crate::tui::{
        app::{Action, Model, ViewState},
        fixture,
        rows::RowId,
    };

    /// The fixture applied a few times with changing GPU load, so the sparklines have a history.
    fn model() -> Model {
        let mut m = Model::default();
        m.source.name = "daemon /run/vgpu-agent/agent.sock".into();
        for i in 0..12u32 {
            let mut s = fixture::snapshot();
            for g in &mut s.gpus {
                g.utilization_pct = Some((g.index * 30 + i * 9) % 100);
                g.memory_used = Some((10 + i as u64) << 30);
            }
            m.apply(s);
        }
        m.apply(fixture::snapshot());
        m
    }

    fn draw(model: &Model, state: &ViewState, w: u16, h: u16) -> Terminal<TestBackend> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| super::render(f, model, state)).unwrap();
        t
    }

    fn both(name: &str, model: &Model, state: &ViewState) {
        for (w, h) in [(80, 24), (160, 48)] {
            let t = draw(model, state, w, h);
            insta::assert_snapshot!(format!("{name}_{w}x{h}"), t.backend());
        }
    }

    fn with(model: &Model, actions: &[Action]) -> ViewState {
        let mut s = ViewState::default();
        for a in actions {
            s.update(a.clone(), model);
        }
        s
    }

    fn text_of(t: &Terminal<TestBackend>) -> String {
        format!("{}", t.backend())
    }

    /// The table's GPU% says whose figure it shows: the pod's rank 0 is timed by the limiter
    /// and rank 1 is not (`+`, both summed), the others NVML's samples (`N`), MIG `n/a`.
    #[test]
    fn the_gpu_column_marks_its_source() {
        let m = model();
        let text = text_of(&draw(&m, &ViewState::default(), 160, 48));
        let row = |name: &str| text.lines().find(|l| l.contains(name)).unwrap().to_string();
        assert!(row("ml-team/trainer-0/pytorch").contains(" 54%+"), "{text}");
        assert!(row("llm-serve").contains(" 30%N"), "{text}");
        assert!(row("notebook").contains(" n/a "), "{text}");
        assert!(text.contains("GPU%"), "{text}");
        let tree = text_of(&draw(&m, &with(&m, &[Action::ToggleTree]), 160, 48));
        let rank0 = tree.lines().find(|l| l.contains("4101")).unwrap();
        assert!(rank0.contains(" 34%L"), "limiter-timed: {tree}");
        let rank1 = tree.lines().find(|l| l.contains("4102")).unwrap();
        assert!(rank1.contains(" 20%N"), "NVML-sampled: {tree}");
    }

    /// A frozen container says so in the table, beside its name; the others do not.
    #[test]
    fn a_frozen_container_is_marked() {
        let mut m = Model::default();
        let mut snap = fixture::snapshot();
        let i = snap
            .containers
            .iter()
            .position(|c| c.name.contains("llm-serve"))
            .unwrap();
        snap.containers[i].frozen = Some(crate::model::Frozen {
            host_bytes: 1 << 30,
            in_process: false,
        });
        let mut own = snap.clone();
        m.apply(snap);
        let text = text_of(&draw(&m, &ViewState::default(), 160, 48));
        let row = |name: &str| text.lines().find(|l| l.contains(name)).unwrap().to_string();
        assert!(row("llm-serve").contains("llm-serve (frozen)"), "{text}");
        assert!(!row("notebook").contains("(frozen)"), "{text}");
        // Frozen by its processes themselves: the path is said.
        own.containers[i].frozen.as_mut().unwrap().in_process = true;
        let mut m = Model::default();
        m.apply(own);
        let text = text_of(&draw(&m, &ViewState::default(), 160, 48));
        let row = text.lines().find(|l| l.contains("llm-serve")).unwrap();
        assert!(row.contains("llm-serve (frozen, in-process)"), "{text}");
    }

    /// A process whose allocation waits for GPU memory says so in the tree; the others do not.
    #[test]
    fn a_process_waiting_for_memory_is_marked() {
        let mut m = Model::default();
        let mut snap = fixture::snapshot();
        let p = snap
            .processes
            .iter_mut()
            .find(|p| p.alive && p.limiter.is_some())
            .expect("a process under the limiter in the fixture");
        let pid = p.key.pid.to_string();
        p.limiter.as_mut().unwrap().waiting_for_memory = Some(crate::model::WaitingForMemory {
            device: 0,
            bytes: 1 << 30,
            wait: 1,
        });
        m.apply(snap);
        let text = text_of(&draw(&m, &with(&m, &[Action::ToggleTree]), 160, 48));
        let row = text
            .lines()
            .find(|l| l.contains(&format!(" {pid} (")))
            .unwrap_or_else(|| panic!("no row of {pid} in {text}"));
        assert!(row.contains("(waits for memory)"), "{text}");
        assert_eq!(text.matches("(waits for memory)").count(), 1, "{text}");
    }

    /// `u` on the pod: GPU0's busy share by source side by side, how far the limiter's timing
    /// covers the pod, each process, and the top kernels with share, time, calls and mean.
    #[test]
    fn gpu_time_of_a_container() {
        let mut m = model();
        // The trainer's container is guaranteed 30% of GPU0 and allocated 70% (docs/qos.md).
        let snap = m.snapshot.as_mut().unwrap();
        let train = snap
            .containers
            .iter_mut()
            .find(|c| c.key == fixture::TRAIN_ID)
            .unwrap();
        train.regions[0].devices[0].qos = Some(crate::model::RegionQos {
            tier: "guaranteed".into(),
            guarantee: 0.3,
            allocated: 0.7,
            held: true,
            short: false,
        });
        let s = with(&m, &[Action::GpuTime]);
        both("gpu_time_container", &m, &s);
        let text = text_of(&draw(&m, &s, 160, 48));
        for shown in [
            "GPU time  container ml-team/trainer-0/pytorch 605439acbd4f",
            "GPU0  limiter 34% (12000 samples)  nvml 82%",
            "timed by the limiter: 1 of 2 processes (the others: NVML's alone)",
            "4101 python3  limiter 34%  nvml 62%",
            "4102 python3  limiter: no record  nvml 20%",
            "QoS GPU0 guaranteed 30%, allocated 70% (held back)",
            "KERNEL",
        ] {
            assert!(text.contains(shown), "{shown:?} not in {text}");
        }
        // 24.6 s of 41 s, 205,000 launches of 120 us each.
        let gemm = text
            .lines()
            .find(|l| l.contains("ampere_bf16_s16816gemm"))
            .unwrap();
        let cells: Vec<&str> = gemm.trim_matches('"').split_whitespace().collect();
        assert_eq!(
            cells[1..],
            ["60%", "24.60s", "205.0k", "120.0us", "7235"],
            "{gemm}"
        );
        assert!(text.contains("other"), "{text}");
    }

    /// Kernels that do not fit are counted, not dropped silently.
    #[test]
    fn gpu_time_kernels_past_the_screen_are_counted() {
        let mut snap = fixture::snapshot();
        let l = snap.processes[0].limiter.as_mut().unwrap();
        for i in 0..6u64 {
            let mut k = l.kernels[1].clone();
            k.name = format!("elementwise_kernel_{i}");
            k.estimated_ns = 1_000_000_000 - i;
            l.kernels.push(k);
        }
        let mut m = Model::default();
        m.apply(snap);
        let s = with(&m, &[Action::GpuTime]);
        // Eight rows (the model's top kernels, `other` among them) fit at 80x24, not at 80x20.
        let short = text_of(&draw(&m, &s, 80, 20));
        assert!(short.contains("5 more kernels (taller screen)"), "{short}");
        for (w, h) in [(80, 24), (160, 48)] {
            let tall = text_of(&draw(&m, &s, w, h));
            assert!(!tall.contains("more kernels (taller"), "{tall}");
            assert_eq!(
                tall.lines()
                    .filter(|l| l.contains("elementwise_kernel_"))
                    .count(),
                4,
                "the top kernels and the rest as other: {tall}"
            );
            assert!(tall.contains("other "), "{tall}");
        }
    }

    /// A process's GPU time, opened from its detail view.
    #[test]
    fn gpu_time_of_a_process() {
        let m = model();
        let s = with(
            &m,
            &[Action::Enter, Action::Down, Action::Enter, Action::GpuTime],
        );
        assert!(matches!(
            s.screen,
            crate::tui::app::Screen::GpuTime(RowId::Process(k)) if k.pid == 4101
        ));
        both("gpu_time_process", &m, &s);
        let text = text_of(&draw(&m, &s, 160, 48));
        assert!(
            text.contains("GPU0  limiter 34% (12000 samples)  nvml 62%"),
            "{text}"
        );
        assert!(
            text.contains("timed by the limiter: this process"),
            "{text}"
        );
    }

    /// Without the limiter the figure is NVML's, said so, and kernels need the limiter; under the
    /// limiter without records it says that instead; on MIG NVML's figure is n/a and why.
    #[test]
    fn gpu_time_without_the_limiter_says_where_its_figure_comes_from() {
        let m = model();
        let open = |key: &str| {
            let mut s = ViewState::default();
            while !matches!(&s.selected, Some(RowId::Container(k)) if k == key) {
                s.update(Action::Down, &m);
            }
            s.update(Action::GpuTime, &m);
            s
        };
        let host = open("host");
        both("gpu_time_no_limiter", &m, &host);
        let text = text_of(&draw(&m, &host, 160, 48));
        assert!(text.contains("GPU0  nvml 4% (NVML-sampled)"), "{text}");
        assert!(
            text.contains(
                "not under the limiter: the figure is NVML-sampled, and kernels need the limiter"
            ),
            "{text}"
        );
        assert!(!text.contains("KERNEL"), "{text}");
        let serve = text_of(&draw(&m, &open(fixture::SQUEEZED_ID), 160, 48));
        assert!(
            serve.contains("the limiter is loaded but timed no launch: the figure is NVML-sampled"),
            "{serve}"
        );
        let notebook = text_of(&draw(&m, &open(fixture::UNLIMITED_ID), 160, 48));
        assert!(
            notebook.contains("GPU0  nvml n/a (per-process utilisation not supported"),
            "{notebook}"
        );
    }

    #[test]
    fn main_table() {
        let m = model();
        both("table", &m, &ViewState::default());
    }

    #[test]
    fn tree_expanded() {
        let m = model();
        both(
            "tree",
            &m,
            &with(&m, &[Action::ToggleTree, Action::Down, Action::Down]),
        );
    }

    #[test]
    fn sorted_by_name_ascending() {
        let m = model();
        let mut s = ViewState::default();
        while s.sort != crate::tui::rows::SortKey::Name {
            s.update(Action::NextSort, &m);
        }
        s.update(Action::ReverseSort, &m);
        let t = draw(&m, &s, 160, 48);
        insta::assert_snapshot!("sorted_by_name_160x48", t.backend());
    }

    #[test]
    fn detail_of_a_container() {
        let m = model();
        let s = with(&m, &[Action::Enter, Action::Enter]);
        assert_eq!(
            s.screen,
            crate::tui::app::Screen::Detail(RowId::Container(fixture::TRAIN_ID.into()))
        );
        both("detail_container", &m, &s);
    }

    /// A region another uid could have written says so in its container's detail.
    #[test]
    fn detail_of_a_container_flags_a_region_other_uids_can_write() {
        let mut m = Model::default();
        let mut snap = fixture::snapshot();
        let c = snap
            .containers
            .iter_mut()
            .find(|c| c.key == fixture::TRAIN_ID)
            .unwrap();
        c.regions[0].writable_by_others = Some("mode 0666: any local user can write it".into());
        m.apply(snap);
        let s = with(&m, &[Action::Enter, Action::Enter]);
        let t = draw(&m, &s, 160, 48);
        let text: String = t
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(
            text.contains("writable by other uids: mode 0666: any local user can write it"),
            "{text}"
        );
    }

    #[test]
    fn detail_of_a_process() {
        let m = model();
        let s = with(&m, &[Action::Enter, Action::Down, Action::Enter]);
        assert!(matches!(
            s.screen,
            crate::tui::app::Screen::Detail(RowId::Process(_))
        ));
        both("detail_process", &m, &s);
    }

    #[test]
    fn help() {
        let m = model();
        both("help", &m, &with(&m, &[Action::ToggleHelp]));
    }

    #[test]
    fn filter_prompt() {
        let m = model();
        let mut actions = vec![Action::OpenFilter];
        actions.extend("serve".chars().map(Action::FilterInput));
        both("filter", &m, &with(&m, &actions));
    }

    #[test]
    fn kill_confirmation() {
        let m = model();
        both(
            "kill_confirm",
            &m,
            &with(&m, &[Action::Enter, Action::Down, Action::AskSignal]),
        );
    }

    #[test]
    fn paused_with_a_status_line() {
        let m = model();
        let mut s = with(&m, &[Action::TogglePause]);
        s.status = Some("sent SIGTERM to 5200".into());
        let t = draw(&m, &s, 80, 24);
        insta::assert_snapshot!("paused_status_80x24", t.backend());
    }

    #[test]
    fn a_limit_below_the_context_charge_is_a_warning() {
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::limit_below_context());
        both("limit_below_context", &m, &ViewState::default());
        let mut s = ViewState::default();
        while !matches!(&s.selected, Some(RowId::Container(k)) if k == fixture::SQUEEZED_ID) {
            s.update(Action::Down, &m);
        }
        s.update(Action::Enter, &m);
        s.update(Action::Down, &m);
        s.update(Action::Up, &m);
        s.update(Action::Enter, &m);
        assert_eq!(
            s.screen,
            crate::tui::app::Screen::Detail(RowId::Container(fixture::SQUEEZED_ID.into()))
        );
        let t = draw(&m, &s, 160, 48);
        insta::assert_snapshot!("limit_below_context_detail_160x48", t.backend());
    }

    #[test]
    fn the_header_counters_explained() {
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::with_errors());
        both("counters", &m, &with(&m, &[Action::ToggleCounters]));
    }

    /// A tenant that made the agent skip libraries, warnings and maps reads: the header counts the
    /// tenants (`skipped 2`) and the `e` dialog lists what each made it skip.
    #[test]
    fn what_tenants_made_the_agent_skip_is_shown() {
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::with_skips());
        let t = draw(&m, &ViewState::default(), 160, 48);
        let text = format!("{}", t.backend());
        assert!(text.contains("errors 0  skipped 2"), "{text}");
        both("skipped", &m, &with(&m, &[Action::ToggleCounters]));
        let t = draw(&m, &with(&m, &[Action::ToggleCounters]), 160, 48);
        let text = format!("{}", t.backend());
        for shown in [
            "skipped 2",
            "7951fb549ab9c2d4e6f8a0b1c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1: libraries skipped 4992",
            "warnings suppressed 12, maps deferred 9, maps read blocked: pid 51234 for 12.3s",
            "/system.slice/cron.service: maps deferred 1",
            "maps scan: 412 processes, last cycle 0.25s, 10 deferred, 1 blocked, 2 polls late",
        ] {
            assert!(text.contains(shown), "{shown:?} not in {text}");
        }
    }

    #[test]
    fn no_gpu_no_driver() {
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::no_driver());
        both("no_driver", &m, &ViewState::default());
    }

    #[test]
    fn nothing_seen_yet() {
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::empty());
        both("empty", &m, &ViewState::default());
        let waiting = Model {
            source: crate::tui::app::SourceStatus {
                name: "in-process".into(),
                error: None,
            },
            ..Model::default()
        };
        let t = draw(&waiting, &ViewState::default(), 80, 24);
        insta::assert_snapshot!("waiting_80x24", t.backend());
    }

    #[test]
    fn a_source_error_is_shown() {
        let mut m = model();
        m.source.error =
            Some("no agent answers on /run/vgpu-agent/agent.sock: Connection refused".into());
        let t = draw(&m, &ViewState::default(), 80, 24);
        insta::assert_snapshot!("source_error_80x24", t.backend());
    }

    /// A daemon whose collector is late and a region over its read budget: the header says STALE
    /// with the snapshot's age, and how many regions were not read whole.
    #[test]
    fn a_stale_snapshot_and_an_unread_region_are_marked() {
        let mut m = model();
        let mut s = fixture::snapshot();
        s.agent.stale = true;
        s.agent.regions_unread = vec![crate::model::RegionUnread {
            path: "/var/lib/vgpu-agent/regions/hostile.cache".into(),
            reason: "retries".into(),
            slots: 1023,
            blocked_seconds: 0.0,
        }];
        m.apply(s);
        let taken = m.snapshot.as_ref().unwrap().taken_at_unix_ms;
        let interval = std::time::Duration::from_secs(1);
        assert!(m.check_stale(taken + 12_400, interval));
        assert_eq!(m.stale_seconds, Some(12));
        assert!(!m.check_stale(taken + 12_900, interval), "same second");
        let t = draw(&m, &ViewState::default(), 160, 48);
        let text = format!("{}", t.backend());
        assert!(text.contains("STALE 12s"), "{text}");
        assert!(text.contains("unread 1"), "{text}");
        insta::assert_snapshot!("stale_160x48", t.backend());
        // A fresh snapshot, read within two intervals, is not stale.
        m.apply(fixture::snapshot());
        assert!(m.check_stale(taken + 1_500, interval));
        assert_eq!(m.stale_seconds, None);
        assert!(m.check_stale(taken + 2_500, interval), "past two intervals");
        assert_eq!(m.stale_seconds, Some(2));
    }

    #[test]
    fn no_color_uses_no_colours_anywhere() {
        let m = model();
        let screens = [
            vec![],
            vec![Action::ToggleTree],
            vec![Action::Enter, Action::Enter],
            vec![Action::ToggleHelp],
            vec![Action::Enter, Action::Down, Action::AskSignal],
        ];
        for actions in screens {
            let mut s = with(&m, &actions);
            s.no_color = true;
            let t = draw(&m, &s, 160, 48);
            for cell in t.backend().buffer().content() {
                assert_eq!(
                    (cell.fg, cell.bg),
                    (Color::Reset, Color::Reset),
                    "{actions:?}: {cell:?}"
                );
            }
            let mut colored = s.clone();
            colored.no_color = false;
            let c = draw(&m, &colored, 160, 48);
            assert_eq!(
                format!("{}", t.backend()),
                format!("{}", c.backend()),
                "the same text with and without colour"
            );
        }
        let t = draw(
            &m,
            &ViewState {
                no_color: true,
                ..ViewState::default()
            },
            80,
            24,
        );
        insta::assert_snapshot!("no_color_80x24", t.backend());
    }

    #[test]
    fn tiny_and_zero_sized_terminals_do_not_panic() {
        let m = model();
        for (w, h) in [(1, 1), (10, 3), (0, 0), (40, 10)] {
            for actions in [
                vec![],
                vec![Action::Enter, Action::Enter],
                vec![Action::ToggleHelp],
            ] {
                let s = with(&m, &actions);
                let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
                t.draw(|f| super::render(f, &m, &s)).unwrap();
            }
        }
    }

    /// Two GPUs: the header's line per GPU, a DDP pod whose ranks each use one GPU (its limit is the
    /// sum of the two devices' limits, its communicator shown once with both ranks), and a process
    /// holding memory on both GPUs, shown per GPU.
    #[test]
    fn two_gpus() {
        use fixture::two_gpus::{DDP_ID, PIPELINE_ID};
        let mut m = Model::default();
        m.source.name = "in-process".into();
        m.apply(fixture::two_gpus::snapshot());
        both("two_gpus", &m, &ViewState::default());
        let open = |key: &str| {
            let mut s = ViewState::default();
            s.update(Action::Home, &m);
            for _ in 0..4 {
                if matches!(&s.selected, Some(RowId::Container(k)) if k == key) {
                    break;
                }
                s.update(Action::Down, &m);
            }
            assert!(matches!(&s.selected, Some(RowId::Container(k)) if k == key));
            // The first Enter expands the container, the second opens its detail.
            s.update(Action::Enter, &m);
            s
        };
        let mut ddp = open(DDP_ID);
        ddp.update(Action::Enter, &m);
        assert_eq!(
            ddp.screen,
            crate::tui::app::Screen::Detail(RowId::Container(DDP_ID.into()))
        );
        both("two_gpus_ddp_detail", &m, &ddp);
        let text = format!("{}", draw(&m, &ddp, 160, 48).backend());
        assert!(
            text.contains(
                "nccl  commId 0x5d2c81e0a4f3b7c9: 2 ranks of 2 here, 2400 calls, 600.00 GiB"
            ),
            "{text}"
        );
        assert!(
            text.contains("  rank 0/2 pid 7100 comm 0x7f3a5c001200: 1200 calls, 300.00 GiB"),
            "{text}"
        );
        assert!(
            text.contains("  rank 1/2 pid 7101 comm 0x7f9e14003400: 1200 calls, 300.00 GiB"),
            "{text}"
        );
        assert!(
            text.contains("GPU0 6.00 GiB of 8.00 GiB")
                && text.contains("GPU1 9.00 GiB of 12.00 GiB"),
            "{text}"
        );
        let mut pipe = open(PIPELINE_ID);
        pipe.update(Action::Down, &m);
        assert!(matches!(&pipe.selected, Some(RowId::Process(k)) if k.pid == 7200));
        pipe.update(Action::Enter, &m);
        both("two_gpus_process_detail", &m, &pipe);
        let text = format!("{}", draw(&m, &pipe, 160, 48).backend());
        assert!(
            text.contains(
                "memory by GPU  GPU0 3.00 GiB (nvml 3.02 GiB); GPU1 5.50 GiB (nvml 5.52 GiB)"
            ),
            "{text}"
        );
    }
}
