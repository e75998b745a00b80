//! The text of `memlens peak`: the peak and what was live at it.

use super::layout::{clip_end, push_category_mix, push_wrapped, site_in, MAX_WIDTH};
use crate::analysis::peak::PeakReport;
use crate::units::format_bytes;
use std::fmt::Write;

/// One row of the sites table: a line, whatever the categories of what it
/// made (one `model(x)` makes activations and temporaries).
struct LineRow<'a> {
    site: &'a str,
    function: &'a str,
    bytes: u64,
    count: u64,
    /// Bytes by category, largest first.
    parts: Vec<(crate::trace::categories::Category, u64)>,
}

/// The live sites merged by line (issue 31: the same `file:line` showed as
/// one row for each category), largest first.
fn line_rows(sites: &[crate::analysis::peak::LiveSite]) -> Vec<LineRow<'_>> {
    let mut rows: Vec<LineRow<'_>> = Vec::new();
    for s in sites {
        let same = rows
            .iter_mut()
            .find(|r| r.site == s.site && r.function == s.function);
        match same {
            Some(r) => {
                r.bytes += s.bytes;
                r.count += s.count;
                match r.parts.iter_mut().find(|(c, _)| *c == s.category) {
                    Some(p) => p.1 += s.bytes,
                    None => r.parts.push((s.category, s.bytes)),
                }
            }
            None => rows.push(LineRow {
                site: &s.site,
                function: &s.function,
                bytes: s.bytes,
                count: s.count,
                parts: vec![(s.category, s.bytes)],
            }),
        }
    }
    for r in &mut rows {
        // The row's category is its largest one.
        r.parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    rows
}

/// The terminal text.
pub fn text(r: &PeakReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Peak allocated {} (event {}), peak reserved {} (event {}), device {}",
        format_bytes(r.peak_allocated_bytes),
        r.peak_event_index.map_or("-".into(), |i| i.to_string()),
        format_bytes(r.peak_reserved_bytes),
        r.peak_reserved_event_index
            .map_or("-".into(), |i| i.to_string()),
        r.device
    );
    if !r.category_detail.is_empty() {
        let _ = writeln!(o, "\nAt the allocated peak, by category:");
        let mut cats = r.category_detail.clone();
        cats.sort_by_key(|c| std::cmp::Reverse(c.bytes));
        for c in &cats {
            let share = 100.0 * c.bytes as f64 / r.peak_allocated_bytes.max(1) as f64;
            let head = format!(
                "  {:<16} {:>11} {:>5.1}%  {:>6} blocks   ",
                c.category_name(),
                format_bytes(c.bytes),
                share,
                c.count,
            );
            let room = MAX_WIDTH.saturating_sub(head.chars().count() + 2);
            let _ = writeln!(o, "{head}({})", clip_end(c.rule, room));
        }
    }
    if !r.live_at_peak.is_empty() {
        let _ = writeln!(o, "\nLive at the peak, by site:");
        push_live_sites(&mut o, &r.live_at_peak, r.other_sites);
    }
    if r.steps.len() > 1 {
        let _ = writeln!(o, "\nSteps ({:?}): peak / left behind", r.step_method);
        for s in r.steps.iter().take(12) {
            let _ = writeln!(
                o,
                "  step {:>3}: {:>11} / {:>11}",
                s.step,
                format_bytes(s.peak_allocated_bytes),
                format_bytes(s.retained_bytes)
            );
        }
        if r.steps.len() > 12 {
            let _ = writeln!(o, "  … {} more steps", r.steps.len() - 12);
        }
    }
    for w in &r.warnings {
        push_wrapped(&mut o, "warning: ", "  ", w);
    }
    super::layout::fit(o)
}

/// The table of live memory by line (sites merged per `file:line`, each with
/// its category mix), and how many groups were left out: the peak's and the
/// state at an event's.
pub(crate) fn push_live_sites(
    o: &mut String,
    sites: &[crate::analysis::peak::LiveSite],
    other_sites: usize,
) {
    for s in line_rows(sites) {
        let head = format!(
            "  {:>11} {:>6} blocks  {:<16} ",
            format_bytes(s.bytes),
            s.count,
            s.parts[0].0.as_str(),
        );
        let room = MAX_WIDTH.saturating_sub(head.chars().count());
        let _ = writeln!(o, "{head}{}", site_in(s.site, s.function, room));
        if s.parts.len() > 1 {
            push_category_mix(
                o,
                head.chars().count(),
                s.parts.iter().map(|(c, b)| (c.as_str(), *b)),
            );
        }
    }
    if other_sites > 0 {
        let _ = writeln!(o, "  … {other_sites} more (use --top or --json)");
    }
}
