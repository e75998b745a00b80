//! The terminal UI of `memlens top` (ratatui over crossterm): the event loop
//! here, the drawing in [`render`], text helpers in [`mod@format`].

pub mod format;
pub mod render;

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use memlens::live::Model;
use render::UiState;
use std::time::{Duration, Instant};

/// What the UI drives once per refresh: take a sample into the model.
pub trait Ticker {
    /// Takes one sample; an error is shown in the status line, and the UI
    /// keeps the previous figures and tries again next tick.
    fn tick(&mut self) -> Result<(), String>;
    /// The model to draw.
    fn model(&self) -> &Model;
}

/// Runs the UI until the user quits (q, Esc, Ctrl-C) or `max_samples` samples
/// were taken. Restores the terminal on every way out.
pub fn run(
    ticker: &mut dyn Ticker,
    interval: Duration,
    max_samples: Option<u64>,
) -> std::io::Result<()> {
    let mut terminal = ratatui::try_init()?;
    let result = event_loop(&mut terminal, ticker, interval, max_samples);
    ratatui::restore();
    result
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    ticker: &mut dyn Ticker,
    interval: Duration,
    max_samples: Option<u64>,
) -> std::io::Result<()> {
    let mut ui = UiState {
        interval_s: interval.as_secs_f64(),
        ..UiState::default()
    };
    let mut taken = 0u64;
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            if max_samples.is_some_and(|m| taken >= m) {
                return Ok(());
            }
            ui.status = ticker.tick().err();
            taken += 1;
            // Keep the cadence; after a stall, skip the missed ticks.
            next += interval;
            let now = Instant::now();
            if next <= now {
                next = now + interval;
            }
            terminal.draw(|f| render::draw(f, ticker.model(), &ui))?;
        }
        let wait = next.saturating_duration_since(Instant::now());
        if !event::poll(wait)? {
            continue;
        }
        let redraw = match event::read()? {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                let rows = render::rows(ticker.model()).len();
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Down | KeyCode::Char('j') => {
                        ui.selected = (ui.selected + 1).min(rows.saturating_sub(1));
                        true
                    }
                    KeyCode::Up | KeyCode::Char('k') => {
                        ui.selected = ui.selected.min(rows.saturating_sub(1)).saturating_sub(1);
                        true
                    }
                    KeyCode::Home => {
                        ui.selected = 0;
                        true
                    }
                    KeyCode::End => {
                        ui.selected = rows.saturating_sub(1);
                        true
                    }
                    _ => false,
                }
            }
            Event::Resize(..) => true,
            _ => false,
        };
        if redraw {
            terminal.draw(|f| render::draw(f, ticker.model(), &ui))?;
        }
    }
}
