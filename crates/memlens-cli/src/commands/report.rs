//! `memlens report`: the self-contained HTML report alone.

use crate::output;
use memlens::render::documents::report_doc;
use std::path::PathBuf;

/// Arguments of `memlens report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens report run.pickle.zst -o run.html")]
pub struct Args {
    /// Snapshots of one run, oldest first.
    #[arg(required = true)]
    pub snapshots: Vec<PathBuf>,
    /// Where to write the report.
    #[arg(short, long, default_value = "memlens-report.html")]
    pub output: PathBuf,
    /// Print the JSON document (`report`: the path written).
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens report`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snaps = super::load_all(&args.snapshots)?;
    let doc = report_doc(&super::named(&snaps), &args.output)?;
    output::print(&doc, args.json, |d| format!("Report: {}\n", d.report))?;
    Ok(output::OK)
}
