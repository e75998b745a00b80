//! What the one replay of a trace under its recorded settings keeps for every
//! analysis that needs the allocator's state over time, so that none replays
//! the trace again: each event's totals and the peaks, the blocks and
//! segments at the allocated peak, where `empty_cache()` was called, the
//! state right before each OOM, and the state at evenly spaced events (the
//! report's moments).
//!
//! The same [`Watch`] runs in the replay beside the reader
//! ([`super::during_read`]), which does not know how long the trace is nor
//! where its peak will be, and in a replay after the read (a trace that
//! began late). So what it keeps is chosen as the replay goes: the segments
//! at each new allocated peak are copied only when the next event cannot
//! raise it further (the top of a rise), and the spaced states at multiples
//! of a stride that doubles whenever too many are kept.

use super::observe::StateThen;
use super::{is_segment_event, LiveBlock, Peaks, PoolTotals, Replay, ReplayState, Totals};
use crate::sim::rounding::round_size;
use crate::sim::{AllocatorConfig, SegmentView};
use crate::snapshot::{Action, TraceEvent};

/// States before OOM events kept (the first ones; a trace with more is a
/// retry loop, and an OOM past these is replayed to when asked for).
pub const MAX_OOM_STATES: usize = 16;
/// Spaced states kept at most; half are dropped when more come.
const MAX_SPACED: usize = 24;
/// Blocks copied for the segments at the running peak, at most, before the
/// watch stops copying them (a trace whose peak rises in many small steps):
/// the state at the peak is then replayed to when asked for.
const PEAK_COPY_BUDGET: u64 = 16 << 20;

/// The state right before an OOM event.
#[derive(Clone, Debug)]
pub struct OomMoment {
    /// The event index of the OOM.
    pub index: usize,
    /// The state the OOM met.
    pub state: StateThen,
    /// The totals by pool then.
    pub totals: Totals,
}

/// The block sizes of `alloc` events read in the trace's order
/// ([`Watched::block_sizes`]).
pub struct BlockSizes<'w> {
    larger: &'w [(usize, u64)],
    /// The first larger block at or after the last index asked.
    next: usize,
    config: &'w AllocatorConfig,
}

impl BlockSizes<'_> {
    /// The block size the replay gave the `alloc` event `e` at `index`:
    /// the larger one it kept, else `e`'s size rounded. Indices are asked
    /// in increasing order; one that goes back is found by a search.
    pub fn at(&mut self, index: usize, e: &TraceEvent) -> u64 {
        if self.next > 0 && self.larger[self.next - 1].0 >= index {
            self.next = self.larger.partition_point(|&(i, _)| i < index);
        }
        while self.larger.get(self.next).is_some_and(|&(i, _)| i < index) {
            self.next += 1;
        }
        match self.larger.get(self.next) {
            Some(&(i, size)) if i == index => size,
            _ => round_size(self.config, e.size),
        }
    }
}

/// What a [`Watch`] kept over one replay.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    /// The totals before the first event.
    pub start: PoolTotals,
    /// Whether the replay began from an empty allocator (the trace began
    /// when the allocator did).
    pub from_empty: bool,
    /// The peaks and the events after which they were reached.
    pub peaks: Peaks,
    /// Allocated bytes after each event.
    pub allocated: Vec<u64>,
    /// Reserved bytes from each event at which they changed.
    pub reserved: Vec<(usize, u64)>,
    /// The `alloc` events whose block the model made larger than their
    /// rounded size (the rest of a block too small to split off), with that
    /// size, in order ([`Watched::block_sizes`]); rare, so kept apart
    /// rather than one size per `alloc`.
    pub larger_blocks: Vec<(usize, u64)>,
    /// The starts of the runs of segment frees that were `empty_cache()`
    /// calls, in order.
    pub empty_cache_at: Vec<usize>,
    /// The state right before each OOM event: the first
    /// [`MAX_OOM_STATES`] less one, and the latest.
    pub before_oom: Vec<OomMoment>,
    /// Whether the trace had more OOM events than were kept.
    pub more_ooms: bool,
    /// The segments and totals right after the allocated peak's event
    /// (`None` when the copies went over budget).
    pub at_peak: Option<(Vec<SegmentView>, Totals)>,
    /// The blocks live before the first event.
    pub start_live: Vec<LiveBlock>,
    /// The states after events at multiples of a stride, and after the last
    /// event, in order.
    pub spaced: Vec<ReplayState>,
}

/// Watches a replay event by event ([`Watch::replay_ready`]).
pub struct Watch {
    w: Watched,
    last_action: Option<Action>,
    /// A new allocated peak whose segments are not copied yet.
    peak_pending: bool,
    peak_copied: u64,
    stride: usize,
}

impl Watch {
    /// Ready to watch `r` from its first event.
    pub fn new(r: &Replay<'_>) -> Watch {
        let start = r.totals().all;
        let start_live = if r.initial_state().is_empty() {
            Vec::new()
        } else {
            r.live_blocks()
        };
        Watch {
            w: Watched {
                start,
                from_empty: r.initial_state().is_empty(),
                peaks: Peaks::new(start),
                start_live,
                ..Watched::default()
            },
            last_action: None,
            peak_pending: false,
            peak_copied: 0,
            stride: 1,
        }
    }

    /// Replays what `r` can replay now (a fed replay waits for what a segment
    /// event looks ahead to), watching each event.
    pub fn replay_ready(&mut self, r: &mut Replay<'_>) {
        while r.can_step() {
            let index = r.position();
            let Some(e) = r.event(index).copied() else {
                break;
            };
            self.before(r, index, &e);
            let Some((_, t)) = r.step_totals() else {
                break;
            };
            if e.action == Action::Alloc {
                let size = r.last_alloc_size();
                if size != round_size(r.allocator().config(), e.size) {
                    self.w.larger_blocks.push((index, size));
                }
            }
            self.after(r, index, &t);
            self.last_action = Some(e.action);
        }
    }

    /// Forgets what was kept (a fed replay that gave up).
    pub fn clear(&mut self) {
        self.w = Watched {
            from_empty: self.w.from_empty,
            ..Watched::default()
        };
        self.peak_pending = false;
    }

    /// What was kept, once the replay is done.
    pub fn finish(mut self, r: &Replay<'_>) -> Watched {
        if self.peak_pending {
            self.copy_peak(r);
        }
        let n = r.position();
        if n > 0 && self.w.spaced.last().is_none_or(|s| s.index + 1 != n) {
            self.w.spaced.push(state_of(r, n - 1));
        }
        self.w
    }

    fn before(&mut self, r: &Replay<'_>, index: usize, e: &TraceEvent) {
        // The top of a rise to a new peak: nothing after it until the next
        // event, which cannot raise it (an alloc always would).
        if self.peak_pending && !(e.action == Action::Alloc && e.size > 0) {
            self.copy_peak(r);
        }
        if matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
            && !self.last_action.is_some_and(is_segment_event)
            && r.run_is_empty_cache(index)
        {
            self.w.empty_cache_at.push(index);
        }
        if e.action == Action::Oom {
            let t = r.totals();
            let moment = OomMoment {
                index,
                state: StateThen {
                    allocated: t.all.allocated,
                    reserved: t.all.reserved,
                    peak_reserved: self.w.peaks.reserved.0.max(t.all.reserved),
                    segments: r.segments(),
                    live: r.live_blocks(),
                    warnings: r.warnings().to_vec(),
                    mismatches: r.mismatches(),
                },
                totals: t,
            };
            if self.w.before_oom.len() < MAX_OOM_STATES {
                self.w.before_oom.push(moment);
            } else if let Some(last) = self.w.before_oom.last_mut() {
                // The last slot follows the latest OOM: the one that ended
                // the run, which every command explains, comes after any
                // number of caught ones (a ResNet's cuDNN workspaces under a
                // cap: 82 before the program's own).
                *last = moment;
                self.w.more_ooms = true;
            }
        }
    }

    fn after(&mut self, r: &mut Replay<'_>, index: usize, t: &PoolTotals) {
        let w = &mut self.w;
        w.allocated.push(t.allocated);
        if w.reserved.last().map(|&(_, b)| b) != Some(t.reserved) {
            w.reserved.push((index, t.reserved));
        }
        if w.peaks.observe(index, t) {
            r.keep_live_here();
            self.peak_pending = self.peak_copied <= PEAK_COPY_BUDGET;
            if !self.peak_pending {
                w.at_peak = None;
            }
        }
        if index > 0 && index.is_multiple_of(self.stride) {
            w.spaced.push(state_of(r, index));
            if w.spaced.len() > MAX_SPACED {
                self.stride *= 2;
                let stride = self.stride;
                w.spaced.retain(|s| s.index.is_multiple_of(stride));
            }
        }
    }

    fn copy_peak(&mut self, r: &Replay<'_>) {
        self.peak_pending = false;
        let segments = r.segments();
        self.peak_copied += segments.iter().map(|s| s.blocks.len() as u64).sum::<u64>();
        self.w.at_peak = Some((segments, r.totals()));
    }
}

/// The whole state of `r` right after event `index` (its last replayed).
fn state_of(r: &Replay<'_>, index: usize) -> ReplayState {
    ReplayState {
        index,
        totals: r.totals(),
        live: r.live_blocks(),
        segments: r.segments(),
    }
}

impl Watched {
    /// Allocated and reserved bytes after each event, in order.
    pub fn totals(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut changes = self.reserved.iter().peekable();
        let mut reserved = 0;
        self.allocated.iter().enumerate().map(move |(i, &a)| {
            while let Some(&&(at, r)) = changes.peek() {
                if at > i {
                    break;
                }
                reserved = r;
                changes.next();
            }
            (a, reserved)
        })
    }

    /// The block sizes the replay gave the `alloc` events, under the
    /// settings `config` it was replayed with, for a walk that reads the
    /// trace forwards: a cursor over the larger blocks (a search an event
    /// was 7% of `doctor`'s time with the report on the 357 MB benchmark,
    /// whose walks ask for every `alloc`'s size).
    pub fn block_sizes<'w>(&'w self, config: &'w AllocatorConfig) -> BlockSizes<'w> {
        BlockSizes {
            larger: &self.larger_blocks,
            next: 0,
            config,
        }
    }

    /// The state right before OOM event `index`, if it was kept.
    pub fn before_oom(&self, index: usize) -> Option<&OomMoment> {
        self.before_oom.iter().find(|m| m.index == index)
    }

    /// The spaced state nearest to each of `targets` (sorted), without
    /// repeats: the report's moments between the peak and the OOM.
    pub fn spaced_near(&self, targets: &[usize]) -> Vec<&ReplayState> {
        let mut out: Vec<&ReplayState> = Vec::new();
        for &t in targets {
            let near = self
                .spaced
                .iter()
                .min_by_key(|s| (s.index.abs_diff(t), s.index));
            if let Some(s) = near {
                if out.last().is_none_or(|l| l.index < s.index) {
                    out.push(s);
                }
            }
        }
        out
    }
}
