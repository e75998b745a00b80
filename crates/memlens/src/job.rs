//! The ranks of a large job, diagnosed a few ranks at a time.
//!
//! `doctor` on the ranks of one job otherwise reads every file before it
//! compares them ([`crate::doctor::diagnose_inputs`]): its memory is the sum
//! of the files, and 64 ranks of ~1 GB each do not fit. When every file
//! names its rank (`rank<N>`, the grouping's first rule, which reads no
//! file), each rank is read, diagnosed and left behind as what the job's
//! comparison needs: its own diagnosis (a part), the peak of its snapshot
//! with the highest one, whether it ran out of memory, and its memory over
//! time for the report. Ranks are read on a few workers at once, as many as
//! the cores and a memory budget allow ([`workers_for`]), so the memory is
//! that of a few ranks, not of the job. The diagnosis is the one the
//! all-at-once path gives (`tests/job.rs`).

use crate::analysis::inputs::{group, rank_in_name, ranks_reason, NAMED_RANKS};
use crate::analysis::peak::{peak_analysed, AnalysedSet, PeakReport};
use crate::analysis::ranks::{bytes_by_site, compare_rank_peaks, highest_peak, holds_oom};
use crate::doctor::{diagnose_in, DoctorOptions, Part};
use crate::replay::during_read::load;
use crate::report::{job_rank_series, RankSeries, RanksView};
use crate::snapshot::Snapshot;
use crate::source::{RunEvidence, SourceFinder};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One rank's files, as the user named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFiles {
    /// The rank its files' names state.
    pub rank: u32,
    /// Its files (periodic snapshots of the rank, in any order).
    pub files: Vec<PathBuf>,
}

/// The ranks of `files` when every file's name states its rank and there
/// are at least two ranks: the job the grouping's first rule would make.
pub fn ranks_by_name(files: &[PathBuf]) -> Option<Vec<RankFiles>> {
    let mut by_rank: BTreeMap<u32, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let rank = rank_in_name(&f.display().to_string())?;
        by_rank.entry(rank).or_default().push(f.clone());
    }
    (by_rank.len() >= 2).then(|| {
        by_rank
            .into_iter()
            .map(|(rank, files)| RankFiles { rank, files })
            .collect()
    })
}

/// Sites whose bytes over time each rank keeps for the report, the heaviest
/// at its peak first: the imbalance site is known only once every rank is
/// read, and it is one of the heaviest rank's largest.
const SERIES_SITES: usize = 16;

/// What one rank leaves behind once read.
#[derive(Clone, Debug)]
pub struct RankOutcome {
    /// Its own diagnosis, as the all-at-once path makes it.
    pub part: Part,
    /// The file of its highest allocated peak.
    pub peak_file: String,
    /// That peak.
    pub peak: PeakReport,
    /// Whether any of its snapshots holds an OOM.
    pub oom: bool,
    /// Its memory over time (the report's ranks section).
    pub series: RankSeries,
    /// The bytes over time of its heaviest sites at its peak.
    pub site_series: Vec<(String, Vec<u64>)>,
    /// Warnings of the evidence beside its files (holders files).
    pub warnings: Vec<String>,
}

/// Reads one rank's files and diagnoses it as the all-at-once path does:
/// its snapshots oldest first (the grouping's order within a process), its
/// diagnosis with the leaks quoted from its source, its highest peak.
pub fn diagnose_rank(rank: &RankFiles, opts: &DoctorOptions) -> crate::Result<RankOutcome> {
    let mut snaps: Vec<(String, Snapshot)> = Vec::with_capacity(rank.files.len());
    let mut passes = Vec::with_capacity(rank.files.len());
    for f in &rank.files {
        let read = load(f)?;
        snaps.push((f.display().to_string(), read.snap));
        passes.push(read.pass);
    }
    let named: Vec<(String, &Snapshot)> = snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let order: Vec<usize> = group(&named, false)
        .groups
        .iter()
        .flat_map(|g| g.files())
        .collect();
    let ordered: Vec<(String, &Snapshot)> = order.iter().map(|&i| named[i].clone()).collect();
    let ordered_passes = order.iter().map(|&i| passes[i].clone()).collect();
    let set = AnalysedSet::with_passes(&ordered, ordered_passes);
    let mut diagnosis = diagnose_in(&set, &ordered, opts);
    let sources = SourceFinder::with_env(opts.source_roots.clone());
    let run = RunEvidence::of(&ordered);
    diagnosis.leaks.annotate(&sources, &run);
    let (peak_file, peak, snap) = highest_peak(ordered.iter().map(|(f, s)| {
        let p = match set.get(s) {
            Some(an) => peak_analysed(an, usize::MAX),
            None => crate::analysis::peak::peak(s, usize::MAX),
        };
        ((f.clone(), *s), p)
    }))
    .map(|((f, s), p)| (f, p, s))
    .ok_or_else(|| crate::Error::Usage(format!("rank {}: no file to read", rank.rank)))?;
    let sites = heaviest_sites(&peak);
    let site_names: Vec<&str> = sites.iter().map(String::as_str).collect();
    let (series, by_site) = job_rank_series(&set, snap, rank.rank, peak.device, &site_names);
    Ok(RankOutcome {
        part: Part {
            label: format!("rank {}", rank.rank),
            rank: Some(rank.rank),
            files: ordered.iter().map(|(f, _)| f.clone()).collect(),
            diagnosis,
        },
        peak_file,
        oom: ordered.iter().any(|(_, s)| holds_oom(s)),
        peak,
        series,
        site_series: sites.into_iter().zip(by_site).collect(),
        warnings: run.holders.warnings,
    })
}

/// The sites with the most bytes live at `peak`, heaviest first.
fn heaviest_sites(peak: &PeakReport) -> Vec<String> {
    let mut sites: Vec<(&str, u64)> = bytes_by_site(peak).into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    sites
        .into_iter()
        .take(SERIES_SITES)
        .map(|(s, _)| s.to_string())
        .collect()
}

/// A job diagnosed rank by rank.
#[derive(Clone, Debug)]
pub struct JobDiagnosis {
    /// The job's diagnosis, as [`crate::doctor::diagnose_inputs`] gives it.
    pub diagnosis: crate::doctor::Diagnosis,
    /// The report's ranks section.
    pub ranks_view: RanksView,
    /// The files of the main rank (the one the diagnosis's fields are of),
    /// which the report reads again for its own views.
    pub main_files: Vec<PathBuf>,
    /// Warnings of the evidence beside the files.
    pub warnings: Vec<String>,
}

/// How many ranks to hold at once: each reads on one core and replays on
/// another, and holds about its files' size (snapshots as read take ~0.5x
/// a plain pickle's bytes and the analyses some more; compressed files
/// expand ~10x), within `memory_budget` bytes.
pub fn workers_for(ranks: &[RankFiles], cores: usize, memory_budget: u64) -> usize {
    let held = |f: &PathBuf| {
        let bytes = std::fs::metadata(f).map_or(0, |m| m.len());
        // The container from the file's first bytes (not decompressed).
        let mut magic = [0u8; 4];
        let compressed = std::fs::File::open(f)
            .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut magic))
            .ok()
            .and_then(|()| crate::input::detect(&magic));
        match compressed {
            Some(crate::input::Container::Gzip | crate::input::Container::Zstd) => {
                bytes.saturating_mul(10)
            }
            _ => bytes,
        }
    };
    let largest = ranks
        .iter()
        .map(|r| r.files.iter().map(held).sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let by_memory = (memory_budget / largest).max(1) as usize;
    (cores / 2).max(1).min(by_memory).min(ranks.len().max(1))
}

/// Diagnoses the ranks of a job, `workers` ranks at a time; `done` is
/// called as each rank is finished. The first rank that cannot be read is
/// the error (a rank missing would change what the others are compared to).
pub fn diagnose_job(
    ranks: &[RankFiles],
    opts: &DoctorOptions,
    workers: usize,
    done: impl Fn() + Sync,
) -> crate::Result<JobDiagnosis> {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers.max(1))
        .thread_name(|i| format!("memlens-rank-{i}"))
        .build()
        .map_err(|e| crate::Error::Usage(format!("no threads to read the ranks on: {e}")))?;
    let outcomes: Vec<RankOutcome> = pool.install(|| {
        ranks
            .par_iter()
            .with_max_len(1)
            .map(|r| {
                let out = diagnose_rank(r, opts);
                done();
                out
            })
            .collect::<crate::Result<Vec<_>>>()
    })?;
    Ok(combine_ranks(outcomes, opts))
}

/// The job's diagnosis from its ranks' outcomes (by rank).
fn combine_ranks(outcomes: Vec<RankOutcome>, opts: &DoctorOptions) -> JobDiagnosis {
    let peaks: Vec<(u32, String, PeakReport, bool)> = outcomes
        .iter()
        .map(|o| {
            (
                o.part.rank.unwrap_or(0),
                o.peak_file.clone(),
                o.peak.clone(),
                o.oom,
            )
        })
        .collect();
    let report = compare_rank_peaks(&peaks, opts.device_memory);
    let site = report
        .imbalance
        .as_ref()
        .and_then(|i| i.sites.first())
        .map(|s| s.site.clone());
    let main_rank = report.closest_to_oom;
    let mut warnings = Vec::new();
    let mut parts = Vec::with_capacity(outcomes.len());
    let mut series = Vec::with_capacity(outcomes.len());
    let mut main_files = Vec::new();
    for o in outcomes {
        let mut s = o.series;
        // The imbalance site's bytes where the rank kept them (one of its
        // heaviest at its peak); else none live at its peak worth a band.
        s.site_bytes = site
            .as_deref()
            .and_then(|site| o.site_series.iter().find(|(n, _)| n == site))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| vec![0; s.event.len()]);
        series.push(s);
        if o.part.rank == main_rank || main_files.is_empty() {
            main_files = o.part.files.iter().map(PathBuf::from).collect();
        }
        warnings.extend(o.warnings);
        parts.push(o.part);
    }
    let reason = ranks_reason(parts.len(), NAMED_RANKS);
    let mut diagnosis = crate::doctor::combine(parts, "ranks", reason, Some(report));
    diagnosis.annotate_findings(&SourceFinder::with_env(opts.source_roots.clone()));
    let ranks_view = crate::report::ranks_view_of(&diagnosis, site, series);
    warnings.sort();
    warnings.dedup();
    JobDiagnosis {
        diagnosis,
        ranks_view,
        main_files,
        warnings,
    }
}
