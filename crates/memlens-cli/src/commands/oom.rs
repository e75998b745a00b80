//! `memlens oom`: why an allocation failed and what would fix it.
//!
//! On a snapshot whose trace holds the OOM (`memlens oom SNAP`): the state
//! right before the failure, the cause, and fixes checked by simulation; the
//! error text (`--message`, `--message-file`) adds the device's total and the
//! cap. From the error message alone (`--message`, `--message-file`, or
//! stdin): the figures it printed, the cause and the fixes.

use crate::output::{print_json, print_text, OK};
use anyhow::Context;
use memlens::oom::fixes::Basis;
use memlens::oom::message::{Allocator, OomMessage};
use memlens::oom::snapshot::CapSource;
use memlens::oom::{MessageDiagnosis, OomOptions, OomReport};
use memlens::units::format_bytes;
use std::fmt::Write as _;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

/// Arguments of `memlens oom`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A snapshot taken at or after the OOM (its trace holds the `oom`
    /// event), or `-` to read the error message from stdin.
    pub snap: Option<PathBuf>,
    /// The out-of-memory error text (a whole traceback or log is fine); with
    /// SNAP, it tells the device's total and the memory cap.
    #[arg(long, value_name = "TEXT", conflicts_with = "message_file")]
    pub message: Option<String>,
    /// A file holding the error text (a log, a traceback); `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub message_file: Option<PathBuf>,
    /// Total memory of the GPU (e.g. 80GiB, or a name such as H100), for the
    /// memory outside PyTorch, the cap's fraction and the predictions.
    #[arg(long, value_name = "SIZE|GPU", value_parser = parse_device_memory)]
    pub device_memory: Option<u64>,
    /// The failing step's batch size, to say which batch fits.
    #[arg(long, value_name = "N")]
    pub batch: Option<u64>,
    /// Allocation sites to list as live at the OOM.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON (`"schema": "memlens/1"`).
    #[arg(long)]
    pub json: bool,
}

fn parse_device_memory(s: &str) -> Result<u64, String> {
    memlens::units::parse_device_memory(s).map_err(|e| e.to_string())
}

/// Runs `memlens oom`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(p) = args.snap.as_ref().filter(|p| p.as_os_str() != "-") {
        return run_snapshot(p, &args);
    }
    if args.device_memory.is_some() || args.batch.is_some() {
        anyhow::bail!(
            "--device-memory and --batch apply to a snapshot: memlens oom SNAP [--message TEXT]"
        );
    }
    let (text, origin) = match message_text(&args)? {
        Some(t) => t,
        None => (read_stdin()?, "stdin".to_string()),
    };
    let diagnosis = memlens::oom::explain_message(&text).with_context(|| origin)?;
    if args.json {
        print_json(&diagnosis)?;
    } else {
        print_text(&render(&diagnosis))?;
    }
    Ok(OK)
}

/// The message text given by `--message` or `--message-file`, with where it came from.
fn message_text(args: &Args) -> anyhow::Result<Option<(String, String)>> {
    Ok(match (&args.message, &args.message_file) {
        (Some(t), _) => Some((t.clone(), "--message".to_string())),
        (None, Some(f)) if f.as_os_str() == "-" => Some((read_stdin()?, "stdin".to_string())),
        (None, Some(f)) => Some((read_file(f)?, f.display().to_string())),
        (None, None) => None,
    })
}

fn run_snapshot(path: &Path, args: &Args) -> anyhow::Result<u8> {
    let message = match message_text(args)? {
        Some((text, origin)) => Some(memlens::oom::message::find(&text).with_context(|| origin)?),
        None => None,
    };
    let snap = super::load(path)?;
    let opts = OomOptions {
        message,
        device_memory: args.device_memory,
        batch: args.batch,
        top: args.top,
    };
    let Some(report) = memlens::oom::analyze_snapshot(&snap, &opts)? else {
        anyhow::bail!(
            "{}: the trace holds no OOM (no `oom` event): dump the snapshot in the `except \
             torch.OutOfMemoryError` handler with the trace recording on, or pass the error text \
             with --message",
            path.display()
        );
    };
    if args.json {
        print_json(&report)?;
    } else {
        print_text(&render_report(&report))?;
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

/// The text report of a snapshot's OOM: the cause paragraph first, then the
/// numbers, what was live, and the fixes (`doctor` reuses it).
pub fn render_report(r: &OomReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "CUDA out of memory at event {} of device {}: cause {}",
        r.event_index, r.device, r.cause
    );
    for line in wrap(&r.explanation, 88) {
        let _ = writeln!(s, "  {line}");
    }
    let _ = writeln!(s, "\nright before the failure:");
    let mut row = |label: &str, value: String| {
        let _ = writeln!(s, "  {label:<22}{value}");
    };
    row(
        "request",
        format!(
            "{} ({} pool, stream {}); the allocator tried a {} segment",
            format_bytes(r.requested_bytes),
            r.pool,
            r.stream,
            format_bytes(r.tried_to_allocate_bytes)
        ),
    );
    row(
        "reserved",
        format!(
            "{} = {} allocated + {} cached but free",
            format_bytes(r.reserved_bytes),
            format_bytes(r.allocated_bytes),
            format_bytes(r.reserved_unallocated_bytes)
        ),
    );
    let pieces = r
        .free_pieces
        .largest
        .iter()
        .take(5)
        .map(|b| format_bytes(*b))
        .collect::<Vec<_>>()
        .join(", ");
    row(
        "largest free block",
        format!(
            "{} in the {} pool of stream {}: {} free pieces, {} in all{}",
            format_bytes(r.largest_free_block_bytes),
            r.pool,
            r.stream,
            r.free_pieces.count,
            format_bytes(r.free_pieces.total_bytes),
            if pieces.is_empty() {
                String::new()
            } else {
                format!(" (largest {pieces})")
            }
        ),
    );
    if r.other_streams_reserved_bytes > 0 {
        row(
            "other streams",
            format!(
                "{} reserved, {} of it free (unusable by this request)",
                format_bytes(r.other_streams_reserved_bytes),
                format_bytes(r.other_streams_free_bytes)
            ),
        );
    }
    if r.private_pools_reserved_bytes > 0 {
        row(
            "private pools",
            format!(
                "{} reserved, {} of it free (CUDA graphs, MemPool)",
                format_bytes(r.private_pools_reserved_bytes),
                format_bytes(r.private_pools_free_bytes)
            ),
        );
    }
    if let Some(c) = &r.memory_cap {
        let fraction = c
            .fraction
            .map_or(String::new(), |f| format!(", fraction {f}"));
        let how = match c.source {
            CapSource::Message => "from the message".to_string(),
            CapSource::Inferred => "inferred".to_string(),
        };
        row(
            "memory cap",
            format!("{}{fraction} ({how})", format_bytes(c.bytes)),
        );
    }
    let d = &r.device_memory;
    let mut device = match d.total_bytes {
        Some(t) => format!(
            "{} total, {} free",
            format_bytes(t),
            format_bytes(d.free_bytes)
        ),
        None => format!(
            "{} free (total unknown: --device-memory)",
            format_bytes(d.free_bytes)
        ),
    };
    if let Some(o) = d.outside_pytorch_bytes {
        device.push_str(&format!("; {} outside PyTorch", format_bytes(o)));
        if let Some(p) = d.other_processes_bytes {
            device.push_str(&format!(" ({} other processes)", format_bytes(p)));
        }
    }
    row("device", device);
    if !r.message_check.is_empty() {
        let off: Vec<String> = r
            .message_check
            .iter()
            .filter(|c| !c.agrees)
            .map(|c| {
                format!(
                    "{} {} vs {}",
                    c.figure,
                    c.printed,
                    format_bytes(c.snapshot_bytes)
                )
            })
            .collect();
        row(
            "message",
            if off.is_empty() {
                "its figures agree with the snapshot".to_string()
            } else {
                format!("disagrees: {}", off.join("; "))
            },
        );
    }
    if !r.category_detail.is_empty() {
        let cats = r
            .category_detail
            .iter()
            .filter(|c| c.bytes > 0)
            .map(|c| {
                format!(
                    "{} {}",
                    c.category.as_str().replace('_', " "),
                    format_bytes(c.bytes)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(s, "\nlive at the failure: {cats}");
        for site in r.live_at_oom.iter().take(5) {
            let _ = writeln!(
                s,
                "  {:>11}  {:<16} {} ({} blocks)",
                format_bytes(site.bytes),
                site.category.as_str(),
                site.site,
                site.count
            );
        }
    }
    let basis = match &r.step_model {
        Some(m) => match m.template_step {
            Some(t) => format!(
                "simulated on step {} modelled from step {t} (growth {:.2}x)",
                m.failing_step, m.growth
            ),
            None => format!(
                "simulated on step {} up to the failure only",
                m.failing_step
            ),
        },
        None => "not simulated".to_string(),
    };
    let _ = writeln!(s, "\nfixes ({basis}):");
    for (i, fix) in r.fixes.iter().enumerate() {
        let tag = match (fix.fits, fix.basis) {
            (Some(true), _) => "fits",
            (Some(false), _) => "helps, not enough",
            (None, Basis::Estimated) => "estimate",
            (None, _) => "advice",
        };
        let text = format!("[{tag}] {}", fix.action);
        for (j, line) in wrap(&text, 84).iter().enumerate() {
            if j == 0 {
                let _ = writeln!(s, "  {}. {line}", i + 1);
            } else {
                let _ = writeln!(s, "     {line}");
            }
        }
    }
    if !r.not_helpful.is_empty() {
        let tried = r
            .not_helpful
            .iter()
            .map(|f| match &f.what_if {
                Some(w) if f.kind != memlens::oom::FixKind::EmptyCache && !w.config.is_empty() => {
                    w.config.clone()
                }
                _ => f.kind.as_str().replace('_', " "),
            })
            .collect::<Vec<_>>()
            .join(", ");
        for line in wrap(&format!("not advised (simulated, no gain): {tried}"), 86) {
            let _ = writeln!(s, "  {line}");
        }
    }
    for w in &r.warnings {
        for (j, line) in wrap(&format!("note: {w}"), 86).iter().enumerate() {
            let _ = writeln!(s, "{}{line}", if j == 0 { "" } else { "  " });
        }
    }
    s
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
