//! `memlens tune`: simulates the usual `PYTORCH_CUDA_ALLOC_CONF` settings on a
//! trace and ranks them.

use crate::commands::simulate::{device_options, pick_device, DeviceArgs};
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
    /// The device the what-if run targets.
    #[command(flatten)]
    pub target: DeviceArgs,
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
    let device = pick_device(&snap, args.target.device)
        .with_context(|| format!("{}", args.snapshot.display()))?;
    let opts = device_options(&args.target)?;
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
