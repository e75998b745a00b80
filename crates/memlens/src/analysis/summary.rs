//! `memlens summary`: the allocator state at dump time, from the snapshot's
//! segments and blocks, plus what the trace holds.
//!
//! The figures follow `torch.cuda.memory_stats()` exactly (internals §5):
//! reserved is the sum of segment sizes, allocated the sum of allocated block
//! sizes, `inactive_split_bytes` the free blocks of split non-expandable
//! segments, `segments` the cudaMalloc segments (expandable ranges are counted
//! apart).

use crate::replay::during_read::PendingPass;
use crate::snapshot::{Action, AllocatorSettings, BlockState, PoolKind, Snapshot};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Free memory in one pool of one stream: what the next allocation on that
/// stream can be served from without asking CUDA for more.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolFree {
    /// Device ordinal.
    pub device: u32,
    /// `small` or `large`.
    pub pool: PoolKind,
    /// The raw `cudaStream_t` (0 is the default stream).
    pub stream: i64,
    /// Private pool id; `(0, 0)` is the default pool.
    pub pool_id: (i64, i64),
    /// Bytes reserved by the pool's segments.
    pub reserved_bytes: u64,
    /// Free bytes in the pool.
    pub free_bytes: u64,
    /// Number of free blocks.
    pub free_blocks: u64,
    /// The largest free block: the biggest request this pool can serve now.
    pub largest_free_block_bytes: u64,
}

/// The allocator state at dump time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Device ordinals in the snapshot.
    pub devices: Vec<u32>,
    /// Bytes reserved from CUDA (`reserved_bytes.all.current`).
    pub reserved_bytes: u64,
    /// Bytes in allocated blocks, rounded (`allocated_bytes.all.current`).
    pub allocated_bytes: u64,
    /// Allocated plus pending-free bytes (`active_bytes.all.current`).
    pub active_bytes: u64,
    /// Bytes requested by active allocations, unrounded (`requested_bytes.all.current`).
    pub requested_bytes: u64,
    /// Free bytes inside split segments, which cannot be released
    /// (`inactive_split_bytes.all.current`, "non-releasable memory").
    pub inactive_split_bytes: u64,
    /// cudaMalloc segments (`segment.all.current`); expandable ranges not counted.
    pub segments: u64,
    /// Mapped ranges of expandable segments.
    pub expandable_ranges: u64,
    /// All blocks.
    pub blocks: u64,
    /// Blocks held by tensors.
    pub allocated_blocks: u64,
    /// Blocks freed but waiting on stream events.
    pub pending_free_blocks: u64,
    /// Free blocks.
    pub inactive_blocks: u64,
    /// The largest free block anywhere.
    pub largest_free_block_bytes: u64,
    /// Free memory per device, pool and stream, largest free block first.
    pub pools: Vec<PoolFree>,
    /// Rounding waste: allocated block size minus requested size, over allocated blocks.
    pub internal_fragmentation_bytes: u64,
    /// Free bytes held in segments (reserved but not active).
    pub external_fragmentation_bytes: u64,
    /// External fragmentation as a share of reserved bytes (0 to 1).
    pub external_fragmentation_ratio: f64,
    /// Number of trace events over all devices.
    pub trace_events: u64,
    /// Trace events by action name.
    pub trace_events_by_action: BTreeMap<String, u64>,
    /// Frees in the trace whose allocation is not in it (the ring buffer wrapped).
    pub frees_without_alloc: u64,
    /// `record_function` annotations.
    pub annotations: u64,
    /// Distinct frames and stacks recorded.
    pub distinct_frames: u64,
    /// Distinct stacks recorded.
    pub distinct_stacks: u64,
    /// The allocator settings recorded with the snapshot.
    pub allocator_settings: AllocatorSettings,
    /// The snapshot is in the legacy (PyTorch <= 2.0) form.
    pub legacy_format: bool,
    /// Things worth knowing about the snapshot itself.
    pub warnings: Vec<String>,
    /// What went wrong with how it was recorded, each with its fix
    /// ([`super::capture`]).
    pub capture_checks: Vec<super::capture::CaptureCheck>,
}

/// Computes the summary of a snapshot.
pub fn summarize(snap: &Snapshot) -> Summary {
    summarize_with(snap, None)
}

/// [`summarize`] of a snapshot read with its trace replayed beside the
/// reader (`fed`, waited for when there is a trace): a trace that replay
/// went through needs no walk to find frees without their allocation.
pub fn summarize_with(snap: &Snapshot, fed: Option<&PendingPass>) -> Summary {
    let mut s = counts_of(snap);
    add_segments(&mut s, snap);
    add_trace_counts(&mut s, snap, fed);
    s
}

/// The summary's counts of what the snapshot holds besides its segments and
/// trace (devices, annotations, frames, settings, warnings); the rest zero.
fn counts_of(snap: &Snapshot) -> Summary {
    Summary {
        devices: snap.devices(),
        reserved_bytes: 0,
        allocated_bytes: 0,
        active_bytes: 0,
        requested_bytes: 0,
        inactive_split_bytes: 0,
        segments: 0,
        expandable_ranges: 0,
        blocks: 0,
        allocated_blocks: 0,
        pending_free_blocks: 0,
        inactive_blocks: 0,
        largest_free_block_bytes: 0,
        pools: Vec::new(),
        internal_fragmentation_bytes: 0,
        external_fragmentation_bytes: 0,
        external_fragmentation_ratio: 0.0,
        trace_events: snap.event_count() as u64,
        trace_events_by_action: BTreeMap::new(),
        frees_without_alloc: 0,
        annotations: snap.annotations.len() as u64,
        distinct_frames: snap.frames.len() as u64,
        distinct_stacks: snap.stack_ranges.len().saturating_sub(1) as u64,
        allocator_settings: snap.settings.clone(),
        legacy_format: snap.legacy,
        warnings: snap.warnings.clone(),
        capture_checks: super::capture::capture_checks(snap),
    }
}

/// Adds the segments and their blocks: the allocator's byte and block
/// counts, fragmentation, and the free memory of each pool (largest free
/// block first).
fn add_segments(s: &mut Summary, snap: &Snapshot) {
    let mut pools: HashMap<(u32, PoolKind, u16, (i64, i64)), PoolFree> = HashMap::new();
    let mut legacy_requested = 0u64;
    for seg in &snap.segments {
        s.reserved_bytes += seg.total_size;
        s.requested_bytes += seg.requested_size;
        if seg.is_expandable {
            s.expandable_ranges += 1;
        } else {
            s.segments += 1;
        }
        let pool = pools
            .entry((seg.device, seg.pool, seg.stream, seg.pool_id))
            .or_insert_with(|| PoolFree {
                device: seg.device,
                pool: seg.pool,
                stream: snap.stream(seg.stream),
                pool_id: seg.pool_id,
                reserved_bytes: 0,
                free_bytes: 0,
                free_blocks: 0,
                largest_free_block_bytes: 0,
            });
        pool.reserved_bytes += seg.total_size;
        let split = seg.blocks.len() > 1;
        for b in &seg.blocks {
            s.blocks += 1;
            match b.state {
                BlockState::ActiveAllocated => {
                    s.allocated_blocks += 1;
                    s.allocated_bytes += b.size;
                    s.active_bytes += b.size;
                    s.internal_fragmentation_bytes += b.size.saturating_sub(b.requested_size);
                    legacy_requested += b.requested_size;
                }
                BlockState::ActivePendingFree => {
                    s.pending_free_blocks += 1;
                    s.active_bytes += b.size;
                    legacy_requested += b.requested_size;
                }
                BlockState::Inactive => {
                    s.inactive_blocks += 1;
                    if split && !seg.is_expandable {
                        s.inactive_split_bytes += b.size;
                    }
                    pool.free_bytes += b.size;
                    pool.free_blocks += 1;
                    pool.largest_free_block_bytes = pool.largest_free_block_bytes.max(b.size);
                    s.largest_free_block_bytes = s.largest_free_block_bytes.max(b.size);
                }
            }
        }
    }
    if snap.legacy && s.requested_bytes == 0 {
        s.requested_bytes = legacy_requested;
    }
    s.external_fragmentation_bytes = s.reserved_bytes.saturating_sub(s.active_bytes);
    if s.reserved_bytes > 0 {
        s.external_fragmentation_ratio =
            s.external_fragmentation_bytes as f64 / s.reserved_bytes as f64;
    }
    s.pools = pools.into_values().collect();
    s.pools.sort_by(|a, b| {
        (
            b.largest_free_block_bytes,
            b.reserved_bytes,
            a.device,
            a.stream,
        )
            .cmp(&(
                a.largest_free_block_bytes,
                a.reserved_bytes,
                b.device,
                b.stream,
            ))
    });
}

/// Adds the trace's events by action and the frees whose allocation is not
/// in the trace (with a warning when the ring buffer wrapped unannounced).
fn add_trace_counts(s: &mut Summary, snap: &Snapshot, fed: Option<&PendingPass>) {
    let mut counts = [0u64; Action::ALL.len()];
    for t in &snap.traces {
        // The replay beside the reader (`doctor`) finds every free's
        // allocation, if it goes through the trace: then only the counts are
        // left, made while it finishes.
        if let Some(fed) = fed {
            let mut own = [0u64; Action::ALL.len()];
            for e in &t.events {
                own[e.action as usize] += 1;
            }
            if fed.get().is_some_and(|p| p.replayed(t)) {
                for (c, n) in counts.iter_mut().zip(own) {
                    *c += n;
                }
                continue;
            }
        }
        // A free whose allocation is not in the trace means the ring buffer
        // dropped the oldest events.
        let t = super::trace_tally::tally(&t.events);
        for (c, n) in counts.iter_mut().zip(t.counts) {
            *c += n;
        }
        s.frees_without_alloc += t.frees_without_alloc;
    }
    for (a, n) in Action::ALL.iter().zip(counts) {
        if n > 0 {
            s.trace_events_by_action.insert(a.as_str().to_string(), n);
        }
    }
    if s.frees_without_alloc > 0 && snap.settings.trace_alloc_overflowed != Some(true) {
        s.warnings.push(crate::replay::initial::late_start(&format!(
            "{} frees in it have no allocation in it: {}",
            s.frees_without_alloc,
            crate::replay::initial::late_start_cause(snap.recording.as_ref())
        )));
    }
}
