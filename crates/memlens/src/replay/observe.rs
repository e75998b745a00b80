//! One replay, many observers: the analyses that need the allocator's state
//! over time (the state at an event, where `empty_cache()` was called, the
//! report's timeline and moments) watch one replay of the trace instead of
//! each replaying it, the way ripgrep's searcher drives its `Sink`s.
//!
//! [`observe`] replays a device's trace once, as far as the observers need,
//! and shows each event to every observer, before it (the state after the
//! events before it) and after it (with what it changed).

use super::during_read::RecordedPasses;
use super::{
    is_segment_event, LiveBlock, ReleaseCause, ReleaseRun, Replay, ReplayOptions, ReplayState, Step,
};
use crate::sim::SegmentView;
use crate::snapshot::{Action, Snapshot, TraceEvent};

/// Something that watches a replay.
pub trait Observer {
    /// The last event it needs to see (`usize::MAX`: the whole trace).
    fn until(&self) -> usize {
        usize::MAX
    }
    /// Before event `index` is replayed: `r` holds the state after the
    /// events before it.
    fn before(&mut self, _r: &Replay<'_>, _index: usize) {}
    /// After the event of `step` was replayed.
    fn after(&mut self, _r: &Replay<'_>, _step: &Step) {}
}

/// Replays `device`'s trace in `snap` under `opts` once, as far as the
/// furthest observer needs, showing every event to every observer.
pub fn observe(
    snap: &Snapshot,
    device: u32,
    opts: &ReplayOptions,
    observers: &mut [&mut dyn Observer],
) {
    observe_replay(Replay::new(snap, device, opts), observers);
}

/// [`observe`] on a replay already prepared (from a state before the trace
/// the caller rebuilt: [`Replay::from_initial`]).
pub fn observe_replay(mut r: Replay<'_>, observers: &mut [&mut dyn Observer]) {
    let until = observers.iter().map(|o| o.until()).max().unwrap_or(0);
    let n = r.events().len();
    if n == 0 {
        return;
    }
    while r.position() <= until.min(n - 1) {
        let index = r.position();
        for o in observers.iter_mut() {
            o.before(&r, index);
        }
        let Some(step) = r.step() else { break };
        for o in observers.iter_mut() {
            o.after(&r, &step);
        }
    }
}

/// The state right before event `index` (after the events before it), and
/// the highest reserved bytes up to there: what an OOM at `index` met.
#[derive(Debug)]
pub struct StateBefore {
    index: usize,
    peak_reserved: u64,
    state: Option<StateThen>,
}

/// The allocator's state at one moment of a replay.
#[derive(Clone, Debug)]
pub struct StateThen {
    /// Allocated bytes (all pools).
    pub allocated: u64,
    /// Reserved bytes (all pools).
    pub reserved: u64,
    /// The highest reserved bytes up to the moment.
    pub peak_reserved: u64,
    /// Segments with their blocks.
    pub segments: Vec<SegmentView>,
    /// Live blocks by address.
    pub live: Vec<LiveBlock>,
    /// The replay's warnings so far.
    pub warnings: Vec<String>,
    /// Events the model placed differently from the trace so far.
    pub mismatches: u64,
}

impl StateBefore {
    /// Watches for the state right before event `index`.
    pub fn new(index: usize) -> StateBefore {
        StateBefore {
            index,
            peak_reserved: 0,
            state: None,
        }
    }

    /// The state seen (`None` when the trace ended before `index`: then the
    /// state at its end, as a replay to `index` would leave it).
    pub fn into_state(self) -> Option<StateThen> {
        self.state
    }

    fn keep(&mut self, r: &Replay<'_>) {
        let t = r.totals().all;
        self.state = Some(StateThen {
            allocated: t.allocated,
            reserved: t.reserved,
            peak_reserved: self.peak_reserved.max(t.reserved),
            segments: r.segments(),
            live: r.live_blocks(),
            warnings: r.warnings().to_vec(),
            mismatches: r.mismatches(),
        });
    }
}

impl Observer for StateBefore {
    fn until(&self) -> usize {
        self.index
    }
    fn before(&mut self, r: &Replay<'_>, index: usize) {
        if index == 0 {
            self.peak_reserved = r.totals().all.reserved;
        }
        if index == self.index {
            self.keep(r);
        }
    }
    fn after(&mut self, r: &Replay<'_>, step: &Step) {
        self.peak_reserved = self.peak_reserved.max(step.totals.all.reserved);
        // A trace that ends before `index`: its end is the state.
        if step.index + 1 == r.events().len() && step.index < self.index {
            self.keep(r);
        }
    }
}

/// The whole state right after event `index` ([`super::state_at`]).
#[derive(Debug)]
pub struct StateAfter {
    index: usize,
    state: Option<ReplayState>,
}

impl StateAfter {
    /// Watches for the state right after event `index` (the last event's,
    /// when the trace is shorter).
    pub fn new(index: usize) -> StateAfter {
        StateAfter { index, state: None }
    }

    /// The state seen.
    pub fn into_state(self) -> Option<ReplayState> {
        self.state
    }
}

impl Observer for StateAfter {
    fn until(&self) -> usize {
        self.index
    }
    fn after(&mut self, r: &Replay<'_>, step: &Step) {
        if step.index == self.index
            || (step.index + 1 == r.events().len() && step.index < self.index)
        {
            self.state = Some(ReplayState {
                index: step.index,
                totals: r.totals(),
                live: r.live_blocks(),
                segments: r.segments(),
            });
        }
    }
}

/// Every run of segment frees, with its cause ([`super::release_runs`]).
#[derive(Debug)]
pub struct ReleaseRuns<'e> {
    events: &'e [TraceEvent],
    last_free: Option<usize>,
    runs: Vec<ReleaseRun>,
}

impl<'e> ReleaseRuns<'e> {
    /// Watches the runs of segment frees of `events` (the trace replayed).
    pub fn new(events: &'e [TraceEvent]) -> ReleaseRuns<'e> {
        ReleaseRuns {
            events,
            last_free: events
                .iter()
                .rposition(|e| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)),
            runs: Vec::new(),
        }
    }

    /// Whether the trace has any segment free to classify (else no replay
    /// is needed for it).
    pub fn any(&self) -> bool {
        self.last_free.is_some()
    }

    /// The runs found, in order.
    pub fn into_runs(self) -> Vec<ReleaseRun> {
        self.runs
    }
}

impl Observer for ReleaseRuns<'_> {
    fn until(&self) -> usize {
        // Past the last segment free there is nothing left to classify.
        self.last_free.unwrap_or(0)
    }
    fn before(&mut self, r: &Replay<'_>, i: usize) {
        if self.last_free.is_none_or(|last| i > last) {
            return;
        }
        let events = self.events;
        let Some(e) = events.get(i) else { return };
        let starts = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
            && (i == 0 || !is_segment_event(events[i - 1].action));
        if !starts {
            return;
        }
        let end = events[i..]
            .iter()
            .position(|x| !is_segment_event(x.action))
            .map_or(events.len(), |k| i + k);
        let cause = if r.run_is_empty_cache(i) {
            ReleaseCause::EmptyCache
        } else {
            ReleaseCause::MakeRoom
        };
        self.runs.push(ReleaseRun {
            start: i,
            end,
            cause,
        });
    }
}

/// What one replay of a run under its recorded settings tells the OOM
/// explainer and the what-if simulations: where the program called
/// `empty_cache()`, and the state an OOM met.
#[derive(Clone, Debug, Default)]
pub struct RecordedRun {
    /// The device replayed.
    pub device: u32,
    /// The events at which the program called `empty_cache()` (the starts of
    /// [`ReleaseCause::EmptyCache`] runs), in order.
    pub empty_cache_at: Vec<usize>,
    /// The OOM event watched for, and the state right before it.
    pub before_oom: Option<(usize, StateThen)>,
    /// The state before the trace the replay began from, when it was kept.
    pub initial: Option<std::sync::Arc<super::initial::InitialState>>,
}

/// [`recorded_run`] taken from the one replay of `device`'s trace that
/// `passes` holds (made beside the reader, or once after the read), with no
/// replay of its own unless the OOM at `oom` is past the states that replay
/// kept ([`super::watch::MAX_OOM_STATES`]).
pub fn recorded_run_in(
    passes: &RecordedPasses,
    snap: &Snapshot,
    device: u32,
    oom: Option<usize>,
) -> RecordedRun {
    let Some(pass) = passes.of_device(snap, device) else {
        return RecordedRun {
            device,
            ..RecordedRun::default()
        };
    };
    let before_oom = match oom {
        Some(i) => match pass.before_oom(snap, i) {
            Some(st) => Some((i, st)),
            None => return recorded_run(snap, device, oom),
        },
        None => None,
    };
    RecordedRun {
        device,
        empty_cache_at: pass.watched.empty_cache_at.clone(),
        before_oom,
        initial: Some(std::sync::Arc::clone(pass.initial())),
    }
}

/// Replays `device`'s trace once under its recorded settings, noting where
/// `empty_cache()` was called and, given `oom`, the state right before that
/// event.
pub fn recorded_run(snap: &Snapshot, device: u32, oom: Option<usize>) -> RecordedRun {
    let mut releases = ReleaseRuns::new(snap.device_trace(device));
    let mut at = oom.map(StateBefore::new);
    let needed = oom.is_some() || releases.any();
    {
        let mut observers: Vec<&mut dyn Observer> = vec![&mut releases];
        if let Some(a) = at.as_mut() {
            observers.push(a);
        }
        if needed {
            observe(snap, device, &ReplayOptions::default(), &mut observers);
        }
    }
    RecordedRun {
        device,
        empty_cache_at: releases
            .into_runs()
            .into_iter()
            .filter(|r| r.cause == ReleaseCause::EmptyCache)
            .map(|r| r.start)
            .collect(),
        before_oom: oom.zip(at.and_then(StateBefore::into_state)),
        initial: None,
    }
}
