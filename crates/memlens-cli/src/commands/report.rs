//! `memlens report`: the self-contained HTML report alone.

use crate::output;
use memlens::analysis::doctor::{diagnose, Diagnosis, DoctorOptions};
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

/// Builds the report from a diagnosis and writes it. The page is written to a
/// temporary file beside the target and renamed into place, so a failure never
/// leaves a half-written report over an earlier one.
pub fn write_report(
    snaps: &[(String, &memlens::Snapshot)],
    d: &Diagnosis,
    path: &Path,
) -> anyhow::Result<PathBuf> {
    let html = memlens::report::render_html(&memlens::report::build_report(snaps, d));
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = |p: &Path| std::fs::write(p, html.as_bytes());
    write(&tmp).map_err(|e| anyhow::anyhow!("{}: cannot write the report: {e}", path.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("{}: cannot write the report: {e}", path.display())
    })?;
    Ok(path.to_path_buf())
}
