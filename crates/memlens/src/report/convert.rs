//! Helpers that turn the snapshot model into report data: frame labels,
//! stacks as strings, allocator settings for display, a segment map.
//!
//! What a site is and what category a block belongs to are the analyses'
//! decisions; the caller passes them in as functions.

use super::model::{BlockSite, BlockState, Category, SegmentBlock, SegmentMap, SegmentRow};
use crate::snapshot::{self, AllocatorSettings, FrameId, PoolKind, Segment, Snapshot, StackId};
use hashbrown::HashMap;

/// A frame as the report labels it: `file:line in function`, as the stacks
/// of `memlens peak --json` read ([`crate::analysis::sites::stack_lines`]).
pub fn frame_label(snap: &Snapshot, id: FrameId) -> String {
    match snap.frames.get(id as usize) {
        Some(f) => format!(
            "{}:{} in {}",
            snap.str(f.filename),
            f.line,
            snap.str(f.name)
        ),
        None => "?".to_string(),
    }
}

/// Whether a frame label (`file:line in function`, as [`frame_label`]
/// writes it) is a library frame by the frame rulebook
/// ([`crate::frames::classify`]): PyTorch's, another package's, the standard
/// library's or memlens's own Python. The user's code, compiled code, native
/// frames and pseudo-frames (`<backward pass>`) are not.
pub fn is_library_label(label: &str) -> bool {
    let Some((location, function)) = label.rsplit_once(" in ") else {
        return false;
    };
    let Some((file, line)) = location.rsplit_once(':') else {
        return false;
    };
    if line.parse::<u32>().is_err() {
        return false;
    }
    use crate::frames::FrameKind;
    matches!(
        crate::frames::classify(file, function),
        FrameKind::Torch | FrameKind::Library | FrameKind::Memlens
    )
}

/// Indices of the library frames among `labels` ([`is_library_label`]).
pub fn library_labels(labels: &[String]) -> Vec<u32> {
    labels
        .iter()
        .enumerate()
        .filter(|(_, l)| is_library_label(l))
        .map(|(i, _)| i as u32)
        .collect()
}

/// The frames of a stack as labels, innermost first.
pub fn stack_labels(snap: &Snapshot, stack: StackId) -> Vec<String> {
    snap.stack(stack)
        .iter()
        .map(|&f| frame_label(snap, f))
        .collect()
}

/// The flame graph's one frame for a stack of native frames only (the
/// autograd engine's threads record no Python frame).
pub const FLAME_NATIVE_ONLY: &str = crate::analysis::sites::NATIVE_FRAMES_ONLY;

/// The frames of a stack as the report shows them (the flame graph, the
/// stacks of any moment, the segment map's), innermost first: the lines the
/// terminal prints ([`crate::analysis::sites::stack_lines`]), native frames
/// left out, else a stack's first frames kept would all be C++ and the
/// user's line cut off.
pub fn python_stack_labels(snap: &Snapshot, stack: StackId) -> Vec<String> {
    crate::analysis::sites::stack_lines(snap, stack)
}

/// The allocator settings as `(key, value)` pairs for [`super::Meta::settings`].
pub fn settings_pairs(s: &AllocatorSettings) -> Vec<(String, String)> {
    if !s.present {
        return Vec::new();
    }
    const KNOWN: [&str; 2] = ["roundup_power2_divisions", "PYTORCH_CUDA_ALLOC_CONF"];
    let mut v = vec![
        (
            "PYTORCH_CUDA_ALLOC_CONF".to_string(),
            if s.alloc_conf.is_empty() {
                "(not set)".to_string()
            } else {
                s.alloc_conf.clone()
            },
        ),
        (
            "max_split_size".to_string(),
            s.max_split_size
                .map_or("unlimited".to_string(), crate::units::format_bytes),
        ),
        (
            "garbage_collection_threshold".to_string(),
            s.garbage_collection_threshold.to_string(),
        ),
        (
            "expandable_segments".to_string(),
            s.expandable_segments.to_string(),
        ),
    ];
    if s.roundup_power2_divisions.iter().any(|&d| d != 0) {
        let d: Vec<String> = s
            .roundup_power2_divisions
            .iter()
            .map(u32::to_string)
            .collect();
        v.push(("roundup_power2_divisions".to_string(), d.join(",")));
    }
    let known = v.len();
    // `other` may repeat the keys above verbatim; show each key once.
    for (k, val) in &s.other {
        if KNOWN.contains(&k.as_str()) || v[..known].iter().any(|(have, _)| have == k) {
            continue;
        }
        let text = match val {
            serde_json::Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        v.push((k.clone(), text));
    }
    v
}

/// The pool of a segment as the page shows it: `large`, `small (private 1,2)`,
/// `large, expandable`.
pub fn pool_label(seg: &Segment) -> String {
    let mut s = match seg.pool {
        PoolKind::Small => "small".to_string(),
        PoolKind::Large => "large".to_string(),
    };
    if seg.pool_id != (0, 0) {
        s.push_str(&format!(" (private {},{})", seg.pool_id.0, seg.pool_id.1));
    }
    if seg.is_expandable {
        s.push_str(", expandable");
    }
    s
}

/// Builds a segment map from segments in the snapshot's model (the dump-time
/// `snap.segments`, or a replay's state at the peak or the OOM). `site_of`
/// names the site (`file:line`) of a stack, `category_of` its category; free
/// blocks get neither. Bound the result with [`super::cap_segments`].
pub fn segment_map(
    snap: &Snapshot,
    segments: &[Segment],
    when: &str,
    mut site_of: impl FnMut(StackId) -> Option<String>,
    mut category_of: impl FnMut(StackId) -> Category,
) -> SegmentMap {
    let mut sites: Vec<BlockSite> = Vec::new();
    let mut site_ids: HashMap<StackId, Option<u32>> = HashMap::default();
    let mut rows: Vec<SegmentRow> = Vec::with_capacity(segments.len());
    for seg in segments {
        let blocks = seg
            .blocks
            .iter()
            .map(|b| {
                let state = match b.state {
                    snapshot::BlockState::ActiveAllocated => BlockState::Allocated,
                    snapshot::BlockState::ActivePendingFree => BlockState::PendingFree,
                    snapshot::BlockState::Inactive => BlockState::Free,
                };
                let used = state != BlockState::Free && b.stack != snapshot::EMPTY_STACK;
                let site = if used {
                    *site_ids.entry(b.stack).or_insert_with(|| {
                        let site = site_of(b.stack)?;
                        sites.push(BlockSite {
                            site,
                            stack: python_stack_labels(snap, b.stack),
                        });
                        Some((sites.len() - 1) as u32)
                    })
                } else {
                    None
                };
                SegmentBlock {
                    offset: b.address.saturating_sub(seg.address),
                    size: b.size,
                    requested: if state == BlockState::Free {
                        0
                    } else {
                        b.requested_size
                    },
                    state,
                    category: if used {
                        category_of(b.stack)
                    } else {
                        Category::Other
                    },
                    site,
                    count: 1,
                }
            })
            .collect();
        rows.push(SegmentRow {
            address: seg.address,
            size: seg.total_size,
            stream: snap.stream(seg.stream),
            pool: pool_label(seg),
            blocks,
        });
    }
    rows.sort_by_key(|r| r.address);
    SegmentMap {
        when: when.to_string(),
        segments: rows,
        sites,
        omitted: None,
    }
}
