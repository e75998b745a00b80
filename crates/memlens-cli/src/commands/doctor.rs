//! `memlens doctor`: the main job. For now it prints the summary of each
//! snapshot (or of the example built into the binary); the full diagnosis
//! (peak, leaks, OOM, fragmentation, tune, HTML report) is assembled here as
//! those analyses land.

use crate::output;
use anyhow::Context;
use memlens::analysis::summary::summarize;
use std::path::PathBuf;

/// Arguments of `memlens doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshots of one run (none: the example snapshot built into memlens).
    pub snapshots: Vec<PathBuf>,
}

/// Runs `memlens doctor`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if args.snapshots.is_empty() {
        let snap = memlens::Snapshot::example();
        let text = super::summary::render(&summarize(&snap), memlens::example::EXAMPLE_NAME);
        output::print_text(&text)?;
        return Ok(output::OK);
    }
    for path in &args.snapshots {
        let snap = memlens::Snapshot::load(path)
            .with_context(|| format!("cannot read snapshot {}", path.display()))?;
        output::print_text(&super::summary::render(
            &summarize(&snap),
            &path.display().to_string(),
        ))?;
    }
    Ok(output::OK)
}
