//! `memlens fit`: a training run at another batch size, from two probes;
//! with a module under activation checkpointing, from one recording; or one
//! run (recorded, or traced with fake tensors) under a limit and settings.

use crate::output;
use anyhow::Context;
use memlens::fit::{answer, FitOptions};
use memlens::render;
use memlens::sim::AllocatorConfig;
use memlens::units::parse_size;
use std::path::PathBuf;

/// Arguments of `memlens fit`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens fit b2.pickle.zst b4.pickle.zst --recorded-batch 2,4 --batch 32 --limit 70GiB\n  \
                  memlens fit run.pickle.zst --checkpoint GPT2Block --limit 70GiB\n  \
                  memlens fit step.fake.pickle --limit 70GiB --config expandable_segments:True\n\n\
                  Each probe is a snapshot of the same run (same code, same number of steps) recorded\n\
                  from the start of the process, at its own batch size. --checkpoint needs one such\n\
                  recording made with memlens.record(..., model=model), which names the modules.\n\
                  One file alone (a recording, or a step traced with fake tensors by\n\
                  memlens.trace_step, with no GPU) is replayed as it ran."
)]
pub struct Args {
    /// The two probes: snapshots of the run at two batch sizes; or one
    /// recording (with --checkpoint, or alone: the run as it ran, under
    /// --limit and --config), or one step traced with fake tensors
    /// (memlens.trace_step).
    #[arg(required = true, value_name = "PROBE")]
    pub probes: Vec<PathBuf>,
    /// The probes' batch sizes, in the same order, e.g. `2,4`.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub recorded_batch: Vec<u32>,
    /// Predict the recorded run with every call of this module under
    /// activation checkpointing (torch.utils.checkpoint): a class such as
    /// `GPT2Block`, or an instance such as `transformer.h.3`.
    #[arg(long, value_name = "MODULE", conflicts_with = "recorded_batch")]
    pub checkpoint: Option<String>,
    /// The batch size to predict.
    #[arg(long, value_name = "N")]
    pub batch: Option<u32>,
    /// The memory PyTorch's allocator may reserve, e.g. `70GiB` (the GPU's
    /// memory less the CUDA context, or a per-process cap); with it, fit
    /// says whether the batch fits and finds the largest that does.
    #[arg(long, value_name = "SIZE")]
    pub limit: Option<String>,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (default: the
    /// probes' recorded settings).
    #[arg(long)]
    pub config: Option<String>,
    /// Another precision (`bf16`, `fp16`, `fp32`): not from a recording
    /// (autocast changes which operators run); the answer names the way
    /// that predicts it (a step traced with fake tensors).
    #[arg(long, value_name = "P")]
    pub precision: Option<String>,
    /// Another optimizer: not from a recording; the answer names the way.
    #[arg(long, value_name = "O")]
    pub optimizer: Option<String>,
    /// Gradient accumulation over K micro-batches: not from a recording;
    /// the answer names the way.
    #[arg(long, value_name = "K")]
    pub grad_accum: Option<u32>,
    /// Another sequence length: not from a recording; the answer names the
    /// way.
    #[arg(long, value_name = "L")]
    pub seq: Option<u32>,
    /// Print the JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The changes of the contract `fit` cannot yet make to a recording, each
/// with what predicts it instead: refused in one line, not guessed.
fn not_from_a_recording(args: &Args) -> Option<String> {
    let traced = "memlens.predict(build, step, batch=N, limit=..., largest=True) in Python traces \
                  the step with fake tensors (none of the step's memory on the GPU) and replays it";
    if let Some(p) = &args.precision {
        return Some(format!(
            "--precision {p}: not from a recording yet (autocast changes which operators run and \
             what type each output has, which a recording does not show); {traced} with \
             precision=\"{p}\" (or memlens.predict_config(config, precision=\"{p}\") for a Hugging \
             Face model)"
        ));
    }
    if let Some(o) = &args.optimizer {
        return Some(format!(
            "--optimizer {o}: not from a recording yet; {traced} with the step's optimizer changed \
             (or memlens.predict_config(config, optimizer=\"{o}\"): adamw, adamw-fused, \
             adamw-for-loop, adam, sgd)"
        ));
    }
    if let Some(k) = args.grad_accum {
        return Some(format!(
            "--grad-accum {k}: not from a recording yet (the gradients held across micro-batches \
             change the peak, which a recording of plain steps does not show); {traced}, with a \
             step that accumulates over {k} micro-batches"
        ));
    }
    if let Some(l) = args.seq {
        return Some(format!(
            "--seq {l}: not from a recording yet (eager attention's memory grows with the square \
             of the sequence); {traced} at that length (or memlens.predict_config(config, seq={l}))"
        ));
    }
    None
}

/// Runs `memlens fit`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(why) = not_from_a_recording(&args) {
        return Err(memlens::Error::usage(why).into());
    }
    let snaps = super::load_all_replayable(&args.probes)?;
    let opts = FitOptions {
        batch: args.batch,
        limit: args
            .limit
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--limit")?,
        config: args
            .config
            .as_deref()
            .map(AllocatorConfig::parse)
            .transpose()
            .context("--config")?,
        least_limit: false,
    };
    let recordings: Vec<(&str, &memlens::Snapshot)> =
        snaps.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let report = answer(
        &recordings,
        &args.recorded_batch,
        args.checkpoint.as_deref(),
        &opts,
    )?;
    output::print(&report, args.json, render::fit::answer_text)?;
    Ok(output::OK)
}
