//! `memlens doctor`: every analysis that applies, reduced to the few findings
//! that matter, most serious first, each with its `file:line` and its fix.

use crate::analysis::inputs::{self as grouping, base_name, Group, GroupKind};
use crate::analysis::leaks::{self, Confidence, LeakReport};
use crate::analysis::peak::{
    peak_and_live_later, AnalysedLater, AnalysedSet, AnalysedSource, PeakReport,
};
use crate::analysis::ranks::{self, RanksReport};
use crate::analysis::summary::{summarize_with, Summary};
use crate::replay::config::recorded_config;
use crate::replay::observe::RecordedRun;
use crate::replay::simulate::SimulateOptions;
use crate::replay::tune::TuneResult;
use crate::snapshot::{Action, Snapshot, TraceEvent};
use crate::units::format_bytes;
use serde::{Deserialize, Serialize};

/// How much a finding matters (ordered: `Info` < `Warning` < `Critical`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing.
    #[default]
    Info,
    /// Costs memory; worth fixing.
    Warning,
    /// A leak or an OOM: fix first.
    Critical,
}

/// One finding of the diagnosis, as the terminal, the JSON and the HTML
/// report show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Finding {
    /// `leak`, `oom`, `fragmentation`, `peak`, `snapshot`, `capture`, `info` (the device's
    /// account), `imbalance` or `workspaces` (cuDNN workspaces given up).
    pub kind: String,
    /// How much it matters.
    pub severity: Severity,
    /// One line for people.
    pub title: String,
    /// The user's `file:line`, when there is one.
    pub site: Option<String>,
    /// The bytes at stake.
    pub bytes: Option<u64>,
    /// What to change (named as in `leaks`).
    pub suggestion: Option<String>,
    /// The numbers behind it.
    pub evidence: Vec<String>,
    /// The stack of the site, innermost first.
    pub stack: Vec<String>,
    /// The site's line (and for a leak the line keeping it alive) when the
    /// source is readable (`source` and `keeper` in JSON); filled by
    /// [`annotate_findings`].
    #[serde(flatten)]
    pub quote: crate::source::SourceQuote,
}

/// Fills the source of every finding with a site from the user's files.
/// A leak finding takes the quote of its leak in `leaks` (annotated
/// already, [`LeakReport::annotate`]: its line, keeper and holders), so
/// `doctor` and `leaks` say the same and nothing is searched twice.
pub fn annotate_findings(
    findings: &mut [Finding],
    leaks: &[&LeakReport],
    sources: &crate::source::SourceFinder,
) {
    for f in findings {
        let Some(site) = f.site.as_deref() else {
            continue;
        };
        f.quote = if f.kind == "leak" {
            leaks
                .iter()
                .flat_map(|r| &r.leaks)
                .find(|l| l.site == site)
                .map(|l| l.quote.clone())
                .unwrap_or_default()
        } else {
            crate::source::SourceQuote {
                source: sources.quote(site),
                ..Default::default()
            }
        };
    }
}

/// What `doctor` can be told about the device.
#[derive(Clone, Debug, Default)]
pub struct DoctorOptions {
    /// Total memory of the GPU, for OOM predictions in `tune`.
    pub device_memory: Option<u64>,
    /// Where to look for the user's source files when the frames' own paths
    /// are not readable here (with `MEMLENS_SOURCE_ROOT`), to quote lines.
    pub source_roots: Vec<std::path::PathBuf>,
    /// Take every input process to be a rank of one job (`--ranks`), whatever
    /// their times and names say.
    pub ranks: bool,
}

/// The whole diagnosis.
#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    /// Findings, most serious first.
    pub findings: Vec<Finding>,
    /// The state at dump time of the last snapshot.
    pub summary: Summary,
    /// Peaks and what was live at them (last snapshot).
    pub peak: PeakReport,
    /// The leak search (across snapshots when several were given).
    pub leaks: LeakReport,
    /// Allocator settings ranked, when fragmentation or an OOM made them matter.
    pub tune: Option<TuneResult>,
    /// Why the allocation failed and what would fix it, when the trace holds an OOM.
    pub oom: Option<crate::oom::OomReport>,
    /// What was live at the peak by module (last snapshot; `peak --by module`).
    pub modules: Option<crate::analysis::modules::ModuleReport>,
    /// The files the fields above describe, oldest first (the last one's
    /// peak, state and timeline).
    pub files: Vec<String>,
    /// How several inputs were taken (a time series, the ranks of one job,
    /// unrelated runs) and why; absent for one file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Inputs>,
    /// The peaks (allocated, reserved bytes) of each snapshot of a run given
    /// as several, oldest first (the report's overview); empty for one.
    #[serde(skip)]
    pub snapshot_peaks: Vec<(u64, u64)>,
    /// The ranks side by side, when the inputs are the ranks of one job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<RanksReport>,
    /// What FSDP holds at the peak (gathered parameters by module, its
    /// collectives' buffers), when the peak holds anything of FSDP's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsdp: Option<crate::analysis::fsdp::FsdpReport>,
    /// The device's used memory reconciled with PyTorch's, from the figures
    /// `memlens.record` wrote beside the last snapshot ([`crate::device_file`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::device_file::DeviceAccount>,
    /// Each rank's (or each unrelated run's) own diagnosis; the fields above
    /// (summary, peak, leaks, tune, oom) are those of the rank closest to an
    /// OOM, or of the first run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
}

impl Diagnosis {
    /// Fills the source of its findings ([`annotate_findings`]) from its
    /// leaks and its parts' leaks, annotated already.
    pub fn annotate_findings(&mut self, sources: &crate::source::SourceFinder) {
        let leaks: Vec<&LeakReport> = std::iter::once(&self.leaks)
            .chain(self.parts.iter().map(|p| &p.diagnosis.leaks))
            .collect();
        annotate_findings(&mut self.findings, &leaks, sources);
    }

    /// The verdict in one sentence, as the terminal and the report both
    /// print it: a healthy run is told so plainly.
    pub fn verdict(&self) -> String {
        let serious = self
            .findings
            .iter()
            .filter(|f| f.severity > Severity::Info)
            .count();
        if self.inputs.as_ref().is_some_and(|i| i.kind == "runs") {
            return format!(
                "Verdict: {serious} problem{} over {} runs; each run's own below.",
                if serious == 1 { "" } else { "s" },
                self.parts.len()
            );
        }
        match serious {
            0 => "Verdict: no leak, no OOM, no fragmentation worth fixing.".to_string(),
            1 => "Verdict: 1 problem.".to_string(),
            n => format!("Verdict: {n} problems."),
        }
    }
}

/// What several inputs were taken to be.
#[derive(Clone, Debug, Serialize)]
pub struct Inputs {
    /// `series`, `ranks` or `runs` (unrelated runs, analysed one by one).
    pub kind: String,
    /// One line for people: what and why.
    pub reason: String,
}

/// The diagnosis of one rank, or of one of several unrelated runs.
#[derive(Clone, Debug, Serialize)]
pub struct Part {
    /// `rank N`, or the run's (last) file name.
    pub label: String,
    /// The rank, for a part of a job.
    pub rank: Option<u32>,
    /// Its files, oldest first.
    pub files: Vec<String>,
    /// Its own diagnosis.
    pub diagnosis: Diagnosis,
}

/// Share of reserved memory at the peak that, when free but unusable,
/// counts as fragmentation worth a finding.
const FRAGMENTATION_SHARE: f64 = 0.20;

/// The result of a scoped thread (its panic goes on in the caller).
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Runs every analysis that applies to the snapshots of one run (the last is
/// the one whose peak and state are reported).
pub fn diagnose(snaps: &[(String, &Snapshot)], opts: &DoctorOptions) -> Diagnosis {
    diagnose_in(&AnalysedSet::new(snaps), snaps, opts)
}

/// [`diagnose`] with the analysed traces of `set` (built there once, for
/// whoever needs them next: the report).
pub fn diagnose_in<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    opts: &DoctorOptions,
) -> Diagnosis {
    static NO_SNAPSHOT: std::sync::LazyLock<Snapshot> = std::sync::LazyLock::new(Snapshot::default);
    let last: &'s Snapshot = snaps.last().map_or(&*NO_SNAPSHOT, |(_, s)| *s);
    // One analysis of the last snapshot serves the peak, the leak search and
    // the module tree. The peak's replay (the allocator model over the whole
    // trace) is the longest part: it runs on a thread of its own from the
    // start, while this one builds the analysed trace (which the replay
    // picks up when it is ready) and the leak search; the summary needs
    // neither and takes a third.
    let own = AnalysedLater::new();
    let later = set.later(last).unwrap_or(&own);
    let (analysed, (peak, live_at_peak), summary, leaks, checkpointing) =
        std::thread::scope(|scope| {
            let replay = scope.spawn(|| peak_and_live_later(last, later, 20));
            let summary = scope.spawn(|| summarize_with(last, later.pending()));
            // Its simulations beside the rest (only on recordings that name
            // their modules), on the peak's replay of the trace.
            let checkpointing = scope.spawn(|| checkpoint_advice(last, later.recorded()));
            let analysed = later.build(last);
            let leaks = leaks::find_analysed(snaps, analysed);
            (
                analysed,
                joined(replay),
                joined(summary),
                leaks,
                joined(checkpointing),
            )
        });
    let oom = oom_event(last, &summary);
    let fragmented = fragmentation_slack(&peak).is_some();
    // One replay of the run under its recorded settings serves the OOM
    // (the state it met) and the what-ifs (where empty_cache() was called).
    let run = (oom.is_some() || fragmented)
        .then(|| recorded_run_for(later.recorded(), last, oom.map(|o| o.0)));
    // What memlens.record wrote beside the last snapshot, read once: the
    // OOM, the settings ranking and the device's account use it.
    let recorded = snaps.last().map_or_else(Vec::new, |(n, _)| {
        crate::device_file::beside(std::path::Path::new(n)).unwrap_or_default()
    });
    let oom_report = oom.and_then(|_| explain_oom(analysed, &recorded, run.as_ref(), opts));
    // Settings change how allocations are placed: a trace without any (a
    // legacy dump's one `oom` entry) gives every setting the same figures.
    let tune = run
        .as_ref()
        .filter(|_| last.has_allocation_trace())
        .and_then(|run| tune_run(last, &recorded, run, opts));

    let mut findings = leak_findings(&leaks);
    findings.extend(oom.map(|(_, e)| oom_finding(&e, oom_report.as_ref())));
    findings.extend(fragmentation_finding(
        &peak,
        &summary,
        tune.as_ref(),
        oom_report.as_ref(),
    ));
    findings.extend(peak_finding(&peak, checkpointing.as_deref()));
    findings.extend(workspaces_finding(analysed));
    findings.extend(caveat_findings(&summary, &peak));
    findings.extend(summary.capture_checks.iter().map(capture_finding));
    findings.extend(
        recording_stopped(last, analysed, peak.device)
            .as_ref()
            .map(capture_finding),
    );
    let device = crate::device_file::of_device(&recorded, peak.device)
        .and_then(crate::device_file::RecordedDevice::account);
    findings.extend(device.as_ref().map(device_finding));
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let fsdp = live_at_peak
        .as_ref()
        .and_then(|live| crate::analysis::fsdp::fsdp_of_live(analysed, live.trace, &live.blocks));
    findings.extend(fsdp.as_ref().map(fsdp_finding));
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let modules = live_at_peak.map(|live| {
        let finder = crate::source::SourceFinder::with_env(opts.source_roots.clone());
        crate::analysis::modules::modules_of_live(
            analysed,
            live.trace,
            peak.peak_event_index,
            &live.blocks,
            live.allocated,
            &finder,
        )
    });
    Diagnosis {
        findings,
        snapshot_peaks: snapshot_peaks(set, snaps, &peak),
        summary,
        peak,
        leaks,
        tune,
        oom: oom_report,
        modules,
        files: snaps.iter().map(|(n, _)| n.clone()).collect(),
        inputs: None,
        ranks: None,
        fsdp,
        device,
        parts: Vec::new(),
    }
}

/// The `fsdp` finding: a warning when more FSDP units hold their gathered
/// parameters at the peak than computing and prefetching need (resharding
/// after forward is off), with what resharding would free; else what FSDP
/// holds there, by module, for information.
fn fsdp_finding(r: &crate::analysis::fsdp::FsdpReport) -> Finding {
    let f = crate::units::format_bytes;
    let units: Vec<String> = r
        .gathered_units
        .iter()
        .map(|u| format!("{} {}", u.module, f(u.bytes)))
        .collect();
    let modules = crate::analysis::fsdp::module_list(&r.gathered_units);
    let mut evidence = vec![format!(
        "gathered parameters of {} unit(s) live at the peak, {} in all: {}",
        r.gathered_units.len(),
        f(r.gathered_bytes),
        if units.is_empty() {
            "none".into()
        } else {
            units.join(", ")
        }
    )];
    evidence.push(format!(
        "all-gather buffers {}, reduce-scatter buffers {}",
        f(r.all_gather_buffer_bytes),
        f(r.reduce_scatter_bytes)
    ));
    if !r.reshard_after_forward_off {
        return Finding {
            kind: "fsdp".into(),
            severity: Severity::Info,
            title: format!(
                "FSDP at the peak: gathered parameters {} ({}), reduce-scatter buffers {}, all-gather buffers {}",
                f(r.gathered_bytes),
                if units.is_empty() { "no unit".into() } else { modules },
                f(r.reduce_scatter_bytes),
                f(r.all_gather_buffer_bytes)
            ),
            bytes: Some(r.gathered_bytes + r.reduce_scatter_bytes + r.all_gather_buffer_bytes),
            evidence,
            ..Finding::default()
        };
    }
    // What resharding frees: all but the two largest units' gathered parameters.
    let mut sizes: Vec<u64> = r.gathered_units.iter().map(|u| u.bytes).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let kept: u64 = sizes.iter().take(crate::analysis::fsdp::UNITS_NEEDED).sum();
    let freed = r.gathered_bytes.saturating_sub(kept);
    let in_forward = r.gathered_units.iter().filter(|u| u.in_forward).count();
    evidence.push(format!(
        "{in_forward} of them gathered in their module's forward and still held: FSDP reshards a unit after its forward only with reshard_after_forward=True"
    ));
    Finding {
        kind: "fsdp".into(),
        severity: Severity::Warning,
        title: format!(
            "FSDP: {} units hold their gathered parameters at the peak ({}: {modules}): resharding after forward is off",
            r.gathered_units.len(),
            f(r.gathered_bytes)
        ),
        bytes: Some(freed),
        suggestion: Some(format!(
            "reshard after forward: `fully_shard(module, reshard_after_forward=True)` (FSDP2's default; FSDP1: \
             `sharding_strategy=ShardingStrategy.FULL_SHARD`, not `SHARD_GRAD_OP`) frees each unit's gathered \
             parameters after its forward and gathers them again in backward (one more all-gather a unit): \
             up to {} less at the peak, all but the {} units computing and prefetched",
            f(freed),
            crate::analysis::fsdp::UNITS_NEEDED
        )),
        evidence,
        ..Finding::default()
    }
}

/// "nvidia-smi shows X = PyTorch reserved + outside PyTorch + other
/// processes + the driver + unexplained": the answer to "why does
/// nvidia-smi show more than memory_reserved()?".
fn device_finding(a: &crate::device_file::DeviceAccount) -> Finding {
    let f = crate::units::format_bytes;
    let signed = crate::units::format_signed_bytes;
    let unexplained = signed(a.unexplained_bytes);
    // What was outside PyTorch when recording began is the CUDA context and
    // the libraries; what came since, the NCCL communicators, workspaces and
    // other allocators of the run.
    let outside = match (
        a.outside_pytorch_at_start_bytes,
        a.outside_pytorch_since_start_bytes,
    ) {
        (Some(start), Some(since)) => format!(
            "{} outside PyTorch in this process ({} when recording began: the CUDA context and \
             libraries; {} since: NCCL, cuBLAS workspaces, CUDA graphs' and other allocators' \
             memory)",
            f(a.outside_pytorch_bytes),
            f(start),
            signed(since)
        ),
        _ => format!(
            "{} outside PyTorch in this process (CUDA context, cuBLAS/cuDNN, NCCL, other \
             allocators)",
            f(a.outside_pytorch_bytes)
        ),
    };
    Finding {
        kind: "info".into(),
        severity: Severity::Info,
        title: {
            // NVML v1 counts the driver's reserve in "used"; v2, as
            // nvidia-smi, gives it apart.
            let (who, driver, after) = if a.driver_in_used {
                ("NVML counts", format!(" + {} kept by the driver", f(a.driver_bytes)), String::new())
            } else {
                ("nvidia-smi shows", String::new(), format!("; the driver reserves {} besides", f(a.driver_bytes)))
            };
            format!(
                "{who} {} used on cuda:{} = PyTorch reserved {} + {outside} + {} other \
                 processes{driver} + {unexplained} unexplained{after}",
                f(a.nvidia_smi_used_bytes),
                a.device,
                f(a.pytorch_reserved_bytes),
                f(a.other_processes_bytes),
            )
        },
        site: None,
        bytes: Some(a.nvidia_smi_used_bytes),
        suggestion: None,
        evidence: vec![
            "figures written beside the snapshot by memlens.record at the dump (NVML and torch.cuda)"
                .into(),
        ],
        stack: Vec::new(),
        quote: Default::default(),
    }
}

/// The OOM every command explains (the last one of the first trace that has
/// one: [`crate::oom::chosen_oom`]), as (trace, event), and its event. The
/// summary counted every action: without an `oom` there is no trace of
/// millions of events to search backwards for one.
fn oom_event(last: &Snapshot, summary: &Summary) -> Option<((usize, usize), TraceEvent)> {
    summary
        .trace_events_by_action
        .contains_key(Action::Oom.as_str())
        .then(|| crate::oom::chosen_oom(last))
        .flatten()
        .map(|(t, i)| ((t, i), last.traces[t].events[i]))
}

/// The reserved memory at the reserved peak that held no tensor, when it is
/// enough to call fragmentation.
fn fragmentation_slack(peak: &PeakReport) -> Option<u64> {
    let slack = peak
        .peak_reserved_bytes
        .saturating_sub(peak.peak_allocated_bytes);
    (peak.peak_reserved_bytes > 0
        && slack as f64 > FRAGMENTATION_SHARE * peak.peak_reserved_bytes as f64
        && slack > 512 << 20)
        .then_some(slack)
}

/// The one replay of `last`'s run under its recorded settings, on the device
/// `tune` simulates, watching the OOM at `oom` (trace, event) when it is on
/// that device.
fn recorded_run_for(
    passes: &crate::replay::during_read::RecordedPasses,
    last: &Snapshot,
    oom: Option<(usize, usize)>,
) -> RecordedRun {
    let device = last.first_traced_device();
    let watch = oom.filter(|&(t, _)| last.traces[t].device == device);
    crate::replay::observe::recorded_run_in(passes, last, device, watch.map(|(_, i)| i))
}

/// Why the allocation failed and what would fix it, from the replay `run`
/// already made when it watched the OOM.
fn explain_oom(
    analysed: &crate::trace::Analysed<'_>,
    recorded: &[crate::device_file::RecordedDevice],
    run: Option<&RecordedRun>,
    opts: &DoctorOptions,
) -> Option<crate::oom::OomReport> {
    let o = crate::oom::OomOptions {
        device_memory: opts.device_memory,
        // The total and the cap memlens.record wrote beside the snapshot.
        recorded: recorded.to_vec(),
        ..Default::default()
    };
    crate::oom::snapshot::analyze_observed(analysed, run, &o)
        .ok()
        .flatten()
}

/// The allocator settings ranked on `run`'s device, under the limits the run
/// had (`recorded` beside the snapshot, else inferred from its OOM), as
/// `memlens tune` does: a setting that fails there is no fix.
fn tune_run(
    last: &Snapshot,
    recorded: &[crate::device_file::RecordedDevice],
    run: &RecordedRun,
    opts: &DoctorOptions,
) -> Option<TuneResult> {
    let sim = SimulateOptions {
        config: recorded_config(&last.settings),
        device_memory: opts.device_memory,
        overhead: None,
        allowed_memory_maximum: None,
    };
    let recorded = crate::device_file::of_device(recorded, run.device)
        .map(crate::device_file::RecordedDevice::limits);
    let (sim, _) = crate::replay::limits::with_inferred_from(
        last,
        run.device,
        &sim,
        recorded.as_ref(),
        run.initial.as_deref(),
    );
    let prep = crate::replay::simulate::Prepared::from_run(last, run);
    crate::replay::tune::tune_prepared(last, &sim, &prep).ok()
}

/// The leak findings: the two likeliest candidates of medium confidence or
/// more.
fn leak_findings(leaks: &LeakReport) -> Vec<Finding> {
    let mut findings = Vec::new();
    for l in leaks
        .leaks
        .iter()
        .filter(|l| l.confidence >= Confidence::Medium)
        .take(2)
    {
        findings.push(Finding {
            kind: "leak".into(),
            severity: if l.confidence == Confidence::High {
                Severity::Critical
            } else {
                Severity::Warning
            },
            title: format!(
                "Leak: {} per step at {}",
                format_bytes(l.bytes_per_step),
                l.display()
            ),
            site: Some(l.site.clone()),
            bytes: Some(l.bytes_per_step),
            suggestion: Some(l.suggestion.clone()),
            evidence: l
                .library_line()
                .into_iter()
                .chain([format!(
                    "live bytes at {}: {}",
                    l.evidence_labels
                        .first()
                        .map(String::as_str)
                        .unwrap_or("each point"),
                    // The ends only: the whole series is in the JSON (`leaks`).
                    match (l.evidence.first(), l.evidence.last()) {
                        (Some(a), Some(b)) => format!(
                            "{} -> {} over {} points",
                            format_bytes(*a),
                            format_bytes(*b),
                            l.evidence.len()
                        ),
                        _ => "none".to_string(),
                    }
                )])
                .collect(),
            stack: l.stack.clone(),
            quote: Default::default(),
        });
    }

    findings
}

/// The OOM finding: the cause and the list's first fix (or, when the
/// snapshot could not be analysed, what the event says).
fn oom_finding(e: &TraceEvent, oom_report: Option<&crate::oom::OomReport>) -> Finding {
    let (title, fix, evidence) = match oom_report {
        Some(r) => {
            let best = r.lead_fix();
            (
                format!(
                    "CUDA out of memory ({}): a {} block could not be had",
                    r.cause,
                    format_bytes(r.tried_to_allocate_bytes)
                ),
                best.map(|f| f.action.clone()),
                vec![r.explanation.clone()],
            )
        }
        None => (
            format!(
                "CUDA out of memory: a {} allocation failed with {} free on the device",
                format_bytes(e.size),
                format_bytes(e.addr)
            ),
            Some("run `memlens oom` on this snapshot for the cause and the fixes".into()),
            Vec::new(),
        ),
    };
    Finding {
        kind: "oom".into(),
        severity: Severity::Critical,
        title,
        site: oom_report.map(|r| r.site.clone()),
        bytes: Some(e.size),
        suggestion: fix,
        evidence,
        stack: oom_report
            .as_ref()
            .map(|r| r.stack.clone())
            .unwrap_or_default(),
        quote: Default::default(),
    }
}

/// The fragmentation finding, when reserved memory at the peak held no
/// tensor; beside an OOM it leads with the OOM's own first fix.
fn fragmentation_finding(
    peak: &PeakReport,
    summary: &Summary,
    tune: Option<&TuneResult>,
    oom_report: Option<&crate::oom::OomReport>,
) -> Option<Finding> {
    let slack = fragmentation_slack(peak)?;
    let best = tune.and_then(|t| t.candidates.first());
    // Compare with the simulation of the recorded settings, as the tune
    // table does: the trace's own peak may differ from its simulation, and
    // a verdict against one above a table against the other contradicts.
    let current = tune
        .and_then(|t| t.candidates.iter().find(|c| c.recorded))
        .map_or(peak.peak_reserved_bytes, |c| c.peak_reserved_bytes);
    // Beside an OOM, the one advice list speaks: the fragmentation
    // finding leads with the OOM's own first fix, not a second opinion.
    let lead = oom_report.and_then(|r| r.lead_fix());
    let fix = match best {
        _ if lead.is_some() => lead.map(|f| f.action.clone()).unwrap_or_default(),
        Some(b) if b.num_ooms > 0 => format!(
            "no allocator setting simulated here avoids the OOM under the run's limits (the \
             best, {}, still fails); make the failing step smaller or raise the limit",
            if b.config.is_empty() { "the defaults" } else { &b.config }
        ),
        Some(b) if b.peak_reserved_bytes + (64 << 20) < current && !b.config.is_empty() => format!(
            "PYTORCH_CUDA_ALLOC_CONF={} would reserve {} at the peak instead of {} (both simulated)",
            b.config,
            format_bytes(b.peak_reserved_bytes),
            format_bytes(current)
        ),
        _ => "no allocator setting simulated here does better; reduce the variety of tensor shapes (pad or bucket sequence lengths)".into(),
    };
    Some(Finding {
        kind: "fragmentation".into(),
        severity: Severity::Warning,
        title: format!(
            "Fragmentation: {} of {} reserved at the peak held no tensor ({:.0}%)",
            format_bytes(slack),
            format_bytes(peak.peak_reserved_bytes),
            100.0 * slack as f64 / peak.peak_reserved_bytes as f64
        ),
        site: None,
        bytes: Some(slack),
        suggestion: Some(fix),
        evidence: vec![format!(
            "now: {} free in segments, {} of it non-releasable (inactive split), largest free block {}",
            format_bytes(summary.external_fragmentation_bytes),
            format_bytes(summary.inactive_split_bytes),
            format_bytes(summary.largest_free_block_bytes)
        )],
        stack: Vec::new(),
        quote: Default::default(),
    })
}

/// The peak finding: the peak and its largest holder, always when anything
/// was allocated.
/// Trace events past which doctor does not simulate checkpointing on its
/// own (`memlens fit --checkpoint` still does): the rewrite's replay and its
/// four runs through the allocator model (~7 M operations a second) would
/// outlast the rest of doctor on a larger trace.
const CHECKPOINT_ADVICE_MAX_EVENTS: usize = 1_000_000;

/// What checkpointing the run's repeated block would do to its peak, from
/// `memlens fit --checkpoint` (the same prediction, held to the GPU on four
/// models): a sentence for the peak finding when it lowers the allocated
/// peak by a tenth or more. `None` without module scopes (the recording
/// must name the modules), without a repeated block, or where fit cannot
/// stand the run for its step (an OOM in it). The trace's one replay is
/// `passes`' (the peak's), not one of its own.
fn checkpoint_advice(
    snap: &Snapshot,
    passes: &crate::replay::during_read::RecordedPasses,
) -> Option<String> {
    if snap.event_count() > CHECKPOINT_ADVICE_MAX_EVENTS {
        return None;
    }
    let (module, instances) = crate::fit::checkpoint::repeated_block(snap)?;
    let name = "the recording";
    let opts = crate::fit::FitOptions::default();
    let r = crate::fit::fit_checkpoint_with(name, snap, &module, &opts, passes).ok()?;
    let (before, after) = (
        r.recorded.peak_allocated_bytes,
        r.predicted.peak_allocated_bytes,
    );
    if after.saturating_mul(10) > before.saturating_mul(9) {
        return None;
    }
    Some(format!(
        "Checkpoint {module} (torch.utils.checkpoint around each of its {instances} instances; \
         in transformers, model.gradient_checkpointing_enable()): the peak falls from {} to {} \
         allocated ({} to {} reserved), simulated on this trace (memlens fit --checkpoint \
         {module})",
        format_bytes(before),
        format_bytes(after),
        format_bytes(r.recorded.peak_reserved_bytes),
        format_bytes(r.predicted.peak_reserved_bytes),
    ))
}

fn peak_finding(peak: &PeakReport, checkpointing: Option<&str>) -> Option<Finding> {
    if peak.peak_allocated_bytes == 0 {
        return None;
    }
    // The largest holder by its whole bytes: `live_at_peak` splits a site
    // by category, and the report's timeline draws the site whole, so the
    // verdict names the total (and the largest category in it).
    let site_total = |t: &crate::analysis::peak::LiveSite| -> u64 {
        peak.live_at_peak
            .iter()
            .filter(|s| s.site == t.site && s.path == t.path)
            .map(|s| s.bytes)
            .sum()
    };
    // The bytes of one category at the site: a site's rows may split one
    // category (by call path), and "of which activation 956.66 MiB" of a
    // holder whose whole 4.24 GiB is activation misled (issue 31).
    let category_total = |t: &crate::analysis::peak::LiveSite| -> u64 {
        peak.live_at_peak
            .iter()
            .filter(|s| s.site == t.site && s.path == t.path && s.category == t.category)
            .map(|s| s.bytes)
            .sum()
    };
    let top = peak
        .live_at_peak
        .iter()
        .max_by_key(|t| (site_total(t), category_total(t), t.bytes));
    Some(Finding {
        kind: "peak".into(),
        severity: Severity::Info,
        title: match top {
            Some(t) if site_total(t) > category_total(t) => format!(
                "Peak: {} allocated ({} reserved); largest holder {} ({}, of which {} {})",
                format_bytes(peak.peak_allocated_bytes),
                format_bytes(peak.peak_reserved_bytes),
                t.site,
                format_bytes(site_total(t)),
                t.category.as_str(),
                format_bytes(category_total(t))
            ),
            Some(t) => format!(
                "Peak: {} allocated ({} reserved); largest holder {} ({}, {})",
                format_bytes(peak.peak_allocated_bytes),
                format_bytes(peak.peak_reserved_bytes),
                t.site,
                t.category.as_str(),
                format_bytes(site_total(t))
            ),
            None => format!(
                "Peak: {} allocated ({} reserved)",
                format_bytes(peak.peak_allocated_bytes),
                format_bytes(peak.peak_reserved_bytes)
            ),
        },
        site: top.map(|t| t.site.clone()),
        bytes: Some(peak.peak_allocated_bytes),
        suggestion: checkpointing.map(str::to_string),
        evidence: vec![crate::trace::categories::category_mix(
            peak.categories.iter().map(|(c, b)| (c.as_str(), *b)),
        )],
        stack: top.map(|t| t.stack.clone()).unwrap_or_default(),
        quote: Default::default(),
    })
}

/// Whether recording stopped before the dump, judged on the trace of the
/// peak's device from the blocks its one replay left live at the end.
fn recording_stopped(
    snap: &Snapshot,
    analysed: &crate::trace::Analysed,
    device: u32,
) -> Option<crate::analysis::capture::CaptureCheck> {
    // A trace of `snapshot` or `oom` entries only has nothing to replay.
    if !snap
        .traces
        .iter()
        .any(|t| t.device == device && t.has_allocations())
    {
        return None;
    }
    let pass = analysed.recorded().of_device(snap, device)?;
    crate::analysis::capture::recording_stopped(snap, device, pass.live_at_end())
}

/// The cuDNN convolution workspaces PyTorch could not have and gave up (its
/// `oom` entries it caught itself, [`Snapshot::oom_caught_by_pytorch`]):
/// not an OOM, but those convolutions ran with other algorithms, which can
/// be slower. Worth knowing under a cap, where the run "fits" by giving
/// them up.
fn workspaces_finding(an: &crate::trace::Analysed) -> Option<Finding> {
    let snap = an.snap;
    let given_up: Vec<&TraceEvent> = snap.oom_entries_caught_by_pytorch().collect();
    let largest = given_up.iter().copied().max_by_key(|e| e.size)?;
    let site = an.sites.describe(largest.stack);
    Some(Finding {
        kind: "workspaces".into(),
        severity: Severity::Info,
        title: format!(
            "{} cuDNN convolution workspace request(s) could not be had (the largest {}) and were \
             given up: PyTorch ran those convolutions with other algorithms, which can be \
             slower; not an OOM",
            given_up.len(),
            format_bytes(largest.size)
        ),
        site: Some(site.site),
        bytes: Some(largest.size),
        suggestion: Some(
            "nothing to fix for memory; if these steps ran slower than without the limit, \
             leave the convolutions room for their workspaces (a higher cap or a smaller batch)"
                .into(),
        ),
        ..Default::default()
    })
}

/// A failure of the capture ([`crate::analysis::capture`]) with its fix: a
/// warning when it hides what the analyses need, else worth knowing.
fn capture_finding(c: &crate::analysis::capture::CaptureCheck) -> Finding {
    Finding {
        kind: "capture".into(),
        severity: if c.serious {
            Severity::Warning
        } else {
            Severity::Info
        },
        title: c.problem.clone(),
        suggestion: Some(c.fix.clone()),
        ..Default::default()
    }
}

/// Caveats about the snapshot itself, at most three; one finding per fact:
/// the summary and the peak both say when the trace began late, in the same
/// words, and the first says it.
fn caveat_findings(summary: &Summary, peak: &PeakReport) -> Vec<Finding> {
    let late = crate::replay::initial::LATE_START;
    let mut said_late = false;
    summary
        .warnings
        .iter()
        .chain(peak.warnings.iter())
        .filter(|w| {
            let repeat = said_late && w.starts_with(late);
            said_late |= w.starts_with(late);
            !repeat
        })
        .take(3)
        .map(|w| Finding {
            kind: "snapshot".into(),
            severity: Severity::Info,
            title: w.clone(),
            site: None,
            bytes: None,
            suggestion: None,
            evidence: Vec::new(),
            stack: Vec::new(),
            quote: Default::default(),
        })
        .collect()
}

/// Each snapshot's peaks, for the report's overview of a run given as
/// several: the last one's is `peak`; the others' come from their replay
/// beside the reader.
fn snapshot_peaks<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    peak: &PeakReport,
) -> Vec<(u64, u64)> {
    match snaps.split_last() {
        Some((_, earlier)) if !earlier.is_empty() => earlier
            .iter()
            .map(|(_, s)| crate::analysis::peak::peak_totals(s, set.fed_pass(s)))
            .chain(std::iter::once((
                peak.peak_allocated_bytes,
                peak.peak_reserved_bytes,
            )))
            .collect(),
        _ => Vec::new(),
    }
}

/// Diagnoses any inputs: tells periodic snapshots of one process (a time
/// series), the ranks of one job and unrelated runs apart
/// ([`crate::analysis::inputs`]) and diagnoses each accordingly. The result
/// does not depend on the order of `snaps`.
pub fn diagnose_inputs(snaps: &[(String, &Snapshot)], opts: &DoctorOptions) -> Diagnosis {
    diagnose_inputs_in(&AnalysedSet::new(snaps), snaps, opts)
}

/// [`diagnose_inputs`] with the analysed traces of `set` (built there once,
/// for whoever needs them next: the report).
pub fn diagnose_inputs_in<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    opts: &DoctorOptions,
) -> Diagnosis {
    let g = grouping::group(snaps, opts.ranks);
    if g.groups.len() > 1 {
        // Unrelated runs: each on its own, in the grouping's order.
        let parts: Vec<Part> = g
            .groups
            .iter()
            .map(|grp| {
                let files: Vec<String> = grp.files().iter().map(|&i| snaps[i].0.clone()).collect();
                Part {
                    label: files
                        .last()
                        .map(|f| base_name(f).to_string())
                        .unwrap_or_default(),
                    rank: None,
                    files,
                    diagnosis: diagnose_group(set, snaps, grp, opts),
                }
            })
            .collect();
        return combine(parts, "runs", g.reason, None);
    }
    let Some(first) = g.groups.first() else {
        return diagnose(&[], opts);
    };
    let mut d = diagnose_group(set, snaps, first, opts);
    if first.kind != GroupKind::Single {
        d.inputs = Some(Inputs {
            kind: match first.kind {
                GroupKind::Ranks => "ranks",
                _ => "series",
            }
            .into(),
            reason: g.reason.clone(),
        });
    }
    d
}

/// One group: a run (one snapshot or a series) or the ranks of a job.
fn diagnose_group<'s>(
    set: &AnalysedSet<'s>,
    snaps: &[(String, &'s Snapshot)],
    group: &Group,
    opts: &DoctorOptions,
) -> Diagnosis {
    let pick = |files: &[usize]| -> Vec<(String, &'s Snapshot)> {
        files
            .iter()
            .map(|&i| (snaps[i].0.clone(), snaps[i].1))
            .collect()
    };
    if group.kind != GroupKind::Ranks {
        return diagnose_in(set, &pick(&group.files()), opts);
    }
    let parts: Vec<Part> = group
        .members
        .iter()
        .map(|m| {
            let rank = m.rank.unwrap_or(0);
            Part {
                label: format!("rank {rank}"),
                rank: Some(rank),
                files: m.files.iter().map(|&i| snaps[i].0.clone()).collect(),
                diagnosis: diagnose_in(set, &pick(&m.files), opts),
            }
        })
        .collect();
    let runs: Vec<(u32, Vec<(String, &Snapshot)>)> = group
        .members
        .iter()
        .map(|m| (m.rank.unwrap_or(0), pick(&m.files)))
        .collect();
    let report = ranks::compare_runs_in(set, &runs, opts.device_memory);
    combine(parts, "ranks", String::new(), Some(report))
}

/// One diagnosis of several parts: their findings (each title prefixed with
/// the part's label, an imbalance first), the fields of the rank closest to
/// an OOM (or of the first run).
pub(crate) fn combine(
    parts: Vec<Part>,
    kind: &str,
    reason: String,
    ranks: Option<RanksReport>,
) -> Diagnosis {
    let main = ranks
        .as_ref()
        .and_then(|r| r.closest_to_oom)
        .and_then(|c| parts.iter().position(|p| p.rank == Some(c)))
        .unwrap_or(0);
    let mut findings = Vec::new();
    if let Some(im) = ranks.as_ref().and_then(imbalance_finding) {
        findings.push(im);
    }
    for p in &parts {
        for f in &p.diagnosis.findings {
            let mut f = f.clone();
            f.title = format!("{}: {}", p.label, f.title);
            findings.push(f);
        }
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let base = parts.get(main).map(|p| p.diagnosis.clone());
    let Some(base) = base else {
        return diagnose(&[], &DoctorOptions::default());
    };
    Diagnosis {
        findings,
        inputs: Some(Inputs {
            kind: kind.into(),
            reason,
        }),
        ranks,
        parts,
        ..base
    }
}

/// The `imbalance` finding: the heaviest rank, its excess over the median
/// rank, and the site holding most of it.
fn imbalance_finding(r: &RanksReport) -> Option<Finding> {
    let im = r.imbalance.as_ref()?;
    let top = im.sites.first();
    let oomed = r.ranks.iter().any(|x| x.rank == im.rank && x.oom);
    Some(Finding {
        kind: "imbalance".into(),
        severity: if oomed {
            Severity::Critical
        } else {
            Severity::Warning
        },
        title: match top {
            Some(s) => format!(
                "Imbalance: rank {} holds {} more than the median rank at its peak; {} of it at {}",
                im.rank,
                format_bytes(im.excess_bytes),
                format_bytes(s.excess_bytes),
                s.site
            ),
            None => format!(
                "Imbalance: rank {} holds {} more than the median rank at its peak",
                im.rank,
                format_bytes(im.excess_bytes)
            ),
        },
        site: top.map(|s| s.site.clone()),
        bytes: Some(top.map_or(im.excess_bytes, |s| s.excess_bytes)),
        suggestion: Some(im.suggestion.clone()),
        evidence: std::iter::once(format!(
            "peak allocated by rank: {}; median {}",
            r.ranks
                .iter()
                .map(|x| format!("{} {}", x.rank, format_bytes(x.peak_allocated_bytes)))
                .collect::<Vec<_>>()
                .join(", "),
            format_bytes(im.median_peak_bytes)
        ))
        .chain(std::iter::once(format!(
            "{} site(s) explain {} of the {} gap ({:.0}%); by category: {}",
            im.explaining_sites,
            format_bytes(im.explained_bytes),
            format_bytes(im.excess_bytes),
            100.0 * im.explained_bytes as f64 / im.excess_bytes.max(1) as f64,
            im.by_category
                .iter()
                .map(|(c, b)| format!("{c} {}", format_bytes(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        )))
        .chain(
            im.sites
                .iter()
                .take(im.explaining_sites.clamp(1, 10))
                .map(|s| {
                    format!(
                        "{}: {} on rank {} vs median {} ({})",
                        s.site,
                        format_bytes(s.bytes),
                        im.rank,
                        format_bytes(s.median_bytes),
                        s.category
                    )
                }),
        )
        .collect(),
        stack: top.map(|s| s.stack.clone()).unwrap_or_default(),
        quote: Default::default(),
    })
}
