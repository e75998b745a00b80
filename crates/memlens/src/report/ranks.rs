//! The ranks of one job side by side in the report: one timeline per rank on
//! a shared time axis, each rank's peak marked, the imbalance site's bytes
//! drawn on every rank.

use super::model::{RankLine, RankSeries, RanksView};
use crate::analysis::peak::{AnalysedSet, AnalysedSource};
use crate::analysis::sites::{Site, SiteIndex};
use crate::doctor::Diagnosis;
use crate::replay::during_read::{PeakPass, RecordedPasses};
use crate::snapshot::{Action, Snapshot, StackId};
use hashbrown::HashMap;

/// Points drawn per rank at most (the maxima of each bucket of events).
pub const RANK_POINTS: usize = 1500;

/// The view of `d.ranks`, when the inputs were the ranks of one job.
pub fn ranks_view<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    d: &Diagnosis,
) -> Option<RanksView> {
    let r = d.ranks.as_ref()?;
    let site = r
        .imbalance
        .as_ref()
        .and_then(|i| i.sites.first())
        .map(|s| s.site.clone());
    let mut series: Vec<RankSeries> = r
        .ranks
        .iter()
        .filter_map(|row| {
            let (_, snap) = snaps.iter().find(|(n, _)| *n == row.file)?;
            let pass = match set.later(snap) {
                Some(l) => l.recorded().of_device(snap, row.device),
                None => RecordedPasses::default().of_device(snap, row.device),
            };
            Some(rank_series(
                row.rank,
                snap,
                pass.as_deref(),
                site.as_deref(),
            ))
        })
        .collect();
    // A shared axis: seconds from the first event of any rank, when the
    // traces have times; else event indices of each rank.
    let t0 = series
        .iter()
        .filter_map(|s| s.time_us.first().copied())
        .filter(|&t| t > 0)
        .min();
    for s in &mut series {
        s.x = match t0 {
            Some(t0) if s.time_us.first().is_some_and(|&t| t > 0) => {
                s.time_us.iter().map(|&t| (t - t0) as f64 / 1e6).collect()
            }
            _ => s.event.iter().map(|&e| e as f64).collect(),
        };
        s.time_us.clear();
    }
    Some(RanksView {
        reason: d
            .inputs
            .as_ref()
            .map(|i| i.reason.clone())
            .unwrap_or_default(),
        x_unit: if t0.is_some() { "s" } else { "event" }.into(),
        ranks: r
            .ranks
            .iter()
            .map(|row| RankLine {
                rank: row.rank,
                file: row.file.clone(),
                peak_allocated_bytes: row.peak_allocated_bytes,
                peak_reserved_bytes: row.peak_reserved_bytes,
                headroom_bytes: row.headroom_bytes,
                oom: row.oom,
                closest_to_oom: r.closest_to_oom == Some(row.rank),
            })
            .collect(),
        imbalance_rank: r.imbalance.as_ref().map(|i| i.rank),
        imbalance_bytes: r.imbalance.as_ref().map(|i| i.excess_bytes),
        imbalance_site: site,
        suggestion: r.imbalance.as_ref().map(|i| i.suggestion.clone()),
        series,
    })
}

/// One rank's allocated and reserved bytes (and the imbalance site's) over
/// its trace, as the maxima of at most [`RANK_POINTS`] buckets of events: a
/// walk over the trace with the totals and block sizes of its one replay
/// (`pass`; `None`: no trace).
fn rank_series(
    rank: u32,
    snap: &Snapshot,
    pass: Option<&PeakPass>,
    site: Option<&str>,
) -> RankSeries {
    let mut out = RankSeries {
        rank,
        ..RankSeries::default()
    };
    let Some(pass) = pass else {
        return out;
    };
    let index = SiteIndex::new(snap);
    let mut matches: HashMap<StackId, bool> = HashMap::default();
    let mut is_site = |stack: StackId| {
        *matches
            .entry(stack)
            .or_insert_with(|| site.is_some_and(|s| Site::of(snap, &index, stack).site == s))
    };
    let events = snap.device_trace(pass.device);
    let n = events.len().max(1);
    let per = n.div_ceil(RANK_POINTS).max(1);
    // The site's blocks, live, by address (until the first free).
    let mut live: HashMap<u64, u64> = HashMap::default();
    let (mut site_bytes, mut peak_alloc) = (0u64, 0u64);
    let mut bucket: Option<(i64, u64, u64, u64, u64)> = None; // time, event, alloc, reserved, site
    for ((i, e), (allocated, reserved)) in events.iter().enumerate().zip(pass.totals()) {
        match e.action {
            Action::Alloc if is_site(e.stack) => {
                let size = pass.watched.block_size(&pass.config, i, e);
                site_bytes += size;
                live.insert(e.addr, size);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(size) = live.remove(&e.addr) {
                    site_bytes = site_bytes.saturating_sub(size);
                }
            }
            _ => {}
        }
        let b = bucket.get_or_insert((e.time_us, i as u64, 0, 0, 0));
        if allocated >= b.2 {
            // The bucket's point sits at its highest allocated moment.
            b.0 = e.time_us;
            b.1 = i as u64;
        }
        b.2 = b.2.max(allocated);
        b.3 = b.3.max(reserved);
        b.4 = b.4.max(site_bytes);
        if allocated > peak_alloc {
            peak_alloc = allocated;
            out.peak_point = out.event.len();
        }
        if (i + 1) % per == 0 {
            flush(&mut out, bucket.take());
        }
    }
    flush(&mut out, bucket.take());
    out.peak_point = out.peak_point.min(out.event.len().saturating_sub(1));
    out
}

fn flush(out: &mut RankSeries, b: Option<(i64, u64, u64, u64, u64)>) {
    if let Some((t, e, a, r, s)) = b {
        out.time_us.push(t);
        out.event.push(e);
        out.allocated.push(a);
        out.reserved.push(r);
        out.site_bytes.push(s);
    }
}
