//! `memlens report`: the self-contained HTML report alone.

use crate::output;
use memlens::doctor::{diagnose, Diagnosis, DoctorOptions};
use std::path::{Path, PathBuf};

/// Arguments of `memlens report`.
#[derive(clap::Args, Debug)]
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
    let snaps: Vec<(String, memlens::Snapshot)> = args
        .snapshots
        .iter()
        .map(|p| Ok((p.display().to_string(), super::load(p)?)))
        .collect::<anyhow::Result<_>>()?;
    let refs: Vec<(String, &memlens::Snapshot)> =
        snaps.iter().map(|(n, s)| (n.clone(), s)).collect();
    let d = diagnose(&refs, &DoctorOptions::default());
    let path = write_report(&refs, &d, &args.output)?;
    if args.json {
        #[derive(serde::Serialize)]
        struct Doc {
            report: String,
        }
        output::print_json(&Doc {
            report: path.display().to_string(),
        })?;
    } else {
        output::print_text(&format!("Report: {}\n", path.display()))?;
    }
    Ok(output::OK)
}

/// Builds the report from a diagnosis and writes it (atomically, see
/// [`memlens::report::write_report`]).
pub fn write_report(
    snaps: &[(String, &memlens::Snapshot)],
    d: &Diagnosis,
    path: &Path,
) -> anyhow::Result<PathBuf> {
    memlens::report::write_report(snaps, d, path)?;
    Ok(path.to_path_buf())
}
