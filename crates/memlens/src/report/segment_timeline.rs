//! The cached segments over the trace, one by one, for the page's "segments"
//! fill of the timeline: memory_viz's "Active Cached Segment Timeline".
//!
//! Each `cudaMalloc`'d segment (`segment_alloc` to `segment_free`) and each
//! range mapped into an expandable segment (`segment_map` to the
//! `segment_unmap` that takes it back; an unmap of part of a range closes it
//! and leaves the rest as a range from then on) is one piece, with the
//! segments there before the trace's first event (the state rebuilt from the
//! dump). The pieces live after an event add up to the reserved bytes there.
//! Segments are few beside allocations, so a page of any trace carries them
//! all, up to [`MAX_SEGMENT_PIECES`].

use crate::replay::initial::InitialState;
use crate::snapshot::{Action, TraceEvent};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Pieces kept at most; a trace that maps and unmaps more keeps the first.
pub const MAX_SEGMENT_PIECES: usize = 20_000;

/// Every segment piece of the shown trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SegmentTimeline {
    /// `[made_event, released_event, size, address, stream]`: `made_event`
    /// -1 for a piece there before the trace, `released_event` -1 for one
    /// still there at its end. Reserved from the made event on (after it),
    /// no longer after the released one.
    pub pieces: Vec<[i64; 5]>,
    /// Pieces left out past [`MAX_SEGMENT_PIECES`].
    pub omitted: u64,
}

/// The segment pieces of a trace of `events` that began in state `initial`.
pub(super) fn segment_timeline(initial: &InitialState, events: &[TraceEvent]) -> SegmentTimeline {
    let mut w = PieceWalk::default();
    for s in &initial.segments {
        w.open(-1, s.addr, s.size, i64::from(s.stream));
    }
    for (index, e) in events.iter().enumerate() {
        let at = index as i64;
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                w.open(at, e.addr, e.size, i64::from(e.stream))
            }
            Action::SegmentFree | Action::SegmentUnmap => w.release(at, e.addr, e.size),
            _ => {}
        }
    }
    w.out
}

/// The walk of [`segment_timeline`].
#[derive(Default)]
struct PieceWalk {
    out: SegmentTimeline,
    /// Pieces still reserved, by address: their index in `out.pieces`.
    open: BTreeMap<u64, usize>,
}

impl PieceWalk {
    fn open(&mut self, at: i64, addr: u64, size: u64, stream: i64) {
        if self.out.pieces.len() >= MAX_SEGMENT_PIECES {
            self.out.omitted += 1;
            return;
        }
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.open.insert(addr, self.out.pieces.len());
        self.out
            .pieces
            .push([at, -1, as_i64(size), as_i64(addr), stream]);
    }

    /// Closes the pieces over `[addr, addr + size)` at event `at`, leaving
    /// what an unmap of part of a piece did not take as a piece of its own.
    fn release(&mut self, at: i64, addr: u64, size: u64) {
        let end = addr.saturating_add(size.max(1));
        // The piece that starts at or before `addr`, then those starting inside.
        let first = self.open.range(..=addr).next_back().map(|(&a, _)| a);
        let inside: Vec<u64> = first
            .into_iter()
            .chain(self.open.range(addr..end).map(|(&a, _)| a))
            .collect();
        for a in inside {
            let Some(&i) = self.open.get(&a) else {
                continue;
            };
            let [_, _, psize, _, stream] = self.out.pieces[i];
            let pend = a.saturating_add(psize as u64);
            if pend <= addr || a >= end {
                continue;
            }
            self.open.remove(&a);
            self.out.pieces[i][1] = at;
            if a < addr {
                self.open(at, a, addr - a, stream);
            }
            if pend > end {
                self.open(at, end, pend - end, stream);
            }
        }
    }
}
