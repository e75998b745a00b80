//! The text of `memlens oom`: the cause paragraph first, then the figures,
//! what was live and the fixes, for a snapshot's OOM or an error message alone.

use super::layout::{clip, push_wrapped, wrap};
use crate::oom::message::{Allocator, OomMessage};
use crate::oom::snapshot::CapSource;
use crate::oom::whatif::StepModel;
use crate::oom::{MessageDiagnosis, OomReport};
use crate::units::format_bytes;
use std::fmt::Write as _;

/// The text report: figures, cause, explanation, fixes.
pub fn message_text(d: &MessageDiagnosis) -> String {
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
        push_wrapped(&mut s, &format!("  {label:<20}"), &" ".repeat(22), &value);
    }
    let _ = writeln!(s);
    push_wrapped(&mut s, "cause: ", "  ", &d.cause.to_string());
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
    super::layout::fit(s)
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
pub fn text(r: &OomReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "CUDA out of memory at event {} of device {}: cause {}",
        r.event_index, r.device, r.cause
    );
    for line in wrap(&r.explanation, 88) {
        let _ = writeln!(s, "  {line}");
    }
    before_failure(&mut s, r);
    live_at_failure(&mut s, r);
    fixes_section(&mut s, r);
    for w in &r.warnings {
        for (j, line) in wrap(&format!("note: {w}"), 86).iter().enumerate() {
            let _ = writeln!(s, "{}{line}", if j == 0 { "" } else { "  " });
        }
    }
    super::layout::fit(s)
}

/// The figures right before the failure, a row each.
fn before_failure(s: &mut String, r: &OomReport) {
    let _ = writeln!(s, "\nright before the failure:");
    let mut row = |label: &str, value: String| {
        push_wrapped(s, &format!("  {label:<22}"), &" ".repeat(24), &value);
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
            CapSource::Recorded => "recorded by memlens.record".to_string(),
        };
        row(
            "memory cap",
            format!("{}{fraction} ({how})", format_bytes(c.bytes)),
        );
    }
    row("device", device_row(r));
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
}

/// The device's row: its total and free memory, and what lay outside PyTorch.
fn device_row(r: &OomReport) -> String {
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
    device
}

/// What was live at the failure: by category, then the largest sites.
fn live_at_failure(s: &mut String, r: &OomReport) {
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
        let _ = writeln!(s);
        push_wrapped(s, "live at the failure: ", "  ", &cats);
        for site in r.live_at_oom.iter().take(5) {
            let _ = writeln!(
                s,
                "  {:>11}  {:<16} {} ({} blocks)",
                format_bytes(site.bytes),
                site.category.as_str(),
                clip(&site.site, 72),
                site.count
            );
        }
    }
}

/// How the fixes' failing step was simulated, in words.
fn basis(m: &StepModel) -> String {
    let step = m.failing_step;
    match (m.template_step, &m.completion) {
        (Some(t), _) => format!(
            "simulated on step {step} modelled from step {t} (growth {:.2}x)",
            m.growth
        ),
        (None, Some(c)) => format!(
            "simulated on step {step} up to the failure in the {}, then its backward modelled{}",
            if c.forward_whole { "loss" } else { "forward" },
            if c.next_step_modelled {
                " and the next step after it"
            } else {
                ""
            }
        ),
        (None, None) => format!("simulated on step {step} up to the failure only"),
    }
}

/// The fixes, in the one order every surface shows
/// ([`OomReport::advice`]): those that help, then those simulated to gain
/// nothing.
fn fixes_section(s: &mut String, r: &OomReport) {
    let basis = r
        .step_model
        .as_ref()
        .map_or("not simulated".to_string(), basis);
    if let Some(m) = &r.batch_model {
        let _ = writeln!(s);
        push_wrapped(s, "batch model: ", "  ", &m.text);
    }
    let _ = writeln!(s, "\nfixes ({basis}):");
    for (i, fix) in r.fixes.iter().enumerate() {
        let text = format!("[{}] {}", fix.verdict(), fix.action);
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
                Some(w) if f.kind != crate::oom::FixKind::EmptyCache && !w.config.is_empty() => {
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
}
