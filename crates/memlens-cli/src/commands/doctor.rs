//! `memlens doctor`: the main job. Runs every analysis that applies to the
//! snapshots of one run, prints the verdict first (the findings that matter,
//! each with its `file:line` and fix), detail with `-v`, and writes the HTML
//! report.

use crate::output;
use memlens::analysis::peak::AnalysedSet;
use memlens::doctor::DoctorOptions;
use memlens::render::{self, documents::doctor_doc_in};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `memlens doctor`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens doctor                 (the example built into memlens)\n  memlens doctor run.pickle.zst -v       (report: run.memlens.html)\n  memlens doctor run.pickle.zst -o report.html"
)]
pub struct Args {
    /// Snapshots, folders of snapshots or quoted patterns ('runs/*.pickle'):
    /// periodic snapshots of one run, the ranks of one job (told apart by
    /// their times, devices and `rank<N>` in names), or unrelated runs, each
    /// diagnosed on its own (none: the example built into memlens).
    pub snapshots: Vec<PathBuf>,
    /// The inputs are the ranks of one job (one process each), whatever
    /// their times and names say.
    #[arg(long)]
    pub ranks: bool,
    /// Where to write the HTML report (default: beside the last snapshot,
    /// `NAME.memlens.html`; with --json, none unless given).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Replace the default report path even when memlens did not write the
    /// file there.
    #[arg(long)]
    pub force: bool,
    /// Do not write the HTML report.
    #[arg(long)]
    pub no_report: bool,
    /// Total memory of the GPU (e.g. 80GiB or H100-80GB), for OOM predictions.
    #[arg(long, value_parser = parse_device_memory)]
    pub device_memory: Option<u64>,
    /// Show the detail behind each finding.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
    /// Where to look for the source files the frames name, when their own
    /// paths are not readable here (repeatable; also MEMLENS_SOURCE_ROOT).
    #[arg(long, value_name = "DIR")]
    pub source_root: Vec<PathBuf>,
}

fn parse_device_memory(s: &str) -> Result<u64, String> {
    memlens::units::parse_device_memory(s).map_err(|e| e.to_string())
}

/// A spinner on stderr while work runs, only when a person is watching.
fn spinner(msg: &str) -> indicatif::ProgressBar {
    if !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// Runs `memlens doctor`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let pb = spinner("reading snapshots");
    let opts = DoctorOptions {
        device_memory: args.device_memory,
        source_roots: args.source_root.clone(),
        ranks: args.ranks,
    };
    // The report goes where asked; by default beside the input, never over
    // a file memlens did not write, and not at all for --json.
    let mut skipped = None;
    let report: Option<PathBuf> = match (&args.output, args.no_report, args.json) {
        (_, true, _) => None,
        (Some(p), _, _) => Some(p.clone()),
        (None, _, true) => None,
        (None, _, false) => {
            let p =
                memlens::report::default_report_path(args.snapshots.last().map(|p| p.as_path()));
            if p.exists() && !args.force && !memlens::report::written_by_memlens(&p) {
                skipped = Some(p);
                None
            } else {
                Some(p)
            }
        }
    };
    let (doc, names, not_written) = match job_ranks(&args)? {
        Some(ranks) => job(&ranks, &opts, report.as_deref(), &pb)?,
        None => together(&args, &opts, report.as_deref(), &pb)?,
    };
    pb.finish_and_clear();
    if let Some(p) = skipped {
        eprintln!(
            "memlens: no report written: {} exists and memlens did not write it (use -o FILE or --force)",
            p.display()
        );
    }
    output::print(&doc, args.json, |d| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut text = render::doctor::text(&d.diagnosis, &names, args.verbose);
        if let Some(p) = &d.report {
            text.push_str(&format!("\nReport: {p}\n"));
        }
        text
    })?;
    if let Some(e) = not_written {
        eprintln!(
            "memlens: error: the report was not written: {e} (choose where with -o FILE, or --no-report)"
        );
        return Ok(output::USAGE);
    }
    Ok(output::OK)
}

/// What a way of diagnosing gives: the document, the files' names, and the
/// error that kept the report from being written.
type Diagnosed = (
    memlens::render::documents::DoctorDoc,
    Vec<String>,
    Option<memlens::Error>,
);

/// The ranks of a job too large to read at once: every input names its rank
/// and together they are more than [`JOB_READ_AT_ONCE`] bytes (or more than
/// [`JOB_RANKS_AT_ONCE`] ranks). `MEMLENS_RANK_BY_RANK=1` takes this path for
/// any ranks named so (tests).
fn job_ranks(args: &Args) -> anyhow::Result<Option<Vec<memlens::job::RankFiles>>> {
    if args.snapshots.is_empty() || args.ranks {
        return Ok(None);
    }
    let files: Vec<PathBuf> = memlens::input::expand_found(&args.snapshots)?
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let Some(ranks) = memlens::job::ranks_by_name(&files) else {
        return Ok(None);
    };
    let forced = std::env::var("MEMLENS_RANK_BY_RANK").is_ok_and(|v| v == "1");
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    let large = bytes > JOB_READ_AT_ONCE || ranks.len() > JOB_RANKS_AT_ONCE;
    Ok((forced || large).then_some(ranks))
}

/// Inputs above this many bytes in all are read rank by rank.
const JOB_READ_AT_ONCE: u64 = 4 << 30;
/// More ranks than this are read rank by rank.
const JOB_RANKS_AT_ONCE: usize = 16;
/// The memory the ranks read at once may hold (the rest of 8 GB is the
/// outcomes kept, the report's rank read again and the allocator's slack).
const JOB_MEMORY_BUDGET: u64 = 5 << 30;

/// Diagnoses a job rank by rank ([`memlens::job`]); the report shows the
/// main rank, read again, beside every rank's series.
fn job(
    ranks: &[memlens::job::RankFiles],
    opts: &DoctorOptions,
    report: Option<&std::path::Path>,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<Diagnosed> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = memlens::job::workers_for(ranks, cores, JOB_MEMORY_BUDGET);
    pb.set_message(format!(
        "reading {} ranks, {workers} at a time",
        ranks.len()
    ));
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let job = memlens::job::diagnose_job(ranks, opts, workers, || {
        let n = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        pb.set_message(format!("read {n} of {} ranks", ranks.len()));
    })?;
    let mut doc = memlens::render::documents::DoctorDoc::new(job.diagnosis, job.warnings);
    for w in &doc.warnings {
        pb.suspend(|| eprintln!("memlens: warning: {w}"));
    }
    let names: Vec<String> = doc
        .diagnosis
        .parts
        .iter()
        .flat_map(|p| p.files.iter().cloned())
        .collect();
    let mut not_written = None;
    if let Some(p) = report {
        pb.set_message("writing the report");
        let read = super::load_all_for_peak(&job.main_files)?;
        let named = super::named(&read.snaps);
        let set = AnalysedSet::with_passes(&named, read.passes.clone());
        match memlens::report::write_job_report(&set, &named, &doc.diagnosis, job.ranks_view, p) {
            Ok(()) => doc.report = Some(p.display().to_string()),
            Err(e) => not_written = Some(e),
        }
    }
    Ok((doc, names, not_written))
}

/// Reads every input, then diagnoses them together.
fn together(
    args: &Args,
    opts: &DoctorOptions,
    report: Option<&std::path::Path>,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<Diagnosed> {
    let read = if args.snapshots.is_empty() {
        super::ReadForPeak {
            snaps: vec![(
                memlens::example::EXAMPLE_NAME.to_string(),
                memlens::Snapshot::example(),
            )],
            passes: Vec::new(),
        }
    } else {
        super::load_all_for_peak(&args.snapshots)?
    };
    let snaps = &read.snaps;
    pb.set_message("replaying and diagnosing");
    let named = super::named(snaps);
    // One analysed trace per snapshot, with its replay beside the reader,
    // for the diagnosis and then the report.
    let set = AnalysedSet::with_passes(&named, read.passes.clone());
    let mut doc = doctor_doc_in(&set, &named, opts, None)?;
    // A bad file beside the snapshots costs only what it would have added.
    for w in &doc.warnings {
        pb.suspend(|| eprintln!("memlens: warning: {w}"));
    }
    // The report is written after the diagnosis, so that a folder the user
    // cannot write still gets the verdict (then exit 2: the report promised
    // was not written).
    let mut not_written = None;
    if let Some(p) = report {
        match memlens::report::write_report_in(&set, &named, &doc.diagnosis, p) {
            Ok(()) => doc.report = Some(p.display().to_string()),
            Err(e) => not_written = Some(e),
        }
    }
    let names = snaps.iter().map(|(n, _)| n.clone()).collect();
    Ok((doc, names, not_written))
}
