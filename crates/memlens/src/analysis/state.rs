//! `memlens state`: the allocator's whole state right after one event of the
//! trace, as the replay rebuilds it. The evidence behind every other answer:
//! a peak, a leak or an OOM names an event index, and this shows what was
//! live and reserved there, by site, to the byte.

use super::peak::{group_live, LiveSite};
use super::sites::stack_lines;
use crate::replay::{state_at, ReplayOptions};
use crate::sim::BlockStatus;
use crate::snapshot::Snapshot;
use crate::trace::Analysed;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;

/// The event the state follows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventView {
    /// What happened (`alloc`, `free_requested`, `free_completed`,
    /// `segment_alloc`, `segment_free`, `oom`, ...).
    pub action: &'static str,
    /// Block or segment address (for an `oom`, the free device bytes).
    pub addr: u64,
    /// Bytes, as the trace recorded them (an `alloc`'s unrounded request).
    pub size: u64,
    /// The stream index.
    pub stream: u16,
    /// Epoch microseconds (0 when not recorded).
    pub time_us: i64,
    /// `file:line` of the innermost user frame, or a pseudo-site.
    pub site: String,
    /// The function of that line.
    pub function: String,
    /// The recorded stack, innermost first.
    pub stack: Vec<String>,
}

/// `memlens state --json`: the allocator right after one event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventState {
    /// The device whose trace was replayed.
    pub device: u32,
    /// The event index (clamped to the trace's last event).
    pub event_index: usize,
    /// Events in the trace.
    pub trace_events: usize,
    /// The event itself.
    pub event: EventView,
    /// Allocated bytes after the event (rounded sizes, `allocated_bytes.current`).
    pub allocated_bytes: u64,
    /// Allocated plus pending-free bytes (`active_bytes.current`).
    pub active_bytes: u64,
    /// Requested (unrounded) bytes of active blocks (`requested_bytes.current`).
    pub requested_bytes: u64,
    /// Reserved bytes (`reserved_bytes.current`).
    pub reserved_bytes: u64,
    /// Segments (mapped ranges of expandable segments count one each).
    pub segments: usize,
    /// The largest free block in any segment.
    pub largest_free_block_bytes: u64,
    /// What was live, by allocation site and category, largest first.
    pub live: Vec<LiveSite>,
    /// Site groups not listed in `live` (beyond `--top`).
    pub other_sites: usize,
    /// Live bytes by category.
    pub categories: BTreeMap<String, u64>,
}

/// The state of `device`'s trace (the first with events when `None`) right
/// after event `index`, with the `top` largest site groups. An index past
/// the trace is an error naming the trace's length.
pub fn state_at_event(
    an: &Analysed,
    device: Option<u32>,
    index: usize,
    top: usize,
) -> Result<EventState> {
    let snap = an.snap;
    let device = pick_device(snap, device)?;
    let trace = snap
        .traces
        .iter()
        .position(|t| t.device == device && !t.events.is_empty())
        .ok_or_else(|| Error::usage(format!("device {device} has no trace")))?;
    let events = &snap.traces[trace].events;
    let past = || {
        Error::usage(format!(
            "event {index} is past the trace of device {device}, which has {} events (0 to {})",
            events.len(),
            events.len().saturating_sub(1)
        ))
    };
    if index >= events.len() {
        return Err(past());
    }
    let state = state_at(snap, device, index, &ReplayOptions::default());
    event_state(an, trace, &state, top).ok_or_else(past)
}

/// The [`EventState`] of `state`, a replayed state of trace `trace` of
/// `an`'s snapshot (right after event `state.index`), with the `top`
/// largest site groups; `None` when the trace has no such event.
pub fn event_state(
    an: &Analysed,
    trace: usize,
    state: &crate::replay::ReplayState,
    top: usize,
) -> Option<EventState> {
    let snap = an.snap;
    let device = snap.traces[trace].device;
    let events = &snap.traces[trace].events;
    let index = state.index;
    let ev = events.get(index)?;
    let alloc_index = (ev.action == crate::snapshot::Action::Alloc)
        .then(|| u32::try_from(index).ok())
        .flatten();
    let site = an.block_site(trace, alloc_index, ev.stack);
    let groups = an
        .classifier(trace)
        .map(|c| group_live(an, &c, &state.live, top))
        .unwrap_or_default();
    let largest_free_block_bytes = state
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.status == BlockStatus::Free)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    let all = state.totals.all;
    Some(EventState {
        device,
        event_index: state.index,
        trace_events: events.len(),
        event: EventView {
            action: ev.action.as_str(),
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            time_us: ev.time_us,
            site: site.site,
            function: site.function,
            stack: stack_lines(snap, ev.stack),
        },
        allocated_bytes: all.allocated,
        active_bytes: all.active,
        requested_bytes: all.requested,
        reserved_bytes: all.reserved,
        segments: state.segments.len(),
        largest_free_block_bytes,
        categories: groups.category_bytes(),
        live: groups.sites,
        other_sites: groups.other_sites,
    })
}

/// The device a what-if run works on: the one asked for, else the first with a trace.
pub fn pick_device(snap: &Snapshot, asked: Option<u32>) -> Result<u32> {
    let with_trace: Vec<u32> = snap
        .traces
        .iter()
        .filter(|t| !t.events.is_empty())
        .map(|t| t.device)
        .collect();
    match asked {
        Some(d) if with_trace.contains(&d) => Ok(d),
        Some(d) => Err(Error::usage(format!(
            "device {d} has no trace (devices with one: {with_trace:?})"
        ))),
        None => with_trace.first().copied().ok_or_else(|| {
            Error::usage(
                "the snapshot has no trace: record it with \
                 torch.cuda.memory._record_memory_history(enabled=\"all\")",
            )
        }),
    }
}
