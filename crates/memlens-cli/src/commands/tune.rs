//! `memlens tune`: simulates the usual `PYTORCH_CUDA_ALLOC_CONF` settings on a
//! trace and ranks them.

use crate::commands::simulate::{device_options, pick_device};
use crate::output;
use anyhow::Context;
use memlens::replay::tune::{tune, TuneResult};
use memlens::units::format_bytes;
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `memlens tune`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The snapshot (.pickle, .pickle.gz, .pickle.zst or JSON).
    pub snapshot: PathBuf,
    /// Total memory of the GPU, e.g. `80GB` (default: unlimited, so only
    /// reserved memory ranks the settings).
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Memory used outside PyTorch's allocator; default: estimated from the
    /// trace's OOM event, else 0.
    #[arg(long, value_name = "SIZE")]
    pub overhead: Option<String>,
    /// A `torch.cuda.set_per_process_memory_fraction` the run used (needs
    /// --device-memory).
    #[arg(long, value_name = "F")]
    pub memory_fraction: Option<f64>,
    /// Device ordinal (default: the first with a trace).
    #[arg(long)]
    pub device: Option<u32>,
    /// Print the JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Doc<'a> {
    snapshot: String,
    #[serde(flatten)]
    result: &'a TuneResult,
}

/// Runs `memlens tune`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let device =
        pick_device(&snap, args.device).with_context(|| format!("{}", args.snapshot.display()))?;
    let opts = device_options(
        args.device_memory.as_deref(),
        args.overhead.as_deref(),
        args.memory_fraction,
    )?;
    let result = tune(&snap, device, &opts)?;
    let doc = Doc {
        snapshot: args.snapshot.display().to_string(),
        result: &result,
    };
    if args.json {
        output::print_json(&doc)?;
    } else {
        output::print_text(&render(&doc))?;
    }
    Ok(output::OK)
}

fn render(d: &Doc) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}", d.snapshot);
    let _ = writeln!(
        o,
        "  {:<72} {:>12} {:>6} {:>8}",
        "PYTORCH_CUDA_ALLOC_CONF", "peak reserved", "OOMs", "retries"
    );
    for c in &d.result.candidates {
        let name = if c.config.is_empty() {
            "(defaults)".to_string()
        } else {
            c.config.clone()
        };
        let mark = if c.recorded { " <- recorded" } else { "" };
        let _ = writeln!(
            o,
            "  {:<72} {:>12} {:>6} {:>8}{mark}",
            name,
            format_bytes(c.peak_reserved_bytes),
            c.num_ooms,
            c.num_alloc_retries
        );
    }
    let _ = writeln!(o, "\n  {}", d.result.advice);
    o
}
