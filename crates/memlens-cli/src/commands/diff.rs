//! `memlens diff A B`: what B holds that A did not, and the reverse.

use crate::output;
use memlens::analysis::diff::diff;
use memlens::render;
use std::path::PathBuf;

/// Arguments of `memlens diff`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens diff step10.pickle step20.pickle --top 5")]
pub struct Args {
    /// The earlier snapshot.
    pub a: PathBuf,
    /// The later snapshot.
    pub b: PathBuf,
    /// How many sites to show each way.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens diff`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let a = super::load(&args.a)?;
    let b = super::load(&args.b)?;
    output::print(&diff(&a, &b), args.json, |d| {
        render::diff::text(d, args.top)
    })?;
    Ok(output::OK)
}
