//! The text of `memlens leaks`: the verdict first, then the evidence.

use super::layout::{byte_series, clip, push_wrapped, MAX_WIDTH};
use crate::analysis::leaks::{Confidence, LeakReport};
use crate::units::format_bytes;
use std::fmt::Write;

/// The terminal text: the verdict first, then the evidence.
pub fn text(r: &LeakReport) -> String {
    let mut o = String::new();
    push_wrapped(&mut o, "", "", &r.verdict);
    let shown: Vec<_> = r
        .leaks
        .iter()
        .filter(|l| l.confidence >= Confidence::Medium)
        .take(5)
        .collect();
    for l in &shown {
        let tail = format!(
            "+{} over {} points (+{}/step, +{} blocks), {:?} confidence",
            format_bytes(l.bytes),
            l.steps,
            format_bytes(l.bytes_per_step),
            l.count,
            l.confidence
        );
        let shown = match &l.process {
            Some(p) => format!("[{p}] {}", l.display()),
            None => l.display(),
        };
        let _ = writeln!(o, "\n  {}", clip(&shown, MAX_WIDTH - 2));
        let _ = writeln!(o, "    {tail}");
        if let Some(lib) = l.library_line() {
            push_wrapped(&mut o, "    ", "      ", &lib);
        }
        // The full series is in --json; a person reads its ends, slope and shape.
        let _ = writeln!(o, "    live: {}", byte_series(&l.evidence));
        push_wrapped(&mut o, "    fix: ", "         ", &l.suggestion);
        o.push_str(&l.quote.render("    "));
    }
    let low = r.leaks.len() - shown.len();
    if low > 0 {
        let _ = writeln!(
            o,
            "\n  ({low} sites with irregular growth not shown; see --json)"
        );
    }
    super::layout::fit(o)
}
