//! The report served by `memlens report --serve ADDR`: the same page, and
//! the exact state at any event of the shown trace and its exact totals over
//! any zoomed-in stretch, asked of memlens when the page needs them.
//!
//! A page written to a file carries what stays small whatever the trace (the
//! timeline's points, the largest allocations, a dozen segment maps: about
//! 2 MB for a 1 GB trace), so a click between the saved moments draws the
//! largest allocations and the nearest saved map, and a zoom shows the same
//! points closer. Served, a click (or an arrow key, one event on) asks memlens
//! for that event (`GET /api/state?event=N`) and the page draws every block
//! live then, with its stack, and the segment map then: the state `memlens
//! state --event N` prints, from the same replay under the recorded settings.
//! A zoom asks for the stretch shown (`GET /api/stretch?from=A&to=B`): the
//! allocated and reserved bytes after every event once the stretch holds at
//! most [`STRETCH_POINTS`], from the totals the trace's one replay kept. The
//! replay behind the states goes on forward from the last event asked for
//! (clicks from left to right cost the events between them) and starts again
//! for an earlier one.

use super::build::{
    from_diagnosis_in, segments_of_state, shown_snapshot, shown_trace, state_flame, SiteCategories,
};
use super::model::XUnit;
use super::model::{Flame, SegmentMap};
use super::segments::{cap_segments, DEFAULT_MAX_BLOCKS_PER_SEGMENT, DEFAULT_MAX_SEGMENTS};
use super::shapes::{stretch_allocations, StretchAllocations, SHAPES_MAX_EVENTS};
use super::timeline::{TimelineBuilder, TimelinePoint};
use crate::analysis::peak::AnalysedSet;
use crate::analysis::state::{event_state, EventState};
use crate::doctor::Diagnosis;
use crate::http::{Request, Response};
use crate::replay::during_read::PeakPass;
use crate::replay::{LiveBlock, Replay, ReplayOptions, ReplayState};
use crate::snapshot::Snapshot;
use crate::trace::Analysed;
use serde::Serialize;

/// Where the served page asks for the state at an event (`?event=N`).
pub const STATE_PATH: &str = "/api/state";

/// Where the served page asks for the exact totals over a stretch of events
/// (`?from=A&to=B`), when the timeline is zoomed in.
pub const STRETCH_PATH: &str = "/api/stretch";

/// Site groups listed in a served state (the flame graph holds every block).
const SERVED_TOP_SITES: usize = 15;

/// Points in a served stretch at most: about one per pixel of a wide chart,
/// twice over; a stretch of fewer events has every event.
pub const STRETCH_POINTS: usize = 4000;

/// The answer to [`STRETCH_PATH`]: the allocated and reserved bytes over a
/// stretch of events, every event when there are at most
/// [`STRETCH_POINTS`], else the lowest and highest of each run of events
/// (as the page's own timeline keeps them, over the whole trace).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServedStretch {
    /// The event of each point, in order.
    pub event: Vec<u64>,
    /// Allocated bytes after it.
    pub allocated: Vec<u64>,
    /// Reserved bytes after it.
    pub reserved: Vec<u64>,
    /// Events in the stretch.
    pub source_points: u64,
    /// Every allocation live in the stretch, when it is short enough to
    /// draw each ([`super::SHAPES_MAX_EVENTS`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<StretchAllocations>,
}

/// The answer to [`STATE_PATH`]: the state right after one event.
#[derive(Clone, Debug, Serialize)]
pub struct ServedState {
    /// What `memlens state --event N --json` prints for that event.
    pub state: EventState,
    /// Every block live then, by its stack (pruned as the page's flame graph).
    pub flame: Flame,
    /// The segments and their blocks then.
    pub segments: SegmentMap,
}

/// The page of a diagnosis and the states of its shown trace, on demand.
pub struct Explorer<'a, 's> {
    page: String,
    shown: Option<Shown<'a, 's>>,
}

/// The trace a served page draws.
struct Shown<'a, 's> {
    snap: &'s Snapshot,
    an: &'a Analysed<'s>,
    trace: usize,
    categories: SiteCategories,
    /// The replay the last state came from, kept to go on forward.
    replay: Option<Replay<'s>>,
}

impl<'a, 's> Explorer<'a, 's> {
    /// The page of `d` (the diagnosis of `snaps`, analysed in `set`), which
    /// asks for states at [`STATE_PATH`] when its trace can be replayed.
    pub fn new(
        set: &'a AnalysedSet<'s>,
        snaps: &[(String, &'s Snapshot)],
        d: &Diagnosis,
    ) -> Explorer<'a, 's> {
        let shown = shown_snapshot(snaps, d).and_then(|snap| {
            let an = set.get(snap)?;
            let trace = shown_trace(snap, d.peak.device)?;
            Some(Shown {
                snap,
                an,
                trace,
                categories: SiteCategories::of_peak(d),
                replay: None,
            })
        });
        let mut data = from_diagnosis_in(set, snaps, d);
        data.state_url = shown.as_ref().map(|_| STATE_PATH.to_string());
        data.stretch_url = shown.as_ref().map(|_| STRETCH_PATH.to_string());
        Explorer {
            page: super::render_html(&data.bounded()),
            shown,
        }
    }

    /// The page.
    pub fn page(&self) -> &str {
        &self.page
    }

    /// The state right after event `index` of the shown trace; `None` when
    /// the page shows no trace or the trace has no such event.
    pub fn state(&mut self, index: usize) -> Option<ServedState> {
        let shown = self.shown.as_mut()?;
        let events = &shown.snap.traces[shown.trace].events;
        if index >= events.len() {
            return None;
        }
        let st = shown.replayed_to(index);
        let state = event_state(shown.an, shown.trace, &st, SERVED_TOP_SITES)?;
        let categories = &shown.categories;
        let category_of = |site: &str| categories.of(site);
        let when = format!(
            "at event {} (replayed by memlens)",
            crate::units::group_digits(st.index as u64)
        );
        let segments = segments_of_state(
            shown.snap,
            events,
            &st,
            &when,
            &shown.an.sites,
            &category_of,
        );
        Some(ServedState {
            state,
            flame: super::bounded_flame(&state_flame(shown.snap, shown.an, shown.trace, &st, "")),
            segments: cap_segments(
                &segments,
                DEFAULT_MAX_SEGMENTS,
                DEFAULT_MAX_BLOCKS_PER_SEGMENT,
            ),
        })
    }

    /// The allocated and reserved bytes after each event from `from` to
    /// `to` (both included, clamped to the trace), from the totals the one
    /// replay under the recorded settings kept; `None` when the page shows
    /// no trace or `from` is past it.
    pub fn stretch(&mut self, from: usize, to: usize) -> Option<ServedStretch> {
        let shown = self.shown.as_mut()?;
        let n = shown.snap.traces[shown.trace].events.len();
        if from >= n {
            return None;
        }
        let to = to.clamp(from, n - 1);
        let pass = shown.an.recorded().of(shown.snap, shown.trace);
        let totals = pass.totals().enumerate().take(to + 1).skip(from);
        let count = to - from + 1;
        let mut out = ServedStretch {
            source_points: count as u64,
            ..ServedStretch::default()
        };
        if count <= STRETCH_POINTS {
            for (index, (allocated, reserved)) in totals {
                out.event.push(index as u64);
                out.allocated.push(allocated);
                out.reserved.push(reserved);
            }
        } else {
            (out.event, out.allocated, out.reserved) = lows_and_highs(totals, count);
        }
        out.allocations = (count <= SHAPES_MAX_EVENTS)
            .then(|| {
                let before = shown.live_before(from, &pass);
                stretch_allocations(shown.an, shown.trace, &pass, &before, (from, to))
            })
            .flatten();
        Some(out)
    }

    /// The answer to one request: the page at `/`, a state at
    /// [`STATE_PATH`], a stretch at [`STRETCH_PATH`], 404 elsewhere.
    pub fn answer(&mut self, req: &Request<'_>) -> Response {
        match req.path {
            "/" | "/index.html" => {
                Response::typed(200, "text/html; charset=utf-8", self.page.clone())
            }
            STATE_PATH => {
                let Some(index) = req.param("event").and_then(|v| v.parse::<usize>().ok()) else {
                    return Response::text(400, "give the event as ?event=N\n");
                };
                match self.state(index) {
                    Some(s) => json(&s),
                    None => Response::text(404, &format!("no event {index} in the shown trace\n")),
                }
            }
            STRETCH_PATH => {
                let arg = |k| req.param(k).and_then(|v| v.parse::<usize>().ok());
                let (Some(from), Some(to)) = (arg("from"), arg("to")) else {
                    return Response::text(400, "give the stretch as ?from=A&to=B\n");
                };
                match self.stretch(from, to) {
                    Some(s) => json(&s),
                    None => Response::text(404, &format!("no event {from} in the shown trace\n")),
                }
            }
            _ => Response::text(404, "not found; the report is at /\n"),
        }
    }
}

/// A 200 answer of `value` as JSON.
fn json(value: &impl Serialize) -> Response {
    // Plain structs of strings and numbers serialise.
    Response::typed(
        200,
        "application/json",
        serde_json::to_string(value).unwrap_or_default(),
    )
}

impl<'s> Shown<'_, 's> {
    /// The blocks live right before event `index` (before the first: those
    /// the trace's one replay began with).
    fn live_before(&mut self, index: usize, pass: &PeakPass) -> Vec<LiveBlock> {
        match index.checked_sub(1) {
            Some(prev) => self.replayed_to(prev).live,
            None => pass.watched.start_live.clone(),
        }
    }

    /// The state right after event `index`, from the kept replay when it
    /// has not passed it, else from a new one.
    fn replayed_to(&mut self, index: usize) -> ReplayState {
        let device = self.snap.traces[self.trace].device;
        let snap = self.snap;
        if self
            .replay
            .as_ref()
            .is_some_and(|r| r.position() > index + 1)
        {
            self.replay = None;
        }
        let r = self
            .replay
            .get_or_insert_with(|| Replay::new(snap, device, &ReplayOptions::default()));
        r.run_to(index);
        r.state_here()
    }
}

/// The lowest and highest allocated and the highest reserved of each run of
/// `count` totals, as the page's own timeline keeps them
/// ([`TimelineBuilder`]): the events, allocated and reserved bytes kept.
fn lows_and_highs(
    totals: impl Iterator<Item = (usize, (u64, u64))>,
    count: usize,
) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let mut b = TimelineBuilder::new(XUnit::Event, Vec::new(), count as u64, STRETCH_POINTS);
    for (index, (allocated, reserved)) in totals {
        b.push(TimelinePoint {
            x: index as i64,
            event: index as u64,
            allocated,
            reserved,
            ..TimelinePoint::default()
        });
    }
    let t = b.finish();
    (t.event, t.allocated, t.reserved)
}
