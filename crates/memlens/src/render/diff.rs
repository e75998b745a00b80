//! The text of `memlens diff A B`: what B holds that A did not, and the reverse.

use super::layout::{site_in, MAX_WIDTH};
use crate::analysis::diff::{Diff, SiteChange};
use crate::units::{format_bytes, format_delta};
use std::fmt::Write;

/// The totals, then the `top` sites grown and shrunk.
pub fn text(d: &Diff, top: usize) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "allocated: {} -> {} ({})",
        format_bytes(d.allocated_a),
        format_bytes(d.allocated_b),
        format_delta(d.allocated_b as i64 - d.allocated_a as i64)
    );
    section(
        &mut o,
        "grown in B (held in B, not in A):",
        &d.grown,
        "+",
        top,
    );
    section(&mut o, "shrunk in B:", &d.shrunk, "-", top);
    super::layout::fit(o)
}

fn section(o: &mut String, title: &str, list: &[SiteChange], sign: &str, top: usize) {
    let _ = writeln!(o, "\n{title}");
    if list.is_empty() {
        let _ = writeln!(o, "  (none)");
    }
    for c in list.iter().take(top) {
        let head = format!(
            "  {sign}{:>11}  {:>+6} blocks  ",
            format_bytes(c.bytes),
            c.count_b as i64 - c.count_a as i64,
        );
        let room = MAX_WIDTH - head.chars().count();
        let _ = writeln!(o, "{head}{}", site_in(&c.site, &c.function, room));
    }
}
