//! `memlens report`: the self-contained HTML report alone.

use crate::output;
use memlens::render::documents::report_doc;
use std::path::PathBuf;

/// Arguments of `memlens report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens report run.pickle.zst -o run.html")]
pub struct Args {
    /// Snapshots of one run, oldest first (or one Chrome trace exported by
    /// torch.profiler with profile_memory=True).
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
    if let [one] = args.snapshots.as_slice() {
        if let Some(trace) = super::profiler_trace(one)? {
            let name = one.display().to_string();
            if std::fs::canonicalize(&args.output).ok() == std::fs::canonicalize(one).ok() {
                anyhow::bail!("{}: is the input; write the report elsewhere (-o)", name);
            }
            let page = memlens::render::profiler::html(
                &memlens::profiler::summary(&trace),
                &memlens::profiler::peak(&trace, 15),
                &name,
            );
            std::fs::write(&args.output, page)
                .map_err(|e| anyhow::anyhow!("{}: {e}", args.output.display()))?;
            let doc = memlens::render::documents::ReportDoc {
                report: args.output.display().to_string(),
            };
            output::print(&doc, args.json, |d| format!("Report: {}\n", d.report))?;
            return Ok(output::OK);
        }
    }
    let snaps = super::load_all_for_peak(&args.snapshots)?;
    let doc = report_doc(&super::named(&snaps), &args.output)?;
    output::print(&doc, args.json, |d| format!("Report: {}\n", d.report))?;
    Ok(output::OK)
}
