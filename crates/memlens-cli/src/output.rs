//! Printing: a result as its `memlens/1` JSON document or its text (both made
//! by the library's `render` module), and the one-line error.

use serde::Serialize;
use std::io::Write;

/// Exit code for success.
pub const OK: u8 = 0;
/// Exit code for a failed check (`check`, `leaks --fail-on-leak`).
pub const CHECK_FAILED: u8 = 1;
/// Exit code for bad input or usage, or an output that could not be written.
pub const USAGE: u8 = 2;

/// Prints `body` as a JSON document tagged `"schema": "memlens/1"`.
pub fn print_json<T: Serialize>(body: &T) -> anyhow::Result<()> {
    let mut text = memlens::render::json(body, true)?;
    text.push('\n');
    print_text(&text)
}

/// Prints the JSON document of `body` when `json`, else the text `render` makes.
pub fn print<T: Serialize>(
    body: &T,
    json: bool,
    render: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        print_json(body)
    } else {
        print_text(&render(body))
    }
}

/// Prints text to stdout; a closed pipe (`memlens ... | head`) is not an error.
pub fn print_text(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Prints the one-line error and returns exit code 2 (bad input or usage).
pub fn fail(e: &anyhow::Error) -> u8 {
    // `{:#}` joins the context chain on one line: "while reading X: Y".
    let line = format!("{e:#}").replace('\n', " ");
    eprintln!("memlens: error: {line}");
    2
}
