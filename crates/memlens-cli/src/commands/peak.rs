//! `memlens peak`: the peak and what was live at it, by allocation site.

use crate::output;
use memlens::analysis::peak::peak;
use memlens::render;
use std::path::PathBuf;

/// Arguments of `memlens peak`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens peak run.pickle.zst --top 5")]
pub struct Args {
    /// The snapshot.
    pub snapshot: PathBuf,
    /// How many sites to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens peak`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    output::print(&peak(&snap, args.top), args.json, render::peak::text)?;
    Ok(output::OK)
}
