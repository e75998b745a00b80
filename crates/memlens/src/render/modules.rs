//! The text of `memlens peak --by module`: the module tree at the peak.

use super::layout::{clip_end, push_wrapped, MAX_WIDTH};
use crate::analysis::modules::{ModuleGroup, ModuleReport, Naming};
use crate::units::format_bytes;
use std::fmt::Write;

/// Groups smaller than this share of the peak are folded into "… N more".
const MIN_SHARE: f64 = 0.005;

/// The terminal text, `depth` levels deep.
pub fn text(r: &ModuleReport, depth: usize) -> String {
    let mut o = String::new();
    let how = match r.naming {
        Naming::Instances => "module instances (memlens.record(model=...))",
        Naming::Frames => "the forward frames on each stack (classes where the source is readable)",
    };
    let _ = writeln!(
        o,
        "Peak allocated {} (event {}), device {}, by module: {how}",
        format_bytes(r.peak_allocated_bytes),
        r.peak_event_index.map_or("-".into(), |i| i.to_string()),
        r.device
    );
    let _ = writeln!(o);
    let min = (r.peak_allocated_bytes as f64 * MIN_SHARE) as u64;
    tree(&mut o, &r.groups, r.peak_allocated_bytes, depth, 0, min);
    for w in &r.warnings {
        push_wrapped(&mut o, "warning: ", "  ", w);
    }
    super::layout::fit(o)
}

fn tree(o: &mut String, groups: &[ModuleGroup], peak: u64, depth: usize, level: usize, min: u64) {
    let mut hidden = (0usize, 0u64);
    for g in groups {
        if g.bytes < min && level > 0 {
            hidden.0 += 1;
            hidden.1 += g.bytes;
            continue;
        }
        let share = 100.0 * g.bytes as f64 / peak.max(1) as f64;
        let top = g
            .categories
            .iter()
            .max_by_key(|(_, b)| **b)
            .map_or("", |(c, _)| c.as_str());
        let mut name = "  ".repeat(level) + &g.name;
        if let Some(c) = &g.class {
            if *c != g.name {
                name += &format!(" ({c})");
            }
        }
        let head = format!(
            "  {:>11} {:>5.1}% {:>6} blocks  {:<16} ",
            format_bytes(g.bytes),
            share,
            g.count,
            top
        );
        let room = MAX_WIDTH.saturating_sub(head.chars().count());
        let _ = writeln!(o, "{head}{}", clip_end(&name, room));
        // (The rows under "outside any module's forward" are its categories
        // already.)
        let opened = level + 1 < depth
            && !g.children.is_empty()
            && !g.children.iter().all(|c| c.name.starts_with('('));
        if opened && g.categories.len() > 1 {
            // A parent holds its children's mix: say it, not only the largest.
            super::layout::push_category_mix(
                o,
                head.chars().count() + 2 * level,
                g.categories.iter().map(|(c, b)| (c.as_str(), *b)),
            );
        }
        if level + 1 < depth {
            tree(o, &g.children, peak, depth, level + 1, min);
        }
    }
    if hidden.0 > 0 {
        let _ = writeln!(
            o,
            "  {:>11}        {}… {} smaller",
            format_bytes(hidden.1),
            "  ".repeat(level),
            hidden.0
        );
    }
}
