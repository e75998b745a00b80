//! The documents that are more than one analysis's result: what `simulate`,
//! `tune`, `doctor`, `report` and `oom` print with `--json` and what Python's
//! methods of the same names return. Built here once, for both.

use crate::analysis::peak::AnalysedSet;
use crate::analysis::sites::{Site, SiteIndex};
use crate::doctor::{Diagnosis, DoctorOptions, Finding};
use crate::oom::{OomOptions, OomReport};
use crate::replay::limits::{with_inferred, RunLimits};
use crate::replay::simulate::{simulate, SimulateOptions, SimulationResult};
use crate::replay::tune::{tune, TuneResult};
use crate::replay::{replay_device, ReplayOptions};
use crate::{Error, Result, Snapshot};
use serde::Serialize;
use std::path::Path;

pub use crate::analysis::state::pick_device;

/// `memlens simulate --json`: the what-if result, where it first failed, and
/// what the recorded run did.
#[derive(Clone, Debug, Serialize)]
pub struct SimulateDoc {
    /// The snapshot's file name.
    pub snapshot: String,
    /// The simulation.
    #[serde(flatten)]
    pub result: SimulationResult,
    /// Trace index of the first simulated OOM.
    pub first_oom_index: Option<usize>,
    /// Where the first simulated OOM was allocated.
    pub first_oom_site: Option<Site>,
    /// What the recorded run did, for comparison.
    pub recorded: Recorded,
    /// The limits the simulation ran under: given by flags or inferred from
    /// the run (value and source each).
    pub limits: RunLimits,
}

/// What the recorded run did, beside a simulation.
#[derive(Clone, Debug, Serialize)]
pub struct Recorded {
    /// The recorded settings in `PYTORCH_CUDA_ALLOC_CONF` syntax (empty: defaults).
    pub config: String,
    /// Peak reserved bytes of the replay under the recorded settings.
    pub peak_reserved_bytes: u64,
    /// Peak allocated bytes of that replay.
    pub peak_allocated_bytes: u64,
    /// OOMs in that replay: its failed allocations less the `oom` entries
    /// PyTorch caught itself ([`crate::Snapshot::oom_caught_by_pytorch`]),
    /// as the simulation's `num_ooms` counts them.
    pub num_ooms: u64,
}

/// Simulates `device` of `snap` (named `name`) under `opts` and builds the document.
pub fn simulate_doc(
    snap: &Snapshot,
    name: &str,
    device: u32,
    opts: &SimulateOptions,
) -> Result<SimulateDoc> {
    // The limits memlens.record wrote beside the snapshot, if it did.
    let recorded = crate::device_file::limits_beside(Path::new(name), device);
    let (opts, limits) = with_inferred(snap, device, opts, recorded.as_ref());
    let result = simulate(snap, device, &opts)?;
    let recorded = replay_device(snap, device, &ReplayOptions::default());
    let site = result.first_oom.map(|o| {
        let index = SiteIndex::new(snap);
        Site::of(snap, &index, o.stack)
    });
    Ok(SimulateDoc {
        snapshot: name.to_string(),
        first_oom_index: result.first_oom.map(|o| o.event_index),
        first_oom_site: site,
        recorded: Recorded {
            config: crate::replay::config::recorded_config(&snap.settings).to_conf_string(),
            peak_reserved_bytes: recorded.peak_reserved_bytes,
            peak_allocated_bytes: recorded.peak_allocated_bytes,
            num_ooms: recorded.stats.num_ooms.saturating_sub(
                snap.device_trace(device)
                    .iter()
                    .filter(|e| snap.oom_caught_by_pytorch(e))
                    .count() as u64,
            ),
        },
        result,
        limits,
    })
}

/// `memlens tune --json`: the ranked settings of one snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct TuneDoc {
    /// The snapshot's file name.
    pub snapshot: String,
    /// The ranking.
    #[serde(flatten)]
    pub result: TuneResult,
    /// The limits every candidate ran under: given by flags or inferred from
    /// the run (value and source each).
    pub limits: RunLimits,
}

/// Ranks the usual settings on `device` of `snap` (named `name`).
pub fn tune_doc(
    snap: &Snapshot,
    name: &str,
    device: u32,
    opts: &SimulateOptions,
) -> Result<TuneDoc> {
    // The limits memlens.record wrote beside the snapshot, if it did.
    let recorded = crate::device_file::limits_beside(Path::new(name), device);
    let (opts, limits) = with_inferred(snap, device, opts, recorded.as_ref());
    Ok(TuneDoc {
        snapshot: name.to_string(),
        result: tune(snap, device, &opts)?,
        limits,
    })
}

/// `memlens doctor --json`: the findings, the report written (if any) and the
/// whole diagnosis.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorDoc {
    /// The findings, most serious first (also inside `diagnosis`).
    pub findings: Vec<Finding>,
    /// The HTML report written, if one was.
    pub report: Option<String>,
    /// The ranks side by side, when the inputs are the ranks of one job (at
    /// the top level, as the contract has it; also in `diagnosis.ranks`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<crate::analysis::ranks::RankRow>>,
    /// Every analysis behind the findings.
    pub diagnosis: Diagnosis,
    /// One line for each file beside the snapshots that could not be used
    /// (a bad holders file): for the command line to print, not part of the
    /// document.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Diagnoses the snapshots of one run and, when `report` names a path, writes
/// the HTML report there.
pub fn doctor_doc(
    snaps: &[(String, &Snapshot)],
    opts: &DoctorOptions,
    report: Option<&Path>,
) -> Result<DoctorDoc> {
    // One analysed trace per snapshot, for the diagnosis and its report.
    doctor_doc_in(&AnalysedSet::new(snaps), snaps, opts, report)
}

/// [`doctor_doc`] with the analysed traces of `set` (the snapshots as read,
/// with their replays beside the reader), kept there for whoever writes the
/// report afterwards ([`crate::report::write_report_in`]).
pub fn doctor_doc_in<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    opts: &DoctorOptions,
    report: Option<&Path>,
) -> Result<DoctorDoc> {
    let mut diagnosis = crate::doctor::diagnose_inputs_in(set, snaps, opts);
    let sources = crate::source::SourceFinder::with_env(opts.source_roots.clone());
    let run = crate::source::RunEvidence::of(snaps);
    diagnosis.leaks.annotate(&sources, &run);
    for part in &mut diagnosis.parts {
        part.diagnosis.leaks.annotate(&sources, &run);
    }
    diagnosis.annotate_findings(&sources);
    let report = match report {
        Some(path) => {
            crate::report::write_report_in(set, snaps, &diagnosis, path)?;
            Some(path.display().to_string())
        }
        None => None,
    };
    let mut doc = DoctorDoc::new(diagnosis, run.holders.warnings);
    doc.report = report;
    Ok(doc)
}

impl DoctorDoc {
    /// The document of `diagnosis` (its findings and ranks at the top level,
    /// as the contract has them), with no report yet.
    pub fn new(diagnosis: Diagnosis, warnings: Vec<String>) -> DoctorDoc {
        DoctorDoc {
            findings: diagnosis.findings.clone(),
            report: None,
            ranks: diagnosis.ranks.as_ref().map(|r| r.ranks.clone()),
            diagnosis,
            warnings,
        }
    }
}

/// `memlens report --json`: the path written.
#[derive(Clone, Debug, Serialize)]
pub struct ReportDoc {
    /// The HTML report written.
    pub report: String,
}

/// Diagnoses the snapshots of one run and writes the HTML report to `path`.
pub fn report_doc(snaps: &[(String, &Snapshot)], path: &Path) -> Result<ReportDoc> {
    report_doc_in(&AnalysedSet::new(snaps), snaps, path)
}

/// [`report_doc`] with the analysed traces of `set`.
pub fn report_doc_in<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    path: &Path,
) -> Result<ReportDoc> {
    let d = crate::doctor::diagnose_inputs_in(set, snaps, &DoctorOptions::default());
    crate::report::write_report_in(set, snaps, &d, path)?;
    Ok(ReportDoc {
        report: path.display().to_string(),
    })
}

/// `memlens oom SNAP --json`: the OOM the trace holds. A snapshot without one
/// is an error naming the file (exit 2 on the CLI, `MemlensError` in Python):
/// there is nothing to explain, and an empty document would read as an answer.
pub fn oom_doc(snap: &Snapshot, name: &str, opts: &OomOptions) -> Result<OomReport> {
    let opts = with_recorded_device(opts, name);
    no_oom_is_an_error(
        crate::oom::analyze_snapshot(snap, &opts)?,
        name,
        snap.oom_entries_caught_by_pytorch().count(),
    )
}

/// `opts` with what `memlens.record` wrote beside the snapshot `name`
/// ([`crate::device_file`]), unless the caller gave it already.
fn with_recorded_device(opts: &OomOptions, name: &str) -> OomOptions {
    let mut opts = opts.clone();
    if opts.recorded.is_empty() {
        opts.recorded = crate::device_file::beside(Path::new(name)).unwrap_or_default();
    }
    opts
}

/// [`oom_doc`] of a snapshot analysed already.
pub fn oom_doc_analysed(
    an: &crate::trace::Analysed<'_>,
    name: &str,
    opts: &OomOptions,
) -> Result<OomReport> {
    let opts = with_recorded_device(opts, name);
    let report = crate::oom::snapshot::analyze_analysed(an, &opts)?;
    no_oom_is_an_error(
        report,
        name,
        an.snap.oom_entries_caught_by_pytorch().count(),
    )
}

fn no_oom_is_an_error(report: Option<OomReport>, name: &str, caught: usize) -> Result<OomReport> {
    report.ok_or_else(|| {
        let why = match caught {
            0 => "no `oom` event".to_string(),
            n => format!(
                "its {n} `oom` entries are cuDNN convolution workspaces that PyTorch gave up to \
                 run the convolution with another algorithm, not failures of the program"
            ),
        };
        Error::usage(format!(
            "{name}: the trace holds no OOM ({why}): dump the snapshot in the `except \
             torch.OutOfMemoryError` handler with the trace recording on, or pass the error text \
             with --message"
        ))
    })
}

/// `memlens estimate --json`: the estimate, then the fit on a device and the
/// comparison with a measurement when asked.
#[derive(Clone, Debug, Serialize)]
pub struct EstimateDoc {
    /// The estimate.
    #[serde(flatten)]
    pub estimate: crate::estimate::Estimate,
    /// The fit on a device (`--device-memory`).
    #[serde(flatten)]
    pub fit: Option<crate::estimate::Fit>,
    /// The comparison with a measurement (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<crate::estimate::Comparison>,
    /// Why the peak is what it is, and the other settings beside it.
    pub explanation: crate::estimate::Explanation,
}

/// Estimates the model under `opts`, fits it on `device_memory` bytes when
/// given and compares it with `measured` when given.
pub fn estimate_doc(
    spec: &crate::estimate::ModelSpec,
    checkpoint: Option<&crate::estimate::Checkpoint>,
    opts: &crate::estimate::Options,
    device_memory: Option<u64>,
    measured: Option<&crate::estimate::MeasuredMemory>,
) -> Result<EstimateDoc> {
    let estimate = crate::estimate::estimate(spec, checkpoint, opts)?;
    let fit = device_memory
        .map(|d| crate::estimate::fit(spec, opts, &estimate, d))
        .transpose()?;
    let compare = measured.map(|m| crate::estimate::compare(&estimate, m));
    let explanation = crate::estimate::explain(spec, opts, &estimate)?;
    Ok(EstimateDoc {
        estimate,
        fit,
        compare,
        explanation,
    })
}
