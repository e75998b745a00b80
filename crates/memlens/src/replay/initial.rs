//! The allocator state before a trace's first event, for traces that do not
//! start at the allocator's birth (the ring buffer wrapped, recording began
//! late, or memlens.record began a periodic snapshot's trace at the one
//! before): start from the dumped `segments` and undo the trace backwards, as
//! MemoryViz's "Allocator State History" does.

use crate::snapshot::{Action, BlockState, PoolKind, Recording, Snapshot, StackId, TraceEvent};
use hashbrown::HashMap;
use std::collections::BTreeMap;

/// A segment (or mapped expandable range) present before the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitialSegment {
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream index.
    pub stream: u16,
    /// `segment_pool_id`.
    pub pool_id: (i64, i64),
    /// Small pool.
    pub small: bool,
    /// A mapped range of an expandable segment.
    pub expandable: bool,
}

/// A block live before the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitialBlock {
    /// Address.
    pub addr: u64,
    /// Rounded size when the dump recorded it; `None` when only a free event
    /// in the trace tells of the block (its request is known, not its size).
    pub size: Option<u64>,
    /// The original request.
    pub requested: u64,
    /// Stream index.
    pub stream: u16,
    /// Freed by the user but not yet returned (between `free_requested` and
    /// `free_completed`).
    pub pending: bool,
    /// For blocks known only from the trace: the lowest address of another
    /// block allocated above it during its life, a bound on its end.
    pub end_bound: Option<u64>,
    /// The best stack known for it.
    pub stack: StackId,
}

/// Segments and live blocks before the first event of a device's trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitialState {
    /// Segments, in address order.
    pub segments: Vec<InitialSegment>,
    /// Live blocks, in address order.
    pub blocks: Vec<InitialBlock>,
    /// Frees in the trace whose allocation came before it.
    pub orphan_frees: usize,
}

/// The one wording of the fact that a trace began after the allocator did;
/// every caveat about it starts with these words ([`late_start`]).
pub const LATE_START: &str = "the trace does not start when the allocator did";

/// The caveat that a trace began after the allocator did, with what it
/// means for the figures at hand.
pub fn late_start(consequence: &str) -> String {
    format!("{LATE_START}: {consequence}")
}

/// Why a trace began after the allocator did, and what to do about it: what
/// `memlens.record` wrote in the snapshot says (`recording`), else the two
/// causes a bare `_record_memory_history` trace can have. A periodic
/// snapshot of memlens.record begins at the one before by design; telling
/// its user to raise `max_entries` would be wrong, as it changes nothing.
pub fn late_start_cause(recording: Option<&Recording>) -> String {
    let Some(r) = recording else {
        return "the ring buffer wrapped or recording began late, so its oldest events are missing; \
                record from the start of the process, or with a larger max_entries"
            .into();
    };
    if r.ring_wrapped {
        return if r.sized_by_user {
            format!(
                "memlens.record's ring of {} entries, the max_entries passed, wrapped, so the \
                 trace lost its start; pass a larger max_entries",
                r.max_entries
            )
        } else {
            format!(
                "memlens.record's ring of {} entries, the largest it sizes itself, wrapped, so the \
                 trace lost its start; pass a larger max_entries to memlens.record to keep it",
                r.max_entries
            )
        };
    }
    if r.trace_from_step > 0 {
        return format!(
            "memlens.record began this trace after step {}, at its previous snapshot: each \
             periodic snapshot's trace runs from the one before and its allocator state is whole, \
             so these blocks were allocated before it, as expected; the final snapshot holds the \
             last {} steps",
            r.trace_from_step, r.steps_kept
        );
    }
    "memlens.record started after these blocks were allocated; start it before the model is \
     built to see where they came from"
        .into()
}

impl InitialState {
    /// Nothing existed before the trace: it starts at the allocator's birth.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.blocks.is_empty()
    }
}

/// The state before the first event of `device`'s trace, [`reconstruct`]ed
/// from the dump.
pub fn before_trace(snap: &Snapshot, device: u32) -> InitialState {
    before_trace_with(snap, device, None)
}

/// [`before_trace`], empty without a walk back over the trace where the
/// replay beside the reader (`fed`) showed it
/// ([`super::during_read::PeakPass::starts_empty`]).
pub fn before_trace_with(
    snap: &Snapshot,
    device: u32,
    fed: Option<&super::during_read::PeakPass>,
) -> InitialState {
    if fed.is_some_and(|p| p.starts_empty(snap, device)) {
        return InitialState::default();
    }
    reconstruct(snap, device, snap.device_trace(device))
}

/// Undoes `events` from the dumped state of `device`.
pub fn reconstruct(snap: &Snapshot, device: u32, events: &[TraceEvent]) -> InitialState {
    crate::work::note_backward_rebuild();
    let mut segs: BTreeMap<u64, InitialSegment> = BTreeMap::new();
    let mut live: HashMap<u64, InitialBlock> = HashMap::new();
    for s in snap.segments.iter().filter(|s| s.device == device) {
        segs.insert(
            s.address,
            InitialSegment {
                addr: s.address,
                size: s.total_size,
                stream: s.stream,
                pool_id: s.pool_id,
                small: s.pool == PoolKind::Small,
                expandable: s.is_expandable,
            },
        );
        for b in &s.blocks {
            if b.state == BlockState::Inactive {
                continue;
            }
            live.insert(
                b.address,
                InitialBlock {
                    addr: b.address,
                    size: Some(b.size),
                    requested: b.requested_size,
                    stream: s.stream,
                    pending: b.state == BlockState::ActivePendingFree,
                    stack: b.stack,
                    end_bound: None,
                },
            );
        }
    }
    // Walking back, a free_completed makes its block live and waiting on a
    // stream until its free_requested; with no requests recorded it was
    // simply allocated.
    let requests = crate::snapshot::records_free_requests(events);
    for e in events.iter().rev() {
        match e.action {
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeRequested => match live.get_mut(&e.addr) {
                Some(b) => b.pending = false,
                None => {
                    live.insert(e.addr, orphan(e, false));
                }
            },
            Action::FreeCompleted => {
                live.insert(e.addr, orphan(e, requests));
            }
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(
                    e.addr,
                    InitialSegment {
                        addr: e.addr,
                        size: e.size,
                        stream: e.stream,
                        pool_id: (0, 0),
                        small: e.size == crate::sim::rounding::SMALL_BUFFER,
                        expandable: false,
                    },
                );
            }
            Action::SegmentMap => unmap_range(&mut segs, e.addr, e.size),
            Action::SegmentUnmap => map_range(&mut segs, e),
            Action::Snapshot | Action::Oom => {}
        }
    }
    // Blocks still live here were allocated before the trace. Those known
    // only from the trace's frees mark a cut trace.
    let mut blocks: Vec<InitialBlock> = live.into_values().collect();
    blocks.sort_unstable_by_key(|b| b.addr);
    bound_orphans(&mut blocks, events);
    let orphan_frees = blocks.iter().filter(|b| b.size.is_none()).count();
    InitialState {
        segments: segs.into_values().collect(),
        blocks,
        orphan_frees,
    }
}

/// Bounds the end of each block known only from the trace: while it lives,
/// every allocation above it starts at or after its end, and the first one
/// carved from the free space right after it starts exactly there.
fn bound_orphans(blocks: &mut [InitialBlock], events: &[TraceEvent]) {
    let mut open: BTreeMap<u64, usize> = blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.size.is_none())
        .map(|(i, b)| (b.addr, i))
        .collect();
    // Blocks live before the trace also bound their lower neighbour.
    for i in 0..blocks.len().saturating_sub(1) {
        if blocks[i].size.is_none() {
            blocks[i].end_bound = Some(blocks[i + 1].addr);
        }
    }
    for e in events {
        if open.is_empty() {
            break;
        }
        match e.action {
            Action::Alloc => {
                if let Some((_, &i)) = open.range(..e.addr).next_back() {
                    let b = &mut blocks[i];
                    b.end_bound = Some(b.end_bound.map_or(e.addr, |x| x.min(e.addr)));
                }
            }
            Action::FreeCompleted => {
                open.remove(&e.addr);
            }
            _ => {}
        }
    }
}

fn orphan(e: &TraceEvent, pending: bool) -> InitialBlock {
    InitialBlock {
        addr: e.addr,
        size: None,
        requested: e.size,
        stream: e.stream,
        pending,
        stack: e.stack,
        end_bound: None,
    }
}

/// Before a `segment_map`, its range was not mapped: cut it out.
fn unmap_range(segs: &mut BTreeMap<u64, InitialSegment>, addr: u64, size: u64) {
    let Some((&start, &s)) = segs.range(..=addr).next_back() else {
        return;
    };
    if !s.expandable || addr + size > s.addr + s.size {
        return;
    }
    segs.remove(&start);
    if addr > s.addr {
        segs.insert(
            s.addr,
            InitialSegment {
                size: addr - s.addr,
                ..s
            },
        );
    }
    let end = s.addr + s.size;
    if addr + size < end {
        segs.insert(
            addr + size,
            InitialSegment {
                addr: addr + size,
                size: end - addr - size,
                ..s
            },
        );
    }
}

/// Before a `segment_unmap`, its range was mapped: add it, joining neighbours.
fn map_range(segs: &mut BTreeMap<u64, InitialSegment>, e: &TraceEvent) {
    let mut seg = InitialSegment {
        addr: e.addr,
        size: e.size,
        stream: e.stream,
        pool_id: (0, 0),
        // Large pages are 20 MiB; a range that is not a multiple is small.
        small: !e.size.is_multiple_of(20 << 20),
        expandable: true,
    };
    if let Some((&a, &p)) = segs.range(..e.addr).next_back() {
        if p.expandable && p.addr + p.size == e.addr && p.stream == e.stream {
            segs.remove(&a);
            seg = InitialSegment {
                addr: p.addr,
                size: p.size + seg.size,
                ..p
            };
        }
    }
    if let Some(&n) = segs.get(&(e.addr + e.size)) {
        if n.expandable && n.stream == e.stream {
            segs.remove(&n.addr);
            seg.size += n.size;
            seg.small = n.small;
            seg.pool_id = n.pool_id;
        }
    }
    segs.insert(seg.addr, seg);
}
