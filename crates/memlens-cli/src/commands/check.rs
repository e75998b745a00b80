//! `memlens check`: a memory gate for CI (exit code 1 when a limit is broken).

use crate::output;
use memlens::analysis::check::check;
use memlens::analysis::peak::peak;
use memlens::render;
use memlens::units::parse_size;
use std::path::PathBuf;

/// Arguments of `memlens check`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens check run.pickle.zst --max-peak 8GiB")]
pub struct Args {
    /// The snapshot.
    pub snapshot: PathBuf,
    /// Largest allowed peak of allocated bytes (e.g. 8GiB).
    #[arg(long, value_parser = parse_size_arg)]
    pub max_peak: Option<u64>,
    /// Largest allowed peak of reserved bytes.
    #[arg(long, value_parser = parse_size_arg)]
    pub max_reserved: Option<u64>,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Runs `memlens check`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if args.max_peak.is_none() && args.max_reserved.is_none() {
        anyhow::bail!("give --max-peak SIZE and/or --max-reserved SIZE");
    }
    let snap = super::load(&args.snapshot)?;
    let r = check(&peak(&snap, 5), args.max_peak, args.max_reserved);
    output::print(&r, args.json, render::check::text)?;
    Ok(if r.ok {
        output::OK
    } else {
        output::CHECK_FAILED
    })
}
