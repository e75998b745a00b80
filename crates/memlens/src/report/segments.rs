//! Bounding the size of the segment map.

use super::model::{BlockSite, BlockState, Category, SegmentBlock, SegmentMap};
use hashbrown::HashMap;

/// Segments kept by default: the largest ones, which hold most of the memory.
pub const DEFAULT_MAX_SEGMENTS: usize = 256;

/// Blocks per segment kept by default before small neighbours are merged.
pub const DEFAULT_MAX_BLOCKS_PER_SEGMENT: usize = 512;

/// Frames kept per block stack.
pub const MAX_BLOCK_STACK_FRAMES: usize = 16;

/// Keeps the `max_segments` largest segments (in address order), sums the rest
/// into [`SegmentMap::omitted`], merges runs of small blocks in segments with
/// more than `max_blocks` blocks (so each has at most about `2 * max_blocks`),
/// drops unused sites and cuts stacks to [`MAX_BLOCK_STACK_FRAMES`] frames.
pub fn cap_segments(m: &SegmentMap, max_segments: usize, max_blocks: usize) -> SegmentMap {
    let max_blocks = max_blocks.max(1);
    let mut order: Vec<usize> = (0..m.segments.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (&m.segments[a], &m.segments[b]);
        sb.size.cmp(&sa.size).then(sa.address.cmp(&sb.address))
    });
    let (kept, dropped) = order.split_at(max_segments.min(order.len()));
    let mut omitted = m.omitted.unwrap_or_default();
    for &i in dropped {
        let s = &m.segments[i];
        omitted.count += 1;
        omitted.bytes = omitted.bytes.saturating_add(s.size);
        for b in &s.blocks {
            let sum = match b.state {
                BlockState::Allocated => &mut omitted.allocated_bytes,
                BlockState::PendingFree => &mut omitted.pending_free_bytes,
                BlockState::Free => &mut omitted.free_bytes,
            };
            *sum = sum.saturating_add(b.size);
        }
    }
    let mut kept: Vec<usize> = kept.to_vec();
    kept.sort_by_key(|&i| m.segments[i].address);

    let mut site_map: HashMap<u32, u32> = HashMap::default();
    let mut sites: Vec<BlockSite> = Vec::new();
    let mut segments = Vec::with_capacity(kept.len());
    for i in kept {
        let mut seg = m.segments[i].clone();
        if seg.blocks.len() > max_blocks {
            seg.blocks = merge_small_blocks(&seg.blocks, seg.size / max_blocks as u64);
        }
        for b in &mut seg.blocks {
            b.site = b.site.and_then(|old| {
                let s = m.sites.get(old as usize)?;
                Some(*site_map.entry(old).or_insert_with(|| {
                    let mut s = s.clone();
                    s.stack.truncate(MAX_BLOCK_STACK_FRAMES);
                    sites.push(s);
                    (sites.len() - 1) as u32
                }))
            });
        }
        segments.push(seg);
    }
    SegmentMap {
        when: m.when.clone(),
        segments,
        sites,
        omitted: (omitted.count > 0).then_some(omitted),
    }
}

/// Merges runs of blocks smaller than `threshold` bytes: first neighbours of the
/// same state, then, if that is not enough, groups of at least `threshold`
/// bytes that take the state holding most of their bytes.
fn merge_small_blocks(blocks: &[SegmentBlock], threshold: u64) -> Vec<SegmentBlock> {
    let small = |b: &SegmentBlock| b.size < threshold;
    let mut out: Vec<SegmentBlock> = Vec::new();
    let mut run: Vec<SegmentBlock> = Vec::new();
    for b in blocks {
        if small(b) {
            run.push(*b);
        } else {
            flush_run(&mut run, threshold, &mut out);
            out.push(*b);
        }
    }
    flush_run(&mut run, threshold, &mut out);
    out
}

/// Emits a run of small blocks as few merged blocks.
fn flush_run(run: &mut Vec<SegmentBlock>, threshold: u64, out: &mut Vec<SegmentBlock>) {
    // Merge neighbours of the same state.
    let mut same: Vec<SegmentBlock> = Vec::new();
    for b in run.drain(..) {
        match same.last_mut() {
            Some(last) if last.state == b.state => absorb(last, &b),
            _ => same.push(b),
        }
    }
    if same.len() <= 2 {
        out.extend(same);
        return;
    }
    // Still fragmented: group into pieces of at least `threshold` bytes.
    let mut group: Option<(SegmentBlock, [u64; 3])> = None;
    for b in same {
        let (g, by_state) = group.get_or_insert_with(|| {
            let mut g = b;
            g.size = 0;
            g.requested = 0;
            g.count = 0;
            (g, [0; 3])
        });
        by_state[b.state as usize] = by_state[b.state as usize].saturating_add(b.size);
        absorb(g, &b);
        if g.size >= threshold {
            g.state = majority(by_state);
            out.push(*g);
            group = None;
        }
    }
    if let Some((mut g, by_state)) = group {
        g.state = majority(&by_state);
        out.push(g);
    }
}

/// Adds `b` (the next block in address order) to the merged block `into`.
fn absorb(into: &mut SegmentBlock, b: &SegmentBlock) {
    if into.count == 0 {
        into.category = b.category;
        into.site = b.site;
    } else {
        if into.category != b.category {
            into.category = Category::Other;
        }
        if into.site != b.site {
            into.site = None;
        }
    }
    into.size = into.size.saturating_add(b.size);
    into.requested = into.requested.saturating_add(b.requested);
    into.count = into.count.saturating_add(b.count.max(1));
}

/// The state with the most bytes.
fn majority(by_state: &[u64; 3]) -> BlockState {
    let mut best = 0;
    for k in 1..3 {
        if by_state[k] > by_state[best] {
            best = k;
        }
    }
    BlockState::from_code(best as u8)
}
