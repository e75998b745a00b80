//! `memlens simulate`: replays a trace's allocations through the allocator
//! model under other settings (what-if).

use crate::output;
use anyhow::Context;
use memlens::render::{self, documents::pick_device, documents::simulate_doc};
use memlens::replay::config::recorded_config;
use memlens::replay::simulate::SimulateOptions;
use memlens::sim::{AllocatorConfig, TorchVersion};
use memlens::units::{parse_device_memory, parse_size};
use std::path::PathBuf;

/// Arguments of `memlens simulate`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example:\n  memlens simulate run.pickle.zst --config expandable_segments:True --device-memory 80GB"
)]
pub struct Args {
    /// The snapshot (.pickle, .pickle.gz, .pickle.zst or JSON).
    pub snapshot: PathBuf,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g.
    /// `expandable_segments:True` (default: the settings recorded in the snapshot).
    #[arg(long)]
    pub config: Option<String>,
    /// The device the what-if run targets.
    #[command(flatten)]
    pub target: DeviceArgs,
    /// Apply the allocator rules of this PyTorch version (e.g. 2.3).
    #[arg(long, value_name = "V")]
    pub torch_version: Option<String>,
    /// Print the JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The device a what-if run targets: flags shared by `simulate` and `tune`.
#[derive(clap::Args, Debug)]
pub struct DeviceArgs {
    /// Total memory of the GPU, e.g. `80GB` or `79.18GiB` (default: unlimited,
    /// so only reserved memory counts).
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Memory used outside PyTorch's allocator (CUDA context, other processes);
    /// default: estimated from the trace's OOM event, else 0.
    #[arg(long, value_name = "SIZE")]
    pub overhead: Option<String>,
    /// A `torch.cuda.set_per_process_memory_fraction` the run used (needs
    /// --device-memory).
    #[arg(long, value_name = "F")]
    pub memory_fraction: Option<f64>,
    /// Device ordinal (default: the first with a trace).
    #[arg(long)]
    pub device: Option<u32>,
}

/// What-if options from the device flags: device memory, overhead, fraction.
pub(crate) fn device_options(args: &DeviceArgs) -> anyhow::Result<SimulateOptions> {
    let device_memory = args
        .device_memory
        .as_deref()
        .map(parse_device_memory)
        .transpose()?;
    let overhead = args.overhead.as_deref().map(parse_size).transpose()?;
    let allowed_memory_maximum = match (args.memory_fraction, device_memory) {
        (None, _) => None,
        (Some(f), _) if !(f > 0.0 && f <= 1.0) => {
            anyhow::bail!("invalid --memory-fraction {f}: set it in (0, 1]")
        }
        (Some(_), None) => anyhow::bail!("--memory-fraction needs --device-memory"),
        (Some(f), Some(total)) => (f < 1.0).then_some((f * total as f64) as u64),
    };
    Ok(SimulateOptions {
        device_memory,
        overhead,
        allowed_memory_maximum,
        ..Default::default()
    })
}

/// Runs `memlens simulate`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load_replayable(&args.snapshot)?;
    let name = args.snapshot.display().to_string();
    let device = pick_device(&snap, args.target.device).with_context(|| name.clone())?;
    let mut config = match &args.config {
        Some(text) => AllocatorConfig::parse(text).context("--config")?,
        None => recorded_config(&snap.settings),
    };
    if let Some(v) = &args.torch_version {
        config.version = TorchVersion::parse(v)?;
    }
    let mut opts = device_options(&args.target)?;
    opts.config = config;
    let doc = simulate_doc(&snap, &name, device, &opts)?;
    output::print(&doc, args.json, render::simulate::text)?;
    Ok(output::OK)
}
