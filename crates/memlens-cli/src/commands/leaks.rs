//! `memlens leaks`: leak candidates, most likely first.

use crate::output;
use memlens::analysis::leaks::find_per_process;
use memlens::render;
use memlens::source::{RunEvidence, SourceFinder};
use std::path::PathBuf;

/// Arguments of `memlens leaks`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens leaks run.pickle.zst\n  memlens leaks step10.pickle step20.pickle step30.pickle --fail-on-leak"
)]
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
    let snaps = super::load_all(&args.snapshots)?;
    let named = super::named(&snaps);
    let mut report = find_per_process(&named);
    let run = RunEvidence::of(&named);
    for w in &run.holders.warnings {
        eprintln!("memlens: warning: {w}");
    }
    report.annotate(&SourceFinder::with_env(args.source_root), &run);
    output::print(&report, args.json, render::leaks::text)?;
    Ok(if args.fail_on_leak && report.has_high_confidence() {
        output::CHECK_FAILED
    } else {
        output::OK
    })
}
