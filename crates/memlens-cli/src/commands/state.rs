//! `memlens state`: the allocator's state right after one event of the trace.

use crate::output;
use memlens::analysis::state::state_at_event;
use memlens::render;
use memlens::trace::Analysed;
use std::path::PathBuf;

/// Arguments of `memlens state`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  memlens state run.pickle.zst --event 51234 --top 10\n\n\
                  The event indices are those `peak`, `leaks` and `oom` print (peak_event_index, ...)."
)]
pub struct Args {
    /// The snapshot.
    pub snapshot: PathBuf,
    /// The event index (from 0) in the device's trace.
    #[arg(long, value_name = "N")]
    pub event: usize,
    /// The device (default: the first with a trace).
    #[arg(long, value_name = "D")]
    pub device: Option<u32>,
    /// How many site groups to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens state`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let an = Analysed::new(&snap);
    let name = args.snapshot.display().to_string();
    let state = state_at_event(&an, args.device, args.event, args.top)
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    output::print(&state, args.json, render::state::text)?;
    Ok(output::OK)
}
