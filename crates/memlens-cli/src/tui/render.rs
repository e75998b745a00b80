//! Draws one frame of `memlens top` from the model: a header, one line per
//! GPU, the process table (NVML used, PyTorch reserved and allocated, the gap
//! between them, step, history), the selected process's history graph, and
//! the alerts.

use super::format::{
    bytes_or_dash, clock, command_label, delta_or_dash, percent, sparkline, user_label,
};
use memlens::live::alerts::AboveRule;
use memlens::live::{Model, ProcessSample};
use memlens::units::format_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table, TableState};
use ratatui::Frame;

/// Width of the per-process history column, in cells.
const HISTORY_COLS: usize = 20;
/// Width of a GPU's memory bar, in cells.
const BAR_COLS: usize = 20;

/// What the UI adds to the model: the selection and a status line.
#[derive(Debug, Clone, Default)]
pub struct UiState {
    /// Index of the selected process row.
    pub selected: usize,
    /// A transient message (e.g. the last sampling error).
    pub status: Option<String>,
    /// The refresh interval, seconds.
    pub interval_s: f64,
}

/// Every process row in display order: (GPU index, process).
pub fn rows(model: &Model) -> Vec<(u32, &ProcessSample)> {
    model
        .latest()
        .map(|s| {
            s.gpus
                .iter()
                .flat_map(|g| g.processes.iter().map(move |p| (g.index, p)))
                .collect()
        })
        .unwrap_or_default()
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, model: &Model, ui: &UiState) {
    let gpu_count = model.latest().map_or(0, |s| s.gpus.len()) as u16;
    let alert_lines = alert_lines(model);
    let [header, gpus, table, detail, alerts] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpu_count.max(1) + 2),
        Constraint::Min(4),
        Constraint::Length(6),
        Constraint::Length(alert_lines.len().clamp(1, 6) as u16 + 2),
    ])
    .areas(frame.area());
    draw_header(frame, header, model, ui);
    draw_gpus(frame, gpus, model);
    let rows = rows(model);
    let selected = ui.selected.min(rows.len().saturating_sub(1));
    draw_table(frame, table, model, &rows, selected);
    draw_detail(frame, detail, model, rows.get(selected).copied());
    frame.render_widget(
        Paragraph::new(alert_lines).block(Block::default().borders(Borders::ALL).title(" Alerts ")),
        alerts,
    );
}

fn draw_header(frame: &mut Frame, area: Rect, model: &Model, ui: &UiState) {
    let (n, time) = model.latest().map_or((0, String::from("--:--:--")), |s| {
        (s.gpus.len(), clock(s.time))
    });
    let mut spans = vec![
        Span::styled(
            " memlens top ",
            Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ),
        Span::raw(format!(
            "  {n} GPU{}  {time}  every {:.1} s   q quit  ↑↓ select",
            if n == 1 { "" } else { "s" },
            ui.interval_s
        )),
    ];
    if let Some(msg) = &ui.status {
        spans.push(Span::styled(
            format!("   {msg}"),
            Style::default().fg(Color::Red),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_gpus(frame: &mut Frame, area: Rect, model: &Model) {
    let mut lines = Vec::new();
    if let Some(s) = model.latest() {
        for g in &s.gpus {
            let pct = percent(g.used_bytes, g.total_bytes);
            let filled = ((pct / 100.0 * BAR_COLS as f64).round() as usize).min(BAR_COLS);
            let full = model
                .config()
                .above
                .is_some_and(|r: AboveRule| r.reached(g.used_bytes, g.total_bytes));
            let colour = if full || pct >= 95.0 {
                Color::Red
            } else if pct >= 80.0 {
                Color::Yellow
            } else {
                Color::Green
            };
            let history = model
                .gpu_history(g.index)
                .map(|h| sparkline(&h.buckets(30)))
                .unwrap_or_default();
            let util = g
                .utilization_pct
                .map_or_else(|| "util —".to_string(), |u| format!("util {u:>3}%"));
            lines.push(Line::from(vec![
                Span::styled(
                    format!("GPU {} ", g.index),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::raw(format!("{:<24} ", truncate(&g.name, 24))),
                Span::styled("█".repeat(filled), Style::default().fg(colour)),
                Span::styled(
                    "░".repeat(BAR_COLS - filled),
                    Style::default().fg(Color::DarkGray),
                ),
                Span::raw(format!(
                    " {} / {} ({pct:.0}%)  {util}  {} proc  ",
                    format_bytes(g.used_bytes),
                    format_bytes(g.total_bytes),
                    g.processes.len()
                )),
                Span::styled(history, Style::default().fg(Color::Cyan)),
            ]));
        }
    }
    if lines.is_empty() {
        lines.push(Line::from("no GPU seen yet"));
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" GPUs ")),
        area,
    );
}

fn draw_table(
    frame: &mut Frame,
    area: Rect,
    model: &Model,
    rows: &[(u32, &ProcessSample)],
    selected: usize,
) {
    let alerting = |gpu: u32, pid: u32| {
        model
            .latest()
            .is_some_and(|s| s.alerts.iter().any(|a| a.gpu == gpu && a.pid == Some(pid)))
    };
    let body: Vec<Row> = rows
        .iter()
        .map(|&(gpu, p)| {
            let t = p.torch.as_ref();
            let history = model
                .process_history(gpu, p.pid)
                .map(|h| sparkline(&h.buckets(HISTORY_COLS)))
                .unwrap_or_default();
            let used = if p.seen_by_nvml {
                bytes_or_dash(p.used_bytes)
            } else {
                "not listed".to_string()
            };
            let style = if alerting(gpu, p.pid) {
                Style::default().fg(Color::Red)
            } else if p.visibility.is_local() {
                Style::default()
            } else {
                Style::default().fg(Color::DarkGray)
            };
            Row::new(vec![
                Cell::from(gpu.to_string()),
                Cell::from(p.pid.to_string()),
                Cell::from(truncate(&user_label(p), 10)),
                Cell::from(used),
                Cell::from(bytes_or_dash(t.map(|t| t.reserved_bytes))),
                Cell::from(bytes_or_dash(t.map(|t| t.allocated_bytes))),
                Cell::from(delta_or_dash(t.and_then(|t| t.gap_bytes))),
                Cell::from(
                    t.and_then(|t| t.step)
                        .map_or_else(|| "—".to_string(), |s| s.to_string()),
                ),
                Cell::from(Span::styled(history, Style::default().fg(Color::Cyan))),
                Cell::from(command_label(p)),
            ])
            .style(style)
        })
        .collect();
    let header = Row::new([
        "GPU",
        "PID",
        "USER",
        "NVML USED",
        "RESERVED",
        "ALLOCATED",
        "GAP",
        "STEP",
        "HISTORY",
        "COMMAND",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let widths = [
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(12),
        Constraint::Length(7),
        Constraint::Length(HISTORY_COLS as u16),
        Constraint::Min(10),
    ];
    let title = " Processes · RESERVED/ALLOCATED: PyTorch's allocator · GAP = NVML used − reserved (outside PyTorch) ";
    let table = Table::new(body, widths)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(title))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!rows.is_empty()).then_some(selected));
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_detail(frame: &mut Frame, area: Rect, model: &Model, row: Option<(u32, &ProcessSample)>) {
    let Some((gpu, p)) = row else {
        frame.render_widget(
            Paragraph::new("no GPU process")
                .block(Block::default().borders(Borders::ALL).title(" History ")),
            area,
        );
        return;
    };
    let history = model.process_history(gpu, p.pid);
    let values = history
        .map(|h| h.buckets(area.width.saturating_sub(2) as usize))
        .unwrap_or_default();
    let (lo, hi) = (
        values.iter().min().copied().unwrap_or(0),
        values.iter().max().copied().unwrap_or(0),
    );
    let span_s = history
        .and_then(|h| Some(h.last()?.0 - h.points().next()?.0))
        .unwrap_or(0.0);
    let title = format!(
        " pid {} on GPU {gpu}: memory over the last {:.0} s, {} – {} ",
        p.pid,
        span_s,
        format_bytes(lo),
        format_bytes(hi)
    );
    let info = match &p.torch {
        Some(t) => format!(
            "allocated {} · active {} · peak allocated {} · reserved {} · step {} · rank {} · published {:.1} s ago{}",
            format_bytes(t.allocated_bytes),
            format_bytes(t.active_bytes),
            format_bytes(t.peak_allocated_bytes),
            format_bytes(t.reserved_bytes),
            t.step.map_or_else(|| "—".to_string(), |s| s.to_string()),
            t.rank.map_or_else(|| "—".to_string(), |r| r.to_string()),
            t.age_s,
            t.leak_alarm.as_ref().map_or_else(String::new, |a| format!(" · LEAK ALARM: {a}")),
        ),
        None => "no allocator figures: the process does not run memlens.record".to_string(),
    };
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [text, graph] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(inner);
    frame.render_widget(Paragraph::new(info), text);
    // Scale from the minimum so a slow leak is visible above the base level.
    let shifted: Vec<u64> = values.iter().map(|v| (v - lo).saturating_add(1)).collect();
    frame.render_widget(
        Sparkline::default()
            .data(&shifted)
            .max((hi - lo).saturating_add(1))
            .style(Style::default().fg(Color::Cyan)),
        graph,
    );
}

fn alert_lines(model: &Model) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let active = model.latest().map(|s| s.alerts.as_slice()).unwrap_or(&[]);
    for a in active {
        lines.push(Line::from(Span::styled(
            format!("● since {}  {}", clock(a.since), a.message),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        )));
    }
    for a in model.alert_log().rev() {
        if lines.len() >= 6 {
            break;
        }
        if !active
            .iter()
            .any(|b| b.kind == a.kind && b.gpu == a.gpu && b.pid == a.pid)
        {
            lines.push(Line::from(Span::styled(
                format!("○ {}  {} (cleared)", clock(a.since), a.message),
                Style::default().fg(Color::DarkGray),
            )));
        }
    }
    if lines.is_empty() {
        let cfg = model.config();
        let mut rules = Vec::new();
        if let Some(g) = &cfg.growth {
            rules.push(format!(
                "growth ≥ {}/min over {:.0} s",
                format_bytes((g.min_rate * 60.0) as u64),
                g.window_s
            ));
        }
        match cfg.above {
            Some(AboveRule::Percent(p)) => rules.push(format!("GPU ≥ {p:.0}%")),
            Some(AboveRule::Bytes(b)) => rules.push(format!("GPU ≥ {}", format_bytes(b))),
            None => {}
        }
        rules.push("leak alarms of memlens.record".to_string());
        lines.push(Line::from(format!(
            "no alert (watching: {})",
            rules.join(", ")
        )));
    }
    lines
}

/// At most `n` characters of `s`, with an ellipsis when cut.
fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memlens::live::procfs::ProcFs;
    use memlens::live::{FakeSource, GpuReading, ModelConfig, ProcessReading, Sampler};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use std::path::PathBuf;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// A fake /proc holding process 4242 (a trainer that publishes its
    /// allocator figures), a passwd file naming our uid "trainer", and a
    /// FakeSource whose GPU 0 holds 4242 (growing) and 9999 (a PID of another
    /// namespace).
    fn world(name: &str, now: f64) -> (Sampler, PathBuf) {
        let root = std::env::temp_dir().join(format!("memlens-tui-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let p = root.join("proc/4242");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("cmdline"), "python\0train.py\0--bs\x0064\0").unwrap();
        std::fs::write(
            p.join("stat"),
            "4242 (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0",
        )
        .unwrap();
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata(&p).unwrap().uid();
        std::fs::write(
            root.join("passwd"),
            format!("trainer:x:{uid}:{uid}::/:/bin/sh\n"),
        )
        .unwrap();
        let pubs = root.join("pubs");
        std::fs::create_dir_all(&pubs).unwrap();
        let doc = format!(
            r#"{{"schema":"memlens/1","pid":4242,"device":0,"rank":0,"step":311,
            "allocated_bytes":{},"reserved_bytes":{},"active_bytes":{},
            "peak_allocated_bytes":{},"time":{now},"leak_alarm":null,"cmdline":"python train.py"}}"#,
            4 * GIB,
            6 * GIB,
            4 * GIB,
            5 * GIB
        );
        std::fs::write(pubs.join("4242-0.json"), doc).unwrap();
        let frames = (0..30u64)
            .map(|t| {
                let used = 7 * GIB + t * 64 * MIB;
                vec![GpuReading {
                    index: 0,
                    name: "NVIDIA Fake 80GB".into(),
                    uuid: None,
                    total_bytes: 80 * GIB,
                    used_bytes: used + GIB,
                    driver_reserved_bytes: None,
                    utilization_pct: Some(87),
                    processes: vec![
                        ProcessReading {
                            pid: 4242,
                            used_bytes: Some(used),
                        },
                        ProcessReading {
                            pid: 9999,
                            used_bytes: Some(GIB),
                        },
                    ],
                }]
            })
            .collect();
        let sampler = Sampler::with_parts(
            Box::new(FakeSource::scripted(frames)),
            ProcFs::with_roots(root.join("proc"), root.join("passwd")).without_device_check(),
            Some(pubs),
        );
        (sampler, root)
    }

    fn screen(model: &Model, width: u16, height: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(width, height)).unwrap();
        let ui = UiState {
            interval_s: 1.0,
            ..UiState::default()
        };
        term.draw(|f| draw(f, model, &ui)).unwrap();
        let buf = term.backend().buffer();
        let mut text = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                text.push_str(buf[(x, y)].symbol());
            }
            text.push('\n');
        }
        text
    }

    #[test]
    fn renders_gpu_processes_gap_and_alerts() {
        let now = 1_800_000_000.0;
        let (mut sampler, root) = world("full", now);
        let mut model = Model::new(ModelConfig {
            growth: Some(memlens::live::GrowthRule {
                min_rate: 10.0 * MIB as f64,
                window_s: 8.0,
            }),
            ..ModelConfig::default()
        });
        for t in 0..30 {
            model.observe(sampler.sample(now + t as f64 * 0.2).unwrap());
        }
        // Published figures stay current only 10 s: sample within that.
        let text = screen(&model, 160, 30);
        std::fs::remove_dir_all(root).unwrap();

        // The GPU line: index, name, used / total, utilisation.
        assert!(text.contains("GPU 0 NVIDIA Fake 80GB"), "{text}");
        assert!(text.contains("9.81 GiB / 80.00 GiB (12%)"), "{text}");
        assert!(text.contains("util  87%"), "{text}");
        // The trainer's row: user, NVML used, reserved, allocated, gap, step, command.
        let row = text.lines().find(|l| l.contains("4242")).unwrap();
        for want in [
            "trainer",
            "8.81 GiB",
            "6.00 GiB",
            "4.00 GiB",
            "+2.81 GiB",
            "311",
            "python train.py --bs 64",
        ] {
            assert!(row.contains(want), "{want:?} not in {row:?}");
        }
        // Its history sparkline rises.
        assert!(row.contains('▁') && row.contains('█'), "{row}");
        // The foreign PID is labelled, not named.
        assert!(
            text.contains("pid 9999 (not in this PID namespace)"),
            "{text}"
        );
        // The growth alert.
        assert!(text.contains("pid 4242 on GPU 0 grows steadily"), "{text}");
        // The detail panel of the selected (first) process.
        assert!(
            text.contains("allocated 4.00 GiB · active 4.00 GiB · peak allocated 5.00 GiB"),
            "{text}"
        );
    }

    #[test]
    fn renders_empty_and_tiny_screens_without_panicking() {
        let model = Model::new(ModelConfig::default());
        let text = screen(&model, 80, 20);
        assert!(text.contains("no GPU seen yet"));
        assert!(text.contains("no alert (watching: leak alarms of memlens.record)"));
        let (mut sampler, root) = world("tiny", 1_800_000_000.0);
        let mut model = Model::new(ModelConfig::default());
        model.observe(sampler.sample(1_800_000_000.0).unwrap());
        std::fs::remove_dir_all(root).unwrap();
        for (w, h) in [(1, 1), (10, 3), (40, 8)] {
            screen(&model, w, h);
        }
    }
}
