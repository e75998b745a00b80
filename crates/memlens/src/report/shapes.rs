//! The allocations of a short stretch of events, one by one, for the page
//! served by `memlens report --serve` to draw as memory_viz's "Active Memory
//! Timeline" does: each allocation a shape from its `alloc` to its free,
//! stacked in the order they were made, with its address, size, request and
//! stack on hover.
//!
//! Only for a stretch short enough to draw every event
//! ([`SHAPES_MAX_EVENTS`]); the blocks live before it come from the replay
//! to its first event, the rest from its events, with the block sizes the
//! trace's one replay gave them, so that the shapes live after each event
//! add up to that event's allocated bytes.

use super::convert::python_stack_labels;
use super::moments::MAX_STACK_FRAMES;
use crate::replay::during_read::PeakPass;
use crate::replay::LiveBlock;
use crate::snapshot::{Action, StackId};
use crate::trace::Analysed;
use hashbrown::HashMap;
use serde::Serialize;

/// Events in a stretch whose allocations are listed, at most.
pub const SHAPES_MAX_EVENTS: usize = 4000;
/// Allocations listed at most; a stretch with more lists none.
pub const SHAPES_MAX_ALLOCS: usize = 50_000;

/// The allocations live at some event of a stretch.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StretchAllocations {
    /// `[alloc_event, free_event, size, requested, address, site, stack]`:
    /// `alloc_event` -1 for a block allocated before the stretch, `free_event`
    /// -1 for one still allocated after it (its first free: the program let
    /// it go there, as allocated bytes count it); `size` the block's bytes,
    /// `requested` what the program asked for (the rest is rounding);
    /// `site` an index into `sites`, `stack` into `stacks` (-1: none).
    /// Blocks from before the stretch come first, by address, then the
    /// stretch's in the order they were made.
    pub allocs: Vec<[i64; 7]>,
    /// Site labels (`file:line`, or a pseudo-site).
    pub sites: Vec<String>,
    /// Stacks as frame labels, innermost first (cut to
    /// [`MAX_STACK_FRAMES`]).
    pub stacks: Vec<Vec<String>>,
}

/// The allocations of trace `trace` of `an`'s snapshot live at some event
/// from `from` to `to` (both included): `before` holds the blocks live
/// right before `from`, `pass` the trace's one replay (the block sizes).
/// `None` when the stretch is longer than [`SHAPES_MAX_EVENTS`] or holds
/// more than [`SHAPES_MAX_ALLOCS`] allocations.
pub(super) fn stretch_allocations(
    an: &Analysed<'_>,
    trace: usize,
    pass: &PeakPass,
    before: &[LiveBlock],
    (from, to): (usize, usize),
) -> Option<StretchAllocations> {
    if to < from || to - from + 1 > SHAPES_MAX_EVENTS {
        return None;
    }
    let events = an.snap.traces[trace].events.get(from..=to)?;
    let mut w = ShapesWalk {
        an,
        trace,
        out: StretchAllocations::default(),
        site_ids: HashMap::new(),
        stack_ids: HashMap::new(),
        open: HashMap::new(),
    };
    for b in before.iter().filter(|b| !b.pending_free) {
        w.open(-1, b.size, b.requested, b.addr, b.alloc_index, b.stack);
    }
    let mut sizes = pass.watched.block_sizes(&pass.config);
    for (k, e) in events.iter().enumerate() {
        let index = from + k;
        match e.action {
            Action::Alloc => {
                let size = sizes.at(index, e);
                let alloc = u32::try_from(index).ok();
                w.open(index as i64, size, e.size, e.addr, alloc, e.stack);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(i) = w.open.remove(&e.addr) {
                    w.out.allocs[i][1] = index as i64;
                }
            }
            _ => {}
        }
        if w.out.allocs.len() > SHAPES_MAX_ALLOCS {
            return None;
        }
    }
    Some(w.out)
}

/// The walk of [`stretch_allocations`].
struct ShapesWalk<'a, 's> {
    an: &'a Analysed<'s>,
    trace: usize,
    out: StretchAllocations,
    site_ids: HashMap<String, usize>,
    stack_ids: HashMap<StackId, i64>,
    /// Allocations not freed yet, by address.
    open: HashMap<u64, usize>,
}

impl ShapesWalk<'_, '_> {
    /// Lists an allocation made at `alloc_event` (-1: before the stretch).
    fn open(
        &mut self,
        alloc_event: i64,
        size: u64,
        requested: u64,
        addr: u64,
        alloc_index: Option<u32>,
        stack: StackId,
    ) {
        let site = self.an.block_site(self.trace, alloc_index, stack).site;
        let next = self.site_ids.len();
        let site = *self.site_ids.entry(site.clone()).or_insert_with(|| {
            self.out.sites.push(site);
            next
        });
        let snap = self.an.snap;
        let stacks = &mut self.out.stacks;
        let stack = *self.stack_ids.entry(stack).or_insert_with(|| {
            let mut labels = python_stack_labels(snap, stack);
            if labels.is_empty() {
                return -1;
            }
            labels.truncate(MAX_STACK_FRAMES);
            stacks.push(labels);
            stacks.len() as i64 - 1
        });
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.open.insert(addr, self.out.allocs.len());
        self.out.allocs.push([
            alloc_event,
            -1,
            as_i64(size),
            as_i64(requested),
            as_i64(addr),
            site as i64,
            stack,
        ]);
    }
}
