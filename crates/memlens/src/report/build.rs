//! Fills a [`ReportData`] from a diagnosis: the findings, a timeline stacked
//! by the top sites (one replay pass), the flame graph and the segment map at
//! the allocated peak (or at the OOM), the leak evidence and the `tune` table.
//! Everything is aggregated here; the raw snapshot never reaches the page.

use super::{
    segment_map, settings_pairs, stack_labels, Finding, FlameBuilder, LeakSite, Leaks, Meta,
    ReportData, Severity, Stat, TimelineBuilder, TimelinePoint, TimelineSite, Tune, TuneRow, XUnit,
    DEFAULT_MAX_POINTS,
};
use crate::analysis::doctor::{self, Diagnosis};
use crate::analysis::leaks::Confidence;
use crate::analysis::peak::BlockClassifier;
use crate::analysis::sites::{Site, SiteIndex};
use crate::analysis::steps;
use crate::replay::{Delta, Replay, ReplayOptions};
use crate::sim::BlockStatus;
use crate::snapshot::{Action, Block, BlockState, PoolKind, Segment, Snapshot, StackId};
use hashbrown::HashMap;

/// How many sites get their own band in the timeline.
const TIMELINE_SITES: usize = 8;

/// Builds the report of the snapshots of one run (the last one is replayed).
pub fn build_report(snaps: &[(String, &Snapshot)], d: &Diagnosis) -> ReportData {
    let files: Vec<String> = snaps.iter().map(|(n, _)| n.clone()).collect();
    let mut meta = Meta::now(files);
    let mut data = ReportData::default();
    data.findings = d.findings.iter().map(finding).collect();
    data.leaks = leaks(d);
    data.tune = d.tune.as_ref().map(|t| {
        let current = t
            .candidates
            .iter()
            .find(|c| c.recorded)
            .map_or(0, |c| c.peak_reserved_bytes);
        Tune {
            device_memory: None,
            rows: t
                .candidates
                .iter()
                .map(|c| TuneRow {
                    config: c.config.clone(),
                    peak_reserved_bytes: c.peak_reserved_bytes,
                    num_ooms: c.num_ooms,
                    num_device_alloc: 0,
                    delta_bytes: c.peak_reserved_bytes as i64 - current as i64,
                    current: c.recorded,
                })
                .collect(),
        }
    });
    let Some((_, snap)) = snaps.last() else {
        data.meta = meta;
        return data;
    };
    meta.settings = settings_pairs(&snap.settings);
    meta.device = Some(format!("cuda:{}", d.peak.device));
    meta.stats = vec![
        stat("peak allocated", d.peak.peak_allocated_bytes),
        stat("peak reserved", d.peak.peak_reserved_bytes),
        stat("allocated at dump", d.summary.allocated_bytes),
        stat("reserved at dump", d.summary.reserved_bytes),
        stat("non-releasable at dump", d.summary.inactive_split_bytes),
        Stat {
            label: "trace events".into(),
            bytes: None,
            text: Some(d.summary.trace_events.to_string()),
        },
    ];
    meta.notes = d.summary.warnings.clone();
    data.meta = meta;
    if let Some(trace) = snap
        .traces
        .iter()
        .position(|t| t.device == d.peak.device && !t.events.is_empty())
    {
        let (timeline, flame, segments) = replayed_views(snap, trace, d);
        data.timeline = Some(timeline);
        data.flame = Some(flame);
        data.segments = Some(segments);
    } else {
        // No trace: the dump-time state is all there is.
        let index = SiteIndex::new(snap);
        let mut flame = FlameBuilder::new("live at dump time");
        for seg in &snap.segments {
            for b in seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
            {
                flame.add_innermost_first(&stack_labels(snap, b.stack), b.size);
            }
        }
        data.flame = Some(flame.finish());
        data.segments = Some(segment_map(
            snap,
            &snap.segments,
            "at dump time",
            |s| Some(Site::of(snap, &index, s).site),
            |_| super::Category::Other,
        ));
    }
    data.bounded()
}

fn stat(label: &str, bytes: u64) -> Stat {
    Stat {
        label: label.into(),
        bytes: Some(bytes),
        text: None,
    }
}

fn finding(f: &doctor::Finding) -> Finding {
    Finding {
        kind: f.kind.clone(),
        severity: match f.severity {
            doctor::Severity::Critical => Severity::Critical,
            doctor::Severity::Warning => Severity::Warning,
            doctor::Severity::Info => Severity::Info,
        },
        title: f.title.clone(),
        site: f.site.clone(),
        bytes: f.bytes,
        suggestion: f.fix.clone(),
        evidence: f.evidence.clone(),
        stack: f.stack.clone(),
    }
}

fn leaks(d: &Diagnosis) -> Option<Leaks> {
    let shown: Vec<_> = d
        .leaks
        .leaks
        .iter()
        .filter(|l| l.confidence >= Confidence::Medium)
        .take(6)
        .collect();
    let first = shown.first()?;
    Some(Leaks {
        x_label: if d.leaks.method == "across_snapshots" {
            "snapshot".into()
        } else {
            "step".into()
        },
        points: first.evidence_labels.clone(),
        sites: shown
            .iter()
            .map(|l| LeakSite {
                site: l.site.clone(),
                function: l.function.clone(),
                stack: l.stack.clone(),
                bytes: l.evidence.clone(),
                bytes_per_step: l.bytes_per_step as i64,
                confidence: match l.confidence {
                    Confidence::High => 0.9,
                    Confidence::Medium => 0.6,
                    Confidence::Low => 0.3,
                },
                suggestion: Some(l.suggestion.clone()),
            })
            .collect(),
    })
}

/// The timeline (one pass over the trace), and the flame graph and segment
/// map at the moment that matters: the OOM when there is one, else the peak.
fn replayed_views(
    snap: &Snapshot,
    trace: usize,
    d: &Diagnosis,
) -> (super::Timeline, super::Flame, super::SegmentMap) {
    let t = &snap.traces[trace];
    let events = &t.events;
    let index = SiteIndex::new(snap);
    let st = steps::detect(snap, trace);
    let classifier = BlockClassifier::new(snap, trace, &st);

    // The top sites at the peak get a band each; the rest is `other`.
    let mut top: Vec<String> = Vec::new();
    let mut sites: Vec<TimelineSite> = Vec::new();
    for s in &d.peak.live_at_peak {
        if top.len() >= TIMELINE_SITES || top.contains(&s.site) {
            continue;
        }
        top.push(s.site.clone());
        sites.push(TimelineSite {
            site: s.site.clone(),
            function: s.function.clone(),
            stack: s.stack.clone(),
            category: s.category.into(),
            peak_bytes: s.bytes,
        });
    }
    let band_of_stack: Vec<Option<usize>> = (0..snap.stack_ranges.len() as StackId)
        .map(|s| {
            let site = Site::of(snap, &index, s).site;
            top.iter().position(|x| *x == site)
        })
        .collect();
    let timed = events.iter().any(|e| e.time_us != 0);
    let mut tl = TimelineBuilder::new(
        if timed { XUnit::TimeUs } else { XUnit::Event },
        sites,
        events.len() as u64,
        DEFAULT_MAX_POINTS,
    );
    let oom_index = events.iter().position(|e| e.action == Action::Oom);
    let focus = oom_index.or(d.peak.peak_event_index);
    let mut bands = vec![0u64; top.len()];
    let mut live: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut r = Replay::new(snap, t.device, &ReplayOptions::default());
    let mut focus_state = None;
    while let Some(s) = r.step() {
        match s.delta {
            Delta::Alloc { addr, size, .. } => {
                if let Some(b) = band_of_stack.get(s.event.stack as usize).copied().flatten() {
                    bands[b] += size;
                    live.insert(addr, (b, size));
                }
            }
            Delta::FreeRequested { addr, .. }
            | Delta::FreeCompleted {
                addr,
                also_requested: true,
                ..
            } => {
                if let Some((b, size)) = live.remove(&addr) {
                    bands[b] = bands[b].saturating_sub(size);
                }
            }
            _ => {}
        }
        let a = s.totals.all;
        tl.push(TimelinePoint {
            x: if timed {
                s.event.time_us
            } else {
                s.index as i64
            },
            event: s.index as u64,
            allocated: a.allocated,
            reserved: a.reserved,
            active: Some(a.active),
            bands: &bands,
            oom: matches!(s.delta, Delta::Oom { .. }),
            keep: Some(s.index) == d.peak.peak_event_index,
        });
        // The state right before the OOM (what the message describes), or at the peak.
        let at_focus = match oom_index {
            Some(o) => s.index + 1 == o,
            None => Some(s.index) == focus,
        };
        if at_focus {
            focus_state = Some((r.live_blocks(), r.segments(), s.index));
        }
    }
    let (live_blocks, views, at) =
        focus_state.unwrap_or_else(|| (r.live_blocks(), r.segments(), events.len()));
    let when = if oom_index.is_some() {
        format!("right before the OOM (event {})", at + 1)
    } else {
        format!("at the allocated peak (event {at})")
    };
    let classifier = classifier.until(at + 1);

    // Flame graph of what was live.
    let mut flame = FlameBuilder::new(format!("live {when}"));
    let mut cat_of_alloc: HashMap<u64, super::Category> = HashMap::new();
    for b in live_blocks.iter().filter(|b| !b.pending_free) {
        flame.add_innermost_first(&stack_labels(snap, b.stack), b.size);
        let (cat, _) = classifier.classify(b.alloc_index, b.stack);
        cat_of_alloc.insert(b.addr, cat.into());
    }

    // Segment map from the replayed segments.
    let segments: Vec<Segment> = views
        .iter()
        .map(|v| Segment {
            device: t.device,
            address: v.address,
            total_size: v.total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            pool: if v.is_small {
                PoolKind::Small
            } else {
                PoolKind::Large
            },
            pool_id: v.pool_id,
            is_expandable: v.is_expandable,
            stack: 0,
            blocks: v
                .blocks
                .iter()
                .map(|b| Block {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: match b.status {
                        BlockStatus::Allocated => BlockState::ActiveAllocated,
                        BlockStatus::PendingFree => BlockState::ActivePendingFree,
                        BlockStatus::Free => BlockState::Inactive,
                    },
                    stack: events.get(b.tag as usize).map_or(0, |e| e.stack),
                })
                .collect(),
        })
        .collect();
    let addr_of_stack: HashMap<StackId, u64> = segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.stack, b.address))
        .collect();
    let map = segment_map(
        snap,
        &segments,
        &when,
        |s| Some(Site::of(snap, &index, s).site),
        |s| {
            addr_of_stack
                .get(&s)
                .and_then(|a| cat_of_alloc.get(a))
                .copied()
                .unwrap_or(super::Category::Other)
        },
    );
    (tl.finish(), flame.finish(), map)
}
