//! The text of `memlens state`: the allocator right after one event.

use super::layout::{push_wrapped, site_in, MAX_WIDTH};
use crate::analysis::state::EventState;
use crate::units::format_bytes;
use std::fmt::Write;

/// The terminal text.
pub fn text(s: &EventState) -> String {
    let mut o = String::new();
    let e = &s.event;
    let head = format!(
        "Event {} of {} (device {}): {} {} at ",
        s.event_index,
        s.trace_events,
        s.device,
        e.action,
        format_bytes(e.size)
    );
    let room = MAX_WIDTH.saturating_sub(head.chars().count());
    let _ = writeln!(o, "{head}{}", site_in(&e.site, &e.function, room));
    let _ = writeln!(
        o,
        "After it: allocated {}, active {}, reserved {} in {} segments, largest free block {}",
        format_bytes(s.allocated_bytes),
        format_bytes(s.active_bytes),
        format_bytes(s.reserved_bytes),
        s.segments,
        format_bytes(s.largest_free_block_bytes),
    );
    if !s.live.is_empty() {
        let _ = writeln!(o, "\nLive after it, by site:");
        super::peak::push_live_sites(&mut o, &s.live, s.other_sites);
    }
    if s.allocated_bytes == 0 {
        push_wrapped(&mut o, "", "", "Nothing was allocated after this event.");
    }
    super::layout::fit(o)
}
