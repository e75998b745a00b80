//! The text of `memlens summary`: the allocator state at dump time.

use super::layout::{clip_end, push_list, push_wrapped, MAX_WIDTH};
use crate::analysis::summary::Summary;
use crate::units::format_bytes;
use std::fmt::Write;

/// The terminal table.
pub fn text(s: &Summary, name: &str) -> String {
    let mut o = String::new();
    let pct = |a: u64| {
        if s.reserved_bytes == 0 {
            0.0
        } else {
            100.0 * a as f64 / s.reserved_bytes as f64
        }
    };
    let _ = writeln!(o, "{name}");
    let _ = writeln!(
        o,
        "  devices {:?}, {} segments{}, {} blocks ({} allocated, {} free, {} pending free)",
        s.devices,
        s.segments,
        if s.expandable_ranges > 0 {
            format!(" + {} expandable ranges", s.expandable_ranges)
        } else {
            String::new()
        },
        s.blocks,
        s.allocated_blocks,
        s.inactive_blocks,
        s.pending_free_blocks
    );
    let _ = writeln!(o);
    let rows = [
        ("reserved", s.reserved_bytes),
        ("allocated", s.allocated_bytes),
        ("active", s.active_bytes),
        ("requested", s.requested_bytes),
        ("free in segments", s.external_fragmentation_bytes),
        ("non-releasable (inactive split)", s.inactive_split_bytes),
        ("rounding waste", s.internal_fragmentation_bytes),
        ("largest free block", s.largest_free_block_bytes),
    ];
    for (label, v) in rows {
        let _ = writeln!(o, "  {label:<32} {:>12}  {:>5.1}%", format_bytes(v), pct(v));
    }
    if !s.pools.is_empty() {
        let _ = writeln!(
            o,
            "\n  free memory by pool (the biggest request each can serve now):"
        );
        for p in s.pools.iter().take(8) {
            let pool = format!("{:?}", p.pool).to_lowercase();
            let _ = writeln!(
                o,
                "    device {} {pool:<5} stream {:<14} reserved {:>11}  free {:>11} in {:>4} blocks  largest {:>11}",
                p.device,
                p.stream,
                format_bytes(p.reserved_bytes),
                format_bytes(p.free_bytes),
                p.free_blocks,
                format_bytes(p.largest_free_block_bytes)
            );
        }
        if s.pools.len() > 8 {
            let _ = writeln!(o, "    … {} more pools (see --json)", s.pools.len() - 8);
        }
    }
    let _ = writeln!(o);
    let actions: Vec<String> = s
        .trace_events_by_action
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut items = vec![format!("{} events", s.trace_events)];
    if let Some(first) = actions.first() {
        // `N events (alloc 3, free 2, ...)`, wrapped between actions.
        items[0] = format!("{} events ({first}", s.trace_events);
        items.extend(actions.iter().skip(1).cloned());
        if let Some(last) = items.last_mut() {
            last.push(')');
        }
    }
    push_list(&mut o, "  trace: ", "    ", &items);
    let st = &s.allocator_settings;
    if st.present {
        let conf = if st.alloc_conf.is_empty() {
            "(default)"
        } else {
            st.alloc_conf.as_str()
        };
        let line = format!(
            "  allocator: PYTORCH_CUDA_ALLOC_CONF={conf}; expandable_segments {}, max_split_size {}",
            st.expandable_segments,
            st.max_split_size.map_or("unlimited".to_string(), format_bytes)
        );
        let _ = writeln!(o, "{}", clip_end(&line, MAX_WIDTH));
    }
    for w in &s.warnings {
        push_wrapped(&mut o, "  warning: ", "    ", w);
    }
    for c in &s.capture_checks {
        push_wrapped(
            &mut o,
            "  capture: ",
            "    ",
            &format!("{}; fix: {}", c.problem, c.fix),
        );
    }
    super::layout::fit(o)
}
