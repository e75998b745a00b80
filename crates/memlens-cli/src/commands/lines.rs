//! `memlens lines`: memory allocated and freed by each line of a function.

use crate::output;
use memlens::analysis::lines::{lines, LineOptions};
use memlens::render;
use memlens::source::SourceFinder;
use std::path::PathBuf;

/// Arguments of `memlens lines`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens lines run.pickle.zst train.py:train_step")]
pub struct Args {
    /// The snapshot.
    pub snapshot: PathBuf,
    /// The file (its path as in the frames, or its trailing part), and
    /// optionally the function: `train.py:train_step`.
    pub target: String,
    /// Where to look for the source file, to quote its lines (repeatable;
    /// also MEMLENS_SOURCE_ROOT).
    #[arg(long, value_name = "DIR")]
    pub source_root: Vec<PathBuf>,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens lines`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let finder = SourceFinder::with_env(args.source_root);
    let r = lines(&snap, &LineOptions::parse(&args.target), &finder);
    output::print(&r, args.json, render::lines::text)?;
    Ok(output::OK)
}
