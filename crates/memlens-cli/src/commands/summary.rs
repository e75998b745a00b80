//! `memlens summary`: the allocator state at dump time.

use crate::output;
use memlens::analysis::summary::summarize;
use memlens::render;
use std::path::PathBuf;

/// Arguments of `memlens summary`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens summary run.pickle.zst --json")]
pub struct Args {
    /// The snapshot (.pickle, .pickle.gz, .pickle.zst or JSON).
    pub snapshot: PathBuf,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens summary`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let name = args.snapshot.display().to_string();
    output::print(&summarize(&snap), args.json, |s| {
        render::summary::text(s, &name)
    })?;
    Ok(output::OK)
}
