//! `memlens doctor`: the main job. Runs every analysis that applies to the
//! snapshots of one run, prints the verdict first (the findings that matter,
//! each with its `file:line` and fix), detail with `-v`, and writes the HTML
//! report.

use crate::output;
use memlens::analysis::doctor::{diagnose, Diagnosis, DoctorOptions, Severity};
use std::fmt::Write;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `memlens doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshots of one run, oldest first (none: the example built into memlens).
    pub snapshots: Vec<PathBuf>,
    /// Where to write the HTML report.
    #[arg(short, long, default_value = "memlens-report.html")]
    pub output: PathBuf,
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
    let snaps: Vec<(String, memlens::Snapshot)> = if args.snapshots.is_empty() {
        vec![(
            memlens::example::EXAMPLE_NAME.to_string(),
            memlens::Snapshot::example(),
        )]
    } else {
        args.snapshots
            .iter()
            .map(|p| Ok((p.display().to_string(), super::load(p)?)))
            .collect::<anyhow::Result<_>>()?
    };
    pb.set_message("replaying and diagnosing");
    let refs: Vec<(String, &memlens::Snapshot)> =
        snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let opts = DoctorOptions {
        device_memory: args.device_memory,
    };
    let mut d = diagnose(&refs, &opts);
    let sources = memlens::source::SourceFinder::with_env(args.source_root);
    sources.annotate_findings(&mut d.findings);
    sources.annotate_leaks(&mut d.leaks);
    let report = if args.no_report {
        None
    } else {
        pb.set_message("writing the report");
        Some(super::report::write_report(&refs, &d, &args.output)?)
    };
    pb.finish_and_clear();
    if args.json {
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            findings: &'a [memlens::analysis::doctor::Finding],
            report: Option<String>,
            diagnosis: &'a Diagnosis,
        }
        output::print_json(&Doc {
            findings: &d.findings,
            report: report.as_ref().map(|p| p.display().to_string()),
            diagnosis: &d,
        })?;
    } else {
        let names: Vec<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
        let mut text = render(&d, &names, args.verbose);
        if let Some(p) = &report {
            let _ = writeln!(text, "\nReport: {}", p.display());
        }
        output::print_text(&text)?;
    }
    Ok(output::OK)
}

/// The verdict, then (with `verbose`) the detail.
pub fn render(d: &Diagnosis, names: &[&str], verbose: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "memlens doctor: {}", names.join(", "));
    let serious: Vec<_> = d
        .findings
        .iter()
        .filter(|f| f.severity > Severity::Info)
        .collect();
    let _ = writeln!(
        o,
        "\n{}",
        match serious.len() {
            0 => "Verdict: no leak, no OOM, no fragmentation worth fixing.".to_string(),
            1 => "Verdict: 1 problem.".to_string(),
            n => format!("Verdict: {n} problems."),
        }
    );
    for (i, f) in d.findings.iter().enumerate() {
        if i >= 4 && !verbose {
            break;
        }
        let mark = match f.severity {
            Severity::Critical => "!!",
            Severity::Warning => "! ",
            Severity::Info => "  ",
        };
        let _ = writeln!(o, "\n{mark} {}", f.title);
        if let Some(fix) = &f.suggestion {
            let _ = writeln!(o, "   fix: {fix}");
        }
        o.push_str(&f.quote.render("   "));
        if verbose {
            for e in &f.evidence {
                let _ = writeln!(o, "   {e}");
            }
            for line in f.stack.iter().take(8) {
                let _ = writeln!(o, "     at {line}");
            }
        }
    }
    if verbose {
        let _ = writeln!(o, "\n--- summary ---");
        o.push_str(&super::summary::render(
            &d.summary,
            names.last().copied().unwrap_or(""),
        ));
        let _ = writeln!(o, "\n--- peak ---");
        o.push_str(&super::peak::render(&d.peak));
        let _ = writeln!(o, "\n--- leaks ---");
        o.push_str(&super::leaks::render(&d.leaks));
        if let Some(oom) = &d.oom {
            let _ = writeln!(o, "\n--- oom ---");
            o.push_str(&super::oom::render_report(oom));
        }
    } else {
        let _ = writeln!(
            o,
            "\n(-v for the evidence, the stacks and the full summary)"
        );
    }
    o
}
