//! `memlens export`: snapshots as Parquet tables (events, blocks, segments,
//! frames) for DuckDB, Spark, Polars or pandas.

use crate::output;
use memlens::export::{ExportInput, Exporter};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `memlens export`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens export run.pickle.zst -o tables/\n  memlens export runs/job42/ -o tables/      (a folder: every snapshot in it)\n  duckdb -c \"SELECT action, count(*), sum(size) FROM 'tables/events.parquet' GROUP BY 1\""
)]
pub struct Args {
    /// Snapshots, folders of snapshots or quoted patterns ('runs/*.pickle.zst').
    #[arg(required = true)]
    pub snapshots: Vec<PathBuf>,
    /// The folder to write events.parquet, blocks.parquet, segments.parquet
    /// and frames.parquet into (created if missing; files there replaced).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the JSON document (the files and their row counts).
    #[arg(long)]
    pub json: bool,
}

/// What `memlens export --json` prints.
#[derive(serde::Serialize)]
struct ExportDoc {
    output: String,
    files: Vec<String>,
    rows: memlens::export::ExportCounts,
}

/// Runs `memlens export`: one snapshot in memory at a time.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let files = memlens::input::expand(&args.snapshots)?;
    let pb = if files.len() > 1 && std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(files.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut ex = Exporter::create(&args.output)?;
    for f in &files {
        let snap = super::load(f)?;
        let name = f.display().to_string();
        ex.add(&ExportInput {
            rank: memlens::analysis::inputs::rank_in_name(&name),
            file: name,
            snap: &snap,
        })?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let rows = ex.finish()?;
    let doc = ExportDoc {
        output: args.output.display().to_string(),
        files: files.iter().map(|f| f.display().to_string()).collect(),
        rows,
    };
    output::print(&doc, args.json, |d| {
        format!(
            "memlens export: {} snapshot{} -> {}\n  events.parquet   {} rows\n  blocks.parquet   {} rows\n  segments.parquet {} rows\n  frames.parquet   {} rows\n",
            d.files.len(),
            if d.files.len() == 1 { "" } else { "s" },
            d.output,
            d.rows.events,
            d.rows.blocks,
            d.rows.segments,
            d.rows.frames
        )
    })?;
    Ok(output::OK)
}
