//! `memlens simulate`: replays a trace's allocations through the allocator
//! model under other settings (what-if).

use crate::output;
use anyhow::Context;
use memlens::analysis::sites::{Site, SiteIndex};
use memlens::replay::simulate::{simulate, SimulateOptions, SimulationResult};
use memlens::replay::{replay_device, ReplayOptions};
use memlens::sim::{AllocatorConfig, TorchVersion};
use memlens::units::{format_bytes, parse_device_memory, parse_size};
use memlens::Snapshot;
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of `memlens simulate`.
#[derive(clap::Args, Debug)]
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

/// The device to work on: the one asked for, else the first with a trace.
pub(crate) fn pick_device(snap: &Snapshot, asked: Option<u32>) -> anyhow::Result<u32> {
    let with_trace: Vec<u32> = snap
        .traces
        .iter()
        .filter(|t| !t.events.is_empty())
        .map(|t| t.device)
        .collect();
    match asked {
        Some(d) if with_trace.contains(&d) => Ok(d),
        Some(d) => anyhow::bail!("device {d} has no trace (devices with one: {with_trace:?})"),
        None => with_trace.first().copied().ok_or_else(|| {
            anyhow::anyhow!(
                "the snapshot has no trace: record it with \
                 torch.cuda.memory._record_memory_history(enabled=\"all\")"
            )
        }),
    }
}

/// The JSON document.
#[derive(Serialize)]
struct Doc<'a> {
    snapshot: String,
    #[serde(flatten)]
    result: &'a SimulationResult,
    first_oom_index: Option<usize>,
    first_oom_site: Option<Site>,
    recorded: Recorded,
}

/// What the recorded run did, for comparison.
#[derive(Serialize)]
struct Recorded {
    config: String,
    peak_reserved_bytes: u64,
    peak_allocated_bytes: u64,
    num_ooms: u64,
}

/// Runs `memlens simulate`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    let snap = super::load(&args.snapshot)?;
    let device = pick_device(&snap, args.target.device)
        .with_context(|| format!("{}", args.snapshot.display()))?;
    let recorded_config = memlens::replay::config::recorded_config(&snap.settings);
    let mut config = match &args.config {
        Some(text) => AllocatorConfig::parse(text).context("--config")?,
        None => recorded_config.clone(),
    };
    if let Some(v) = &args.torch_version {
        config.version = TorchVersion::parse(v)?;
    }
    let mut opts = device_options(&args.target)?;
    opts.config = config;
    let result = simulate(&snap, device, &opts)?;
    let recorded = replay_device(&snap, device, &ReplayOptions::default());
    let site = result.first_oom.map(|o| {
        let index = SiteIndex::new(&snap);
        Site::of(&snap, &index, o.stack)
    });
    let doc = Doc {
        snapshot: args.snapshot.display().to_string(),
        result: &result,
        first_oom_index: result.first_oom.map(|o| o.event_index),
        first_oom_site: site,
        recorded: Recorded {
            config: recorded_config.to_conf_string(),
            peak_reserved_bytes: recorded.peak_reserved_bytes,
            peak_allocated_bytes: recorded.peak_allocated_bytes,
            num_ooms: recorded.stats.num_ooms,
        },
    };
    if args.json {
        output::print_json(&doc)?;
    } else {
        output::print_text(&render(&doc))?;
    }
    Ok(output::OK)
}

fn show(config: &str) -> &str {
    if config.is_empty() {
        "the default settings"
    } else {
        config
    }
}

fn change(new: u64, old: u64) -> String {
    if old == 0 {
        return String::new();
    }
    let pct = 100.0 * (new as f64 - old as f64) / old as f64;
    format!(" (recorded {}, {pct:+.1}%)", format_bytes(old))
}

fn render(d: &Doc) -> String {
    let r = d.result;
    let mut o = String::new();
    let _ = writeln!(o, "{}", d.snapshot);
    let _ = writeln!(
        o,
        "  simulated under {} (recorded under {}), {} events",
        show(&r.config),
        show(&d.recorded.config),
        r.events
    );
    if let Some(cap) = r.capacity_bytes {
        let _ = writeln!(
            o,
            "  device capacity for PyTorch: {} ({} overhead)",
            format_bytes(cap),
            format_bytes(r.overhead_bytes.unwrap_or(0))
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  peak reserved   {:>12}{}",
        format_bytes(r.peak_reserved_bytes),
        change(r.peak_reserved_bytes, d.recorded.peak_reserved_bytes)
    );
    let _ = writeln!(
        o,
        "  peak allocated  {:>12}{}",
        format_bytes(r.peak_allocated_bytes),
        change(r.peak_allocated_bytes, d.recorded.peak_allocated_bytes)
    );
    let _ = writeln!(
        o,
        "  at the peak: {:.1}% of reserved memory not allocated, {} in free pieces of split segments",
        100.0 * r.fragmentation_at_peak,
        format_bytes(r.inactive_split_bytes_at_peak)
    );
    let _ = writeln!(
        o,
        "  segments made {} (cudaMalloc or mapping), freed {}, cache flushes and retries {}, OOMs {}",
        r.num_device_alloc, r.num_device_free, r.num_alloc_retries, r.num_ooms
    );
    if r.empty_cache_calls > 0 {
        let _ = writeln!(o, "  empty_cache() calls replayed: {}", r.empty_cache_calls);
    }
    match (&r.first_oom, &d.first_oom_site) {
        (Some(oom), site) => {
            let _ = writeln!(
                o,
                "\n  first OOM at event #{}: {} requested{}, {} reserved and {} allocated then",
                oom.event_index,
                format_bytes(oom.requested_bytes),
                site.as_ref()
                    .map(|s| format!(" at {}", s.site))
                    .unwrap_or_default(),
                format_bytes(oom.reserved_bytes),
                format_bytes(oom.allocated_bytes)
            );
        }
        (None, _) if r.capacity_bytes.is_some() => {
            let _ = writeln!(o, "\n  no OOM: the run fits");
        }
        _ => {}
    }
    for w in &r.warnings {
        let _ = writeln!(o, "  note: {w}");
    }
    o
}
