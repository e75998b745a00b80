//! `memlens oom`: why an allocation failed and what would fix it.
//!
//! From the error message alone (`--message`, `--message-file`, or stdin):
//! the figures it printed, the cause and the fixes. The snapshot analysis
//! (`memlens oom SNAP`) is not built yet.

use crate::output::{print_json, print_text, OK};
use anyhow::Context;
use memlens::oom::message::{Allocator, OomMessage};
use memlens::oom::MessageDiagnosis;
use memlens::units::format_bytes;
use std::fmt::Write as _;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

/// Arguments of `memlens oom`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A snapshot dumped at the OOM (analysis not available yet), or `-` to
    /// read the error message from stdin.
    pub snap: Option<PathBuf>,
    /// The out-of-memory error text (a whole traceback or log is fine).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["message_file", "snap"])]
    pub message: Option<String>,
    /// A file holding the error text (a log, a traceback); `-` for stdin.
    #[arg(long, value_name = "FILE", conflicts_with = "snap")]
    pub message_file: Option<PathBuf>,
    /// Print JSON (`"schema": "memlens/1"`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens oom`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let (text, origin) = match (args.message, &args.message_file, &args.snap) {
        (Some(t), _, _) => (t, "--message".to_string()),
        (None, Some(f), _) if f.as_os_str() == "-" => (read_stdin()?, "stdin".to_string()),
        (None, Some(f), _) => (read_file(f)?, f.display().to_string()),
        (None, None, Some(p)) if p.as_os_str() == "-" => (read_stdin()?, "stdin".to_string()),
        (None, None, Some(p)) => anyhow::bail!(
            "{}: snapshot analysis (`memlens oom SNAP`) is not available yet; pass the error \
             text with --message TEXT, --message-file FILE, or on stdin (`memlens oom -`)",
            p.display()
        ),
        (None, None, None) => (read_stdin()?, "stdin".to_string()),
    };
    let diagnosis = memlens::oom::explain_message(&text).with_context(|| origin)?;
    if args.json {
        print_json(&diagnosis)?;
    } else {
        print_text(&render(&diagnosis))?;
    }
    Ok(OK)
}

fn read_stdin() -> anyhow::Result<String> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("memlens: paste the out-of-memory message, then Ctrl-D");
    }
    let mut bytes = Vec::new();
    stdin.read_to_end(&mut bytes).context("stdin")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).map_err(|error| memlens::Error::Io {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The text report: figures, cause, explanation, fixes.
fn render(d: &MessageDiagnosis) -> String {
    let m = &d.message;
    let mut s = String::new();
    let kind = m.device_kind.as_deref().unwrap_or("An");
    let form = serde_json::to_value(m.form)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "{kind} out-of-memory message, form {form} (PyTorch {})",
        m.pytorch_versions
    );
    for (label, value) in figures(m, d) {
        let _ = writeln!(s, "  {label:<20}{value}");
    }
    let _ = writeln!(s, "\ncause: {}", d.cause);
    for line in wrap(&d.explanation, 86) {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(s, "\nfixes:");
    for (i, fix) in d.fixes.iter().enumerate() {
        for (j, line) in wrap(&fix.action, 82).iter().enumerate() {
            if j == 0 {
                let _ = writeln!(s, "  {}. {line}", i + 1);
            } else {
                let _ = writeln!(s, "     {line}");
            }
        }
    }
    s
}

/// The printed figures, labelled, in the message's order.
fn figures(m: &OomMessage, d: &MessageDiagnosis) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if let Some(r) = &m.requested {
        let rounded = m.allocator == Allocator::Native && r.bytes < 1 << 60;
        let note = if rounded {
            " (the rounded block, not the tensor)"
        } else {
            ""
        };
        rows.push(("tried to allocate", format!("{}{note}", r.text)));
    }
    let index = m.device_index.map_or(String::new(), |i| format!("{i}: "));
    match (&m.total_capacity, &m.device_free) {
        (Some(t), Some(f)) => rows.push((
            "device",
            format!("{index}{} total, {} free", t.text, f.text),
        )),
        (Some(t), None) => rows.push(("device", format!("{index}{} total", t.text))),
        (None, Some(f)) => rows.push(("device", format!("{index}{} free", f.text))),
        (None, None) => {
            if let Some(i) = m.device_index {
                rows.push(("device", i.to_string()));
            }
        }
    }
    if let Some(p) = &m.this_process {
        rows.push((
            "this process",
            format!("{} (including non-PyTorch memory)", p.text),
        ));
    }
    if !m.other_processes.is_empty() {
        let list = m
            .other_processes
            .iter()
            .map(|p| {
                let me = if p.likely_this_process {
                    " (likely this process)"
                } else {
                    ""
                };
                format!("pid {} {}{me}", p.pid, p.used.text)
            })
            .collect::<Vec<_>>()
            .join(", ");
        rows.push((
            "other processes",
            format!("{}: {list}", format_bytes(d.other_processes_bytes)),
        ));
    }
    if let Some(a) = &m.allowed {
        let note = if d.memory_cap_bytes.is_some() {
            "(memory fraction)"
        } else {
            "(no cap set)"
        };
        rows.push(("allowed", format!("{} {note}", a.text)));
    }
    if let Some(a) = &m.allocated {
        rows.push(("allocated", format!("{} by PyTorch", a.text)));
    }
    if let Some(p) = &m.private_pools {
        rows.push(("private pools", format!("{} free in private pools", p.text)));
    }
    if let Some(u) = &m.reserved_unallocated {
        rows.push(("cached, unallocated", u.text.clone()));
    }
    match (&m.reserved_total, d.reserved_bytes) {
        (Some(r), _) => rows.push(("reserved", r.text.clone())),
        (None, Some(r)) => rows.push((
            "reserved",
            format!("{} (allocated + unallocated)", format_bytes(r)),
        )),
        _ => {}
    }
    rows
}

/// Word-wraps `text` to `width` columns.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}
