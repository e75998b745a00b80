//! `memlens summary`: the allocator state at dump time.

use crate::output;
use memlens::analysis::summary::summarize;
use memlens::render;
use std::path::PathBuf;

/// Arguments of `memlens summary`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens summary run.pickle.zst --json")]
pub struct Args {
    /// The snapshot (.pickle, .pickle.gz, .pickle.zst or JSON), or a Chrome
    /// trace exported by torch.profiler with profile_memory=True.
    pub snapshot: PathBuf,
    /// Print the JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens summary`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let name = args.snapshot.display().to_string();
    if let Some(trace) = super::profiler_trace(&args.snapshot)? {
        let s = memlens::profiler::summary(&trace);
        output::print(&s, args.json, |s| render::profiler::summary_text(s, &name))?;
        return Ok(output::OK);
    }
    let snap = super::load(&args.snapshot)?;
    output::print(&summarize(&snap), args.json, |s| {
        render::summary::text(s, &name)
    })?;
    Ok(output::OK)
}
