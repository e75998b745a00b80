//! The events a replay reads: a whole trace, or the part received so far of
//! a trace still being read (the peak's replay beside the reader).

use super::is_segment_event;
use crate::snapshot::TraceEvent;

/// A replay's trace.
pub(super) enum Events<'s> {
    /// A trace read in full.
    Whole(&'s [TraceEvent]),
    /// Events `base..base + buf.len()` of a trace still arriving; those
    /// before `base` were replayed and dropped.
    Window {
        buf: Vec<TraceEvent>,
        base: usize,
        /// Index of the last event received that is not a segment event:
        /// events up to it can be replayed, since a segment event looks
        /// ahead to the allocation it serves.
        last_plain: Option<usize>,
        /// No more events will come.
        closed: bool,
    },
}

impl<'s> Events<'s> {
    /// Event `i`, if received and not dropped.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&TraceEvent> {
        match self {
            Events::Whole(e) => e.get(i),
            Events::Window { buf, base, .. } => buf.get(i.checked_sub(*base)?),
        }
    }

    /// Events from `i` on, as far as received.
    pub fn from(&self, i: usize) -> &[TraceEvent] {
        match self {
            Events::Whole(e) => e.get(i..).unwrap_or(&[]),
            Events::Window { buf, base, .. } => buf.get(i.saturating_sub(*base)..).unwrap_or(&[]),
        }
    }

    /// Events received so far (all of them for a whole trace).
    pub fn len(&self) -> usize {
        match self {
            Events::Whole(e) => e.len(),
            Events::Window { buf, base, .. } => base + buf.len(),
        }
    }

    /// Whether event `i` can be replayed now: it is there, and so is
    /// everything its replay looks ahead to.
    #[inline]
    pub fn ready(&self, i: usize) -> bool {
        match self {
            Events::Whole(e) => i < e.len(),
            Events::Window {
                buf,
                base,
                last_plain,
                closed,
            } => {
                if *closed {
                    i < base + buf.len()
                } else {
                    last_plain.is_some_and(|l| i <= l)
                }
            }
        }
    }

    /// Adds events that arrived (a window only). The replay has usually
    /// taken everything before them, so the batch becomes the window as it
    /// is, without a copy.
    pub fn push(&mut self, events: Vec<TraceEvent>) {
        if let Events::Window {
            buf,
            base,
            last_plain,
            ..
        } = self
        {
            let start = *base + buf.len();
            if let Some(k) = events.iter().rposition(|e| !is_segment_event(e.action)) {
                *last_plain = Some(start + k);
            }
            if buf.is_empty() {
                *buf = events;
            } else {
                buf.extend_from_slice(&events);
            }
        }
    }

    /// No more events will arrive (a window only).
    pub fn close(&mut self) {
        if let Events::Window { closed, .. } = self {
            *closed = true;
        }
    }

    /// Drops the events before `pos` (replayed; nothing looks back).
    pub fn drop_before(&mut self, pos: usize) {
        if let Events::Window { buf, base, .. } = self {
            let n = pos.saturating_sub(*base).min(buf.len());
            buf.drain(..n);
            *base += n;
        }
    }
}
