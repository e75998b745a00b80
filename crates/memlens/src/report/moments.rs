//! Any moment of the trace, inspectable in the page: the largest allocations
//! with their lifetimes and stacks (the page sums those live at a clicked
//! event into a flame graph; the rest is one aggregated node whose bytes are
//! the timeline's allocated figure minus the kept ones), and exact segment
//! maps at a bounded number of events (the peak, the OOM and evenly spaced
//! ones), of which the page shows the nearest to the click.
//!
//! The size is bounded whatever the trace: at most [`MAX_KEPT_ALLOCS`]
//! allocations, [`MAX_STACK_FRAMES`] frames per stack and
//! [`MOMENT_SEGMENT_MAPS`] segment maps, each capped by
//! [`super::cap_segments`].

use super::build::segments_of_state;
use super::convert::python_stack_labels;
use super::model::{Category, SegmentMap};
use super::segments::{cap_segments, DEFAULT_MAX_BLOCKS_PER_SEGMENT};
use crate::analysis::sites::SiteIndex;
use crate::replay::during_read::PeakPass;
use crate::replay::ReplayState;
use crate::snapshot::{Action, Snapshot, StackId, TraceEvent};
use crate::trace::Analysed;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// Allocations kept individually (the largest); the rest are aggregated.
pub const MAX_KEPT_ALLOCS: usize = 20_000;
/// Frames kept per stack (innermost first).
pub const MAX_STACK_FRAMES: usize = 32;
/// Segment maps saved at chosen events (the peak and OOM included).
pub const MOMENT_SEGMENT_MAPS: usize = 12;
/// Segments per saved map (the largest; the rest summed).
pub const MOMENT_MAX_SEGMENTS: usize = 96;

/// The data behind "click the timeline to see that moment".
///
/// `allocs[i]` is `[alloc_event, free_event, size, address, stack, site,
/// category]`: `alloc_event` is -1 for a block live before the trace starts,
/// `free_event` -1 for one never freed (in the trace), `stack` an index into
/// `stacks` (-1 when the allocation has none), `site` into `sites`, `category`
/// a [`Category`] code. A block counts as allocated at event `e` when
/// `alloc_event <= e < free_event`, as the timeline counts it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Moments {
    /// Frame labels (`file:line in function`).
    pub frames: Vec<String>,
    /// Stacks as indices into `frames`, innermost first (cut to
    /// [`MAX_STACK_FRAMES`]).
    pub stacks: Vec<Vec<u32>>,
    /// Site labels (`file:line`, or a pseudo-site such as `<backward pass>`).
    pub sites: Vec<String>,
    /// The allocations kept, largest first.
    pub allocs: Vec<[i64; 7]>,
    /// Allocations in the trace (plus those live at its start), kept or not.
    pub total_allocs: u64,
    /// The smallest size kept (0 when every allocation was kept).
    pub min_kept_bytes: u64,
    /// Segment maps at `segment_events` (same order).
    pub segment_maps: Vec<SegmentMap>,
    /// The event of each saved segment map.
    pub segment_events: Vec<u64>,
    /// Indices into `frames` of library frames, folded by the page as in
    /// [`super::Flame::library`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub library: Vec<u32>,
}

/// What [`moments_of_pass`] needs besides the snapshot.
pub(super) struct MomentInput<'a> {
    /// The snapshot analysed once.
    pub an: &'a Analysed<'a>,
    /// Index of the device's trace in `snap.traces`.
    pub trace: usize,
    /// Its events.
    pub events: &'a [TraceEvent],
    /// The states whose segment map must be saved (the peak, the OOM).
    pub must: Vec<&'a ReplayState>,
    /// The category of a site.
    pub category_of: &'a (dyn Fn(&str) -> Category + Sync),
    /// Sites of stacks (for the segment maps).
    pub index: &'a SiteIndex,
}

/// A kept allocation's lifetime.
struct Interval {
    alloc: i64,
    free: i64,
    size: u64,
    addr: u64,
    stack: StackId,
    alloc_index: Option<u32>,
}

/// The moments of the trace the one replay `pass` went through: the largest
/// allocations' lifetimes, walked from the events and the block sizes the
/// replay kept, and the segment maps at the states it kept (the peak, the
/// OOM, and those nearest to evenly spaced events).
pub(super) fn moments_of_pass(snap: &Snapshot, inp: &MomentInput<'_>, pass: &PeakPass) -> Moments {
    let mut w = MomentsWalk::new(snap, inp);
    w.walk(pass);
    let n = inp.events.len();
    let mut states: Vec<&ReplayState> = inp.must.iter().copied().filter(|s| s.index < n).collect();
    let spaced = MOMENT_SEGMENT_MAPS.saturating_sub(states.len()).max(1);
    let targets: Vec<usize> = (1..=spaced)
        .map(|k| (n.saturating_sub(1) * k) / spaced)
        .collect();
    states.extend(pass.watched.spaced_near(&targets));
    states.sort_by_key(|s| s.index);
    states.dedup_by_key(|s| s.index);
    for st in states {
        w.save_map(st);
    }
    w.finish()
}

/// Walks the trace for [`moments_of_pass`].
struct MomentsWalk<'a> {
    snap: &'a Snapshot,
    inp: &'a MomentInput<'a>,
    threshold: u64,
    kept: Vec<Interval>,
    open: HashMap<u64, usize>,
    total: u64,
    maps: Vec<(u64, SegmentMap)>,
}

impl<'a> MomentsWalk<'a> {
    fn new(snap: &'a Snapshot, inp: &'a MomentInput<'a>) -> MomentsWalk<'a> {
        // The size threshold: the MAX_KEPT_ALLOCS-th largest allocation.
        let mut sizes: Vec<u64> = inp
            .events
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.size)
            .collect();
        let threshold = if sizes.len() > MAX_KEPT_ALLOCS {
            let (_, t, _) = sizes.select_nth_unstable_by(MAX_KEPT_ALLOCS - 1, |a, b| b.cmp(a));
            *t
        } else {
            0
        };
        MomentsWalk {
            snap,
            inp,
            threshold,
            kept: Vec::new(),
            open: HashMap::default(),
            total: 0,
            maps: Vec::new(),
        }
    }

    /// Keeps an allocation when it is among the largest.
    fn consider(&mut self, i: Interval, min: u64) {
        self.total += 1;
        if i.size >= min && self.kept.len() < MAX_KEPT_ALLOCS {
            self.open.insert(i.addr, self.kept.len());
            self.kept.push(i);
        }
    }

    /// The blocks live before the trace, then every allocation with its
    /// block size as the replay gave it, closed by the first free of its
    /// address.
    fn walk(&mut self, pass: &PeakPass) {
        let min = self.threshold.max(1);
        for b in pass.watched.start_live.iter().filter(|b| !b.pending_free) {
            self.consider(
                Interval {
                    alloc: -1,
                    free: -1,
                    size: b.size,
                    addr: b.addr,
                    stack: b.stack,
                    alloc_index: b.alloc_index,
                },
                min,
            );
        }
        let mut sizes = pass.watched.block_sizes(&pass.config);
        for (i, e) in self.inp.events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    let size = sizes.at(i, e);
                    self.consider(
                        Interval {
                            alloc: i as i64,
                            free: -1,
                            size,
                            addr: e.addr,
                            stack: e.stack,
                            alloc_index: u32::try_from(i).ok(),
                        },
                        self.threshold,
                    );
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    if let Some(j) = self.open.remove(&e.addr) {
                        self.kept[j].free = i as i64;
                    }
                }
                _ => {}
            }
        }
    }

    /// Saves the segment map of state `st`.
    fn save_map(&mut self, st: &ReplayState) {
        let index = st.index;
        let when = format!("at event {index}");
        let inp = self.inp;
        let m = segments_of_state(self.snap, inp.events, st, &when, inp.index, inp.category_of);
        self.maps.push((
            index as u64,
            cap_segments(&m, MOMENT_MAX_SEGMENTS, DEFAULT_MAX_BLOCKS_PER_SEGMENT),
        ));
    }
}

impl MomentsWalk<'_> {
    /// The moments seen.
    fn finish(self) -> Moments {
        let MomentsWalk {
            snap,
            inp,
            mut kept,
            total,
            maps,
            ..
        } = self;
        // Largest first, so that a reader of the JSON sees what matters first.
        kept.sort_by(|a, b| b.size.cmp(&a.size).then(a.alloc.cmp(&b.alloc)));
        let mut out = Moments {
            total_allocs: total,
            min_kept_bytes: if (kept.len() as u64) < total {
                kept.last().map_or(0, |k| k.size)
            } else {
                0
            },
            ..Moments::default()
        };
        let mut frame_ids: HashMap<String, u32> = HashMap::default();
        let mut stack_ids: HashMap<StackId, i64> = HashMap::default();
        let mut site_ids: HashMap<String, i64> = HashMap::default();
        for k in &kept {
            let stack = *stack_ids.entry(k.stack).or_insert_with(|| {
                let labels = python_stack_labels(snap, k.stack);
                if labels.is_empty() {
                    return -1;
                }
                let ids = labels
                    .into_iter()
                    .take(MAX_STACK_FRAMES)
                    .map(|l| {
                        let next = out.frames.len() as u32;
                        *frame_ids.entry(l.clone()).or_insert_with(|| {
                            out.frames.push(l);
                            next
                        })
                    })
                    .collect();
                out.stacks.push(ids);
                out.stacks.len() as i64 - 1
            });
            let site = inp.an.block_site(inp.trace, k.alloc_index, k.stack).site;
            let category = (inp.category_of)(&site);
            let next = out.sites.len() as i64;
            let site = *site_ids.entry(site.clone()).or_insert_with(|| {
                out.sites.push(site);
                next
            });
            out.allocs.push([
                k.alloc,
                k.free,
                i64::try_from(k.size).unwrap_or(i64::MAX),
                i64::try_from(k.addr).unwrap_or(i64::MAX),
                stack,
                site,
                i64::from(category.code()),
            ]);
        }
        for (e, m) in maps {
            out.segment_events.push(e);
            out.segment_maps.push(m);
        }
        out
    }
}
