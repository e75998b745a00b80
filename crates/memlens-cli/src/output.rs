//! Printing: JSON documents with the schema tag, and the one-line error.

use serde::Serialize;
use std::io::Write;

/// Exit code for success.
pub const OK: u8 = 0;
/// Exit code for a failed check (`check`, `leaks --fail-on-leak`).
pub const CHECK_FAILED: u8 = 1;

#[derive(Serialize)]
struct Doc<'a, T: Serialize> {
    schema: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// Prints `body` as a JSON document tagged `"schema": "memlens/1"`.
pub fn print_json<T: Serialize>(body: &T) -> anyhow::Result<()> {
    let doc = Doc {
        schema: memlens::JSON_SCHEMA,
        body,
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &doc)?;
    writeln!(out)?;
    Ok(())
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
