//! The text of `memlens lines` and `@memlens.profile`: memory by source line.

use super::layout::{clip_end, push_wrapped, MAX_WIDTH};
use crate::analysis::lines::LinesReport;
use crate::units::format_bytes;
use std::fmt::Write;

/// The terminal text.
pub fn text(r: &LinesReport) -> String {
    let mut o = String::new();
    let what = match &r.function {
        Some(f) => format!("{f} ({})", r.file),
        None => r.file.clone(),
    };
    let _ = writeln!(
        o,
        "Memory by line of {what}, device {}: {} events, {} allocated before, peak {}",
        r.device,
        r.events,
        format_bytes(r.allocated_before_bytes),
        format_bytes(r.peak_allocated_bytes)
    );
    if !r.rows.is_empty() {
        let _ = writeln!(
            o,
            "\n  {:>5}  {:>11}  {:>11}  {:>12}  {:>11}  source",
            "line", "allocated", "freed", "net", "peak"
        );
    }
    let dash = |b: u64| {
        if b == 0 {
            "-".to_string()
        } else {
            format_bytes(b)
        }
    };
    for row in &r.rows {
        let net = match row.net_bytes {
            0 => "0".to_string(),
            n if n > 0 => format!("+{}", format_bytes(n as u64)),
            n => format!("-{}", format_bytes(n.unsigned_abs())),
        };
        let head = format!(
            "  {:>5}  {:>11}  {:>11}  {:>12}  {:>11}  ",
            row.line,
            dash(row.allocated_bytes),
            dash(row.freed_bytes),
            net,
            format_bytes(row.peak_allocated_bytes)
        );
        let room = MAX_WIDTH.saturating_sub(head.chars().count());
        let src = row.text.as_deref().map_or("", str::trim);
        let _ = writeln!(o, "{head}{}", clip_end(src, room));
    }
    for w in &r.warnings {
        push_wrapped(&mut o, "warning: ", "  ", w);
    }
    super::layout::fit(o)
}
