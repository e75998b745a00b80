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
    let series: Vec<RankSeries> = r
        .ranks
        .iter()
        .filter_map(|row| {
            let (_, snap) = snaps.iter().find(|(n, _)| *n == row.file)?;
            let pass = match set.later(snap) {
                Some(l) => l.recorded().of_device(snap, row.device),
                None => RecordedPasses::default().of_device(snap, row.device),
            };
            let sites: Vec<&str> = site.as_deref().into_iter().collect();
            let (mut series, mut by_site) = rank_series(row.rank, snap, pass.as_deref(), &sites);
            series.site_bytes = by_site.pop().unwrap_or_else(|| vec![0; series.event.len()]);
            Some(series)
        })
        .collect();
    Some(ranks_view_of(d, site, series))
}

/// One rank of a job read rank by rank ([`crate::job`]): its series, and
/// the bytes over time of each of `sites` (the imbalance site is known only
/// once every rank is read, so each rank keeps those of its own heaviest
/// sites at its peak).
pub fn job_rank_series<'s>(
    set: &AnalysedSet<'s>,
    snap: &'s Snapshot,
    rank: u32,
    device: u32,
    sites: &[&str],
) -> (RankSeries, Vec<Vec<u64>>) {
    let pass = match set.later(snap) {
        Some(l) => l.recorded().of_device(snap, device),
        None => RecordedPasses::default().of_device(snap, device),
    };
    rank_series(rank, snap, pass.as_deref(), sites)
}

/// The ranks section from each rank's series (the imbalance site's bytes in
/// `site_bytes`, where known).
pub fn ranks_view_of(
    d: &Diagnosis,
    site: Option<String>,
    mut series: Vec<RankSeries>,
) -> RanksView {
    let Some(r) = d.ranks.as_ref() else {
        return RanksView::default();
    };
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
    RanksView {
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
    }
}

/// One rank's allocated and reserved bytes over its trace, and the bytes
/// live at each of `sites`, as the maxima of at most [`RANK_POINTS`] buckets
/// of events: a walk over the trace with the totals and block sizes of its
/// one replay (`pass`; `None`: no trace). `site_bytes` is left empty.
fn rank_series(
    rank: u32,
    snap: &Snapshot,
    pass: Option<&PeakPass>,
    sites: &[&str],
) -> (RankSeries, Vec<Vec<u64>>) {
    let mut out = RankSeries {
        rank,
        ..RankSeries::default()
    };
    let mut by_site: Vec<Vec<u64>> = vec![Vec::new(); sites.len()];
    let Some(pass) = pass else {
        return (out, by_site);
    };
    let index = SiteIndex::new(snap);
    // The site (of `sites`) each stack allocates at.
    let mut site_of: HashMap<StackId, Option<usize>> = HashMap::default();
    let mut which = |stack: StackId| {
        *site_of.entry(stack).or_insert_with(|| {
            if sites.is_empty() {
                return None;
            }
            let at = Site::of(snap, &index, stack).site;
            sites.iter().position(|s| *s == at)
        })
    };
    let events = snap.device_trace(pass.device);
    let n = events.len().max(1);
    let per = n.div_ceil(RANK_POINTS).max(1);
    // The sites' blocks, live, by address (until the first free): their site and size.
    let mut live: HashMap<u64, (usize, u64)> = HashMap::default();
    let mut site_bytes = vec![0u64; sites.len()];
    let mut site_max = vec![0u64; sites.len()];
    let mut peak_alloc = 0u64;
    let mut bucket: Option<(i64, u64, u64, u64)> = None; // time, event, alloc, reserved
    let mut sizes = pass.watched.block_sizes(&pass.config);
    for ((i, e), (allocated, reserved)) in events.iter().enumerate().zip(pass.totals()) {
        match e.action {
            Action::Alloc => {
                if let Some(k) = which(e.stack) {
                    let size = sizes.at(i, e);
                    site_bytes[k] += size;
                    live.insert(e.addr, (k, size));
                }
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some((k, size)) = live.remove(&e.addr) {
                    site_bytes[k] = site_bytes[k].saturating_sub(size);
                }
            }
            _ => {}
        }
        let b = bucket.get_or_insert((e.time_us, i as u64, 0, 0));
        if allocated >= b.2 {
            // The bucket's point sits at its highest allocated moment.
            b.0 = e.time_us;
            b.1 = i as u64;
        }
        b.2 = b.2.max(allocated);
        b.3 = b.3.max(reserved);
        for (m, &now) in site_max.iter_mut().zip(&site_bytes) {
            *m = (*m).max(now);
        }
        if allocated > peak_alloc {
            peak_alloc = allocated;
            out.peak_point = out.event.len();
        }
        if (i + 1) % per == 0 {
            flush(&mut out, &mut by_site, &mut site_max, bucket.take());
        }
    }
    flush(&mut out, &mut by_site, &mut site_max, bucket.take());
    out.peak_point = out.peak_point.min(out.event.len().saturating_sub(1));
    (out, by_site)
}

fn flush(
    out: &mut RankSeries,
    by_site: &mut [Vec<u64>],
    site_max: &mut [u64],
    b: Option<(i64, u64, u64, u64)>,
) {
    if let Some((t, e, a, r)) = b {
        out.time_us.push(t);
        out.event.push(e);
        out.allocated.push(a);
        out.reserved.push(r);
        for (series, max) in by_site.iter_mut().zip(site_max.iter_mut()) {
            series.push(*max);
            // The next bucket starts from the bytes live now, not this maximum.
            *max = 0;
        }
    }
}
