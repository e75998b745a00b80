//! The ranks of one distributed job side by side: each rank's exact peak,
//! its headroom to the device, the rank that ran out of memory (or is closest
//! to it), and the imbalance: what one rank holds beyond the median rank, and
//! at which site.

use super::peak::{peak, peak_analysed, AnalysedSet, PeakReport};
use crate::snapshot::Snapshot;
use crate::units::format_bytes;
use serde::Serialize;
use std::collections::BTreeMap;

/// One rank's figures.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    /// The rank.
    pub rank: u32,
    /// The file whose peak is shown (of the rank's snapshots, the one with
    /// the highest allocated peak).
    pub file: String,
    /// The device the rank's trace is on.
    pub device: u32,
    /// Exact peak of allocated bytes (a replay of the trace).
    pub peak_allocated_bytes: u64,
    /// Exact peak of reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Time of the allocated peak (epoch µs), when the trace has times.
    pub peak_time_us: Option<i64>,
    /// Device memory minus the reserved peak, when the device size is known.
    pub headroom_bytes: Option<u64>,
    /// The rank's trace holds an OOM.
    pub oom: bool,
}

/// What one site holds on the heaviest rank beyond the median rank.
#[derive(Clone, Debug, Serialize)]
pub struct SiteExcess {
    /// `file:line` of the site.
    pub site: String,
    /// Bytes live there at the heaviest rank's peak.
    pub bytes: u64,
    /// The median over ranks of the bytes live there at each rank's peak.
    pub median_bytes: u64,
    /// `bytes - median_bytes`.
    pub excess_bytes: u64,
    /// The site's stack, innermost first.
    pub stack: Vec<String>,
    /// The PyTorch operators that allocated there (from C++ frames).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// The category of its memory (parameter, optimizer_state, ...).
    pub category: String,
}

/// One rank holding more than the others.
#[derive(Clone, Debug, Serialize)]
pub struct Imbalance {
    /// The heaviest rank.
    pub rank: u32,
    /// Its allocated peak minus the median rank's.
    pub excess_bytes: u64,
    /// The median of the ranks' allocated peaks.
    pub median_peak_bytes: u64,
    /// The sites of the excess, largest first.
    pub sites: Vec<SiteExcess>,
    /// How many of `sites`, from the first, explain at least 90% of the
    /// excess together (all of them when they do not).
    pub explaining_sites: usize,
    /// Their excess, together.
    pub explained_bytes: u64,
    /// The excess of `sites` by category (parameter, optimizer_state, ...),
    /// largest first.
    pub by_category: Vec<(String, u64)>,
    /// What to change, for the known patterns.
    pub suggestion: String,
}

/// The ranks of one job.
#[derive(Clone, Debug, Serialize)]
pub struct RanksReport {
    /// One row per rank, by rank.
    pub ranks: Vec<RankRow>,
    /// The rank that ran out of memory, or the one with the highest reserved
    /// peak (the least headroom).
    pub closest_to_oom: Option<u32>,
    /// The device memory the headroom is measured against.
    pub device_memory: Option<u64>,
    /// One rank holding more than the median rank, when it does.
    pub imbalance: Option<Imbalance>,
}

/// An imbalance worth a finding: this much above the median rank's peak...
const MIN_EXCESS_BYTES: u64 = 32 << 20;
/// ... and this share of it.
const MIN_EXCESS_SHARE: f64 = 0.05;
/// The share of the heaviest rank's excess the sites it lists first explain.
const EXPLAINED_SHARE: f64 = 0.9;
/// Sites whose excess is smaller are noise of timing between ranks.
const MIN_SITE_EXCESS: u64 = 1 << 20;

/// The lower median: with two ranks, the lighter one, so that the excess of
/// the heavier is all of the difference.
fn lower_median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get((v.len().max(1) - 1) / 2).copied().unwrap_or(0)
}

/// Compares the ranks; `ranks` holds (rank, file, the rank's latest snapshot).
/// `device_memory`: the GPU's size, for the headroom.
pub fn compare(ranks: &[(u32, String, &Snapshot)], device_memory: Option<u64>) -> RanksReport {
    let named: Vec<(String, &Snapshot)> = ranks.iter().map(|(_, f, s)| (f.clone(), *s)).collect();
    compare_in(&AnalysedSet::new(&named), ranks, device_memory)
}

/// [`compare`] with the analysed traces (and their one replay each) of
/// `set`, which holds the ranks' snapshots.
pub fn compare_in<'s>(
    set: &AnalysedSet<'s>,
    ranks: &[(u32, String, &'s Snapshot)],
    device_memory: Option<u64>,
) -> RanksReport {
    let runs: Vec<(u32, Vec<(String, &'s Snapshot)>)> = ranks
        .iter()
        .map(|(r, f, s)| (*r, vec![(f.clone(), *s)]))
        .collect();
    compare_runs_in(set, &runs, device_memory)
}

/// [`compare_in`] of ranks given with all their snapshots (periodic ones,
/// oldest first): each rank's row is the snapshot with its highest
/// allocated peak, the run's peak as far as the files show it (issue 31: a
/// rank's true peak was 505 MB above the one reported, in an earlier
/// snapshot of that rank than its last); an OOM in any of them counts.
pub fn compare_runs_in<'s>(
    set: &AnalysedSet<'s>,
    ranks: &[(u32, Vec<(String, &'s Snapshot)>)],
    device_memory: Option<u64>,
) -> RanksReport {
    let peak_of = |s: &'s Snapshot| match set.get(s) {
        Some(an) => peak_analysed(an, usize::MAX),
        None => peak(s, usize::MAX),
    };
    let peaks: Vec<(u32, &String, PeakReport, bool)> = ranks
        .iter()
        .filter_map(|(r, files)| {
            let oom = files.iter().any(|(_, s)| holds_oom(s));
            let (file, peak) = highest_peak(files.iter().map(|(f, s)| (f, peak_of(s))))?;
            Some((*r, file, peak, oom))
        })
        .collect();
    let borrowed: Vec<(u32, &String, &PeakReport, bool)> =
        peaks.iter().map(|(r, f, p, o)| (*r, *f, p, *o)).collect();
    compare_peaks(&borrowed, device_memory)
}

/// Whether any trace of `snap` holds an OOM.
pub fn holds_oom(snap: &Snapshot) -> bool {
    snap.traces
        .iter()
        .flat_map(|t| &t.events)
        .any(|e| snap.is_oom_failure(e))
}

/// Of one rank's snapshots (oldest first) and their peaks, the one with the
/// highest allocated peak; of equal ones, the latest.
pub fn highest_peak<F>(
    peaks: impl IntoIterator<Item = (F, PeakReport)>,
) -> Option<(F, PeakReport)> {
    peaks.into_iter().fold(None, |best, (f, p)| match best {
        Some((bf, bp)) if bp.peak_allocated_bytes > p.peak_allocated_bytes => Some((bf, bp)),
        _ => Some((f, p)),
    })
}

/// Compares ranks from what each left behind: (rank, the file of its
/// highest peak, that peak, whether any of its snapshots holds an OOM). The
/// same report [`compare_runs_in`] gives, for ranks read one at a time
/// ([`crate::job`]).
pub fn compare_rank_peaks(
    peaks: &[(u32, String, PeakReport, bool)],
    device_memory: Option<u64>,
) -> RanksReport {
    let borrowed: Vec<(u32, &String, &PeakReport, bool)> =
        peaks.iter().map(|(r, f, p, o)| (*r, f, p, *o)).collect();
    compare_peaks(&borrowed, device_memory)
}

fn compare_peaks(
    peaks: &[(u32, &String, &PeakReport, bool)],
    device_memory: Option<u64>,
) -> RanksReport {
    let mut rows: Vec<RankRow> = peaks
        .iter()
        .map(|(r, f, p, oom)| RankRow {
            rank: *r,
            file: (*f).clone(),
            device: p.device,
            peak_allocated_bytes: p.peak_allocated_bytes,
            peak_reserved_bytes: p.peak_reserved_bytes,
            peak_time_us: p.peak_time_us,
            headroom_bytes: device_memory.map(|d| d.saturating_sub(p.peak_reserved_bytes)),
            oom: *oom,
        })
        .collect();
    rows.sort_by_key(|r| r.rank);
    let closest_to_oom = rows
        .iter()
        .max_by_key(|r| (r.oom, r.peak_reserved_bytes, std::cmp::Reverse(r.rank)))
        .map(|r| r.rank);
    RanksReport {
        imbalance: imbalance(peaks),
        ranks: rows,
        closest_to_oom,
        device_memory,
    }
}

fn imbalance(peaks: &[(u32, &String, &PeakReport, bool)]) -> Option<Imbalance> {
    if peaks.len() < 2 {
        return None;
    }
    let median_peak = lower_median(peaks.iter().map(|p| p.2.peak_allocated_bytes).collect());
    // The heaviest rank; ties go to the lowest rank, whatever the file order.
    let (rank, _, heavy, _) = peaks
        .iter()
        .max_by_key(|p| (p.2.peak_allocated_bytes, std::cmp::Reverse(p.0)))?;
    let excess = heavy.peak_allocated_bytes.saturating_sub(median_peak);
    if excess < MIN_EXCESS_BYTES || (excess as f64) < MIN_EXCESS_SHARE * median_peak as f64 {
        return None;
    }
    // Bytes live at each rank's peak, by site.
    let maps: Vec<BTreeMap<&str, u64>> = peaks.iter().map(|p| bytes_by_site(p.2)).collect();
    let heavy_map = bytes_by_site(heavy);
    let mut sites: Vec<SiteExcess> = heavy_map
        .iter()
        .filter_map(|(site, &bytes)| {
            let median = lower_median(
                maps.iter()
                    .map(|m| m.get(site).copied().unwrap_or(0))
                    .collect(),
            );
            let excess = bytes.saturating_sub(median);
            (excess >= MIN_SITE_EXCESS).then(|| {
                // The largest group at the site gives the stack and category.
                let top = heavy
                    .live_at_peak
                    .iter()
                    .filter(|s| s.site == *site)
                    .max_by_key(|s| s.bytes);
                SiteExcess {
                    site: site.to_string(),
                    bytes,
                    median_bytes: median,
                    excess_bytes: excess,
                    stack: top.map(|t| t.stack.clone()).unwrap_or_default(),
                    ops: top.map(|t| t.ops.clone()).unwrap_or_default(),
                    category: top
                        .map(|t| t.category.as_str().to_string())
                        .unwrap_or_default(),
                }
            })
        })
        .collect();
    sites.sort_by(|a, b| (b.excess_bytes, &a.site).cmp(&(a.excess_bytes, &b.site)));
    let suggestion = suggest(*rank, excess, sites.first());
    // The fewest sites, largest first, that explain 90% of the gap.
    let (mut explaining_sites, mut explained_bytes) = (0, 0u64);
    for s in &sites {
        if explained_bytes as f64 >= EXPLAINED_SHARE * excess as f64 {
            break;
        }
        explaining_sites += 1;
        explained_bytes += s.excess_bytes;
    }
    let mut by_category: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &sites {
        *by_category.entry(s.category.as_str()).or_default() += s.excess_bytes;
    }
    let mut by_category: Vec<(String, u64)> = by_category
        .into_iter()
        .map(|(c, b)| (c.to_string(), b))
        .collect();
    by_category.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(Imbalance {
        rank: *rank,
        excess_bytes: excess,
        median_peak_bytes: median_peak,
        sites,
        explaining_sites,
        explained_bytes,
        by_category,
        suggestion,
    })
}

/// Bytes live at the peak of `p`, by site.
pub fn bytes_by_site(p: &PeakReport) -> BTreeMap<&str, u64> {
    let mut m: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &p.live_at_peak {
        *m.entry(s.site.as_str()).or_default() += s.bytes;
    }
    m
}

/// The fix for the known patterns, read from the site's stack and category.
fn suggest(rank: u32, excess: u64, site: Option<&SiteExcess>) -> String {
    let Some(s) = site else {
        return format!(
            "rank {rank} holds {} more at its peak, spread over many sites: compare the ranks with `memlens diff`",
            format_bytes(excess)
        );
    };
    // The Python frames say where from, the operators (of C++ frames) what
    // allocated: a `clone` at a rank-0-only line is a copy.
    let text = format!("{} {} {}", s.site, s.stack.join(" "), s.ops.join(" ")).to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&[
        "ema", "teacher", "shadow", "swa", "average", "clone", "deepcopy", "copy",
    ]) {
        format!(
            "a copy of the model (an EMA, teacher or averaged weights) is kept on rank {rank} only: \
             keep it on every rank (or shard it), or keep it on the CPU (`p.detach().to(\"cpu\", non_blocking=True)`); \
             otherwise rank {rank} runs out of memory first"
        )
    } else if s.category == "optimizer_state" || has(&["optim", "adam", "sgd"]) {
        format!(
            "optimizer state is not sharded: rank {rank} holds more of it; shard it \
             (`torch.distributed.optim.ZeroRedundancyOptimizer`, or FSDP/ZeRO) so each rank keeps 1/world_size"
        )
    } else if has(&["log", "metric", "wandb", "tensorboard", "append", "history"]) {
        format!(
            "logging buffers kept on rank {rank}: store `.item()` or `.cpu()` values, not GPU tensors"
        )
    } else {
        format!(
            "rank {rank} allocates {} more at {} than the median rank: allocate it on every rank alike, or move it off the GPU",
            format_bytes(s.excess_bytes),
            s.site
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_median_takes_the_lighter_of_two() {
        assert_eq!(lower_median(vec![10, 3]), 3);
        assert_eq!(lower_median(vec![5, 1, 9]), 5);
        assert_eq!(lower_median(vec![4, 1, 9, 7]), 4);
        assert_eq!(lower_median(vec![]), 0);
    }
}
