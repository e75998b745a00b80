//! `memlens tune`: simulates the usual `PYTORCH_CUDA_ALLOC_CONF` settings on a
//! trace and ranks them.

use crate::commands::simulate::{device_options, DeviceArgs};
use crate::output;
use anyhow::Context;
use memlens::render::{self, documents::pick_device, documents::tune_doc};
use std::path::PathBuf;

/// Arguments of `memlens tune`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  memlens tune run.pickle.zst --device-memory 80GB")]
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

/// Runs `memlens tune`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let name = args.snapshot.display().to_string();
    let device = pick_device(&snap, args.target.device).with_context(|| name.clone())?;
    let opts = device_options(&args.target)?;
    let doc = tune_doc(&snap, &name, device, &opts)?;
    output::print(&doc, args.json, render::tune::text)?;
    Ok(output::OK)
}
