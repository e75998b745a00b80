//! `memlens leaks`: leak candidates, most likely first.

use crate::output;
use memlens::analysis::leaks::{find, Confidence};
use memlens::source::SourceFinder;
use memlens::units::format_bytes;
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `memlens leaks`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One snapshot (its trace is cut into steps), or several of one run.
    #[arg(required = true)]
    pub snapshots: Vec<PathBuf>,
    /// Exit with code 1 when a finding of high confidence exists (for CI).
    #[arg(long)]
    pub fail_on_leak: bool,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
    /// Where to look for the source files the frames name, when their own
    /// paths are not readable here (repeatable; also MEMLENS_SOURCE_ROOT).
    #[arg(long, value_name = "DIR")]
    pub source_root: Vec<PathBuf>,
}

/// Runs `memlens leaks`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snaps = args
        .snapshots
        .iter()
        .map(|p| Ok((p.display().to_string(), super::load(p)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let refs: Vec<(String, &memlens::Snapshot)> =
        snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let mut report = find(&refs);
    SourceFinder::with_env(args.source_root).annotate_leaks(&mut report);
    if args.json {
        output::print_json(&report)?;
    } else {
        output::print_text(&render(&report))?;
    }
    Ok(if args.fail_on_leak && report.has_high_confidence() {
        output::CHECK_FAILED
    } else {
        output::OK
    })
}

/// The terminal text: the verdict first, then the evidence.
pub fn render(r: &memlens::analysis::leaks::LeakReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}", r.verdict);
    let shown: Vec<_> = r
        .leaks
        .iter()
        .filter(|l| l.confidence >= Confidence::Medium)
        .take(5)
        .collect();
    for l in &shown {
        let _ = writeln!(
            o,
            "\n  {} in {}  +{} over {} points (+{}/step, +{} blocks), {:?} confidence",
            l.site,
            l.function,
            format_bytes(l.bytes),
            l.steps,
            format_bytes(l.bytes_per_step),
            l.count,
            l.confidence
        );
        let ev: Vec<String> = l.evidence.iter().map(|b| format_bytes(*b)).collect();
        let _ = writeln!(o, "    live: {}", ev.join(" -> "));
        let _ = writeln!(o, "    fix: {}", l.suggestion);
        o.push_str(&l.quote.render("    "));
    }
    let low = r.leaks.len() - shown.len();
    if low > 0 {
        let _ = writeln!(
            o,
            "\n  ({low} sites with irregular growth not shown; see --json)"
        );
    }
    o
}
