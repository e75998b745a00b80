//! `memlens oom`: why an allocation failed and what would fix it.
//!
//! On a snapshot whose trace holds the OOM (`memlens oom SNAP`): the state
//! right before the failure, the cause, and fixes checked by simulation; the
//! error text (`--message`, `--message-file`) adds the device's total and the
//! cap. From the error message alone (`--message`, `--message-file`, or
//! stdin): the figures it printed, the cause and the fixes.

use crate::output;
use anyhow::Context;
use memlens::oom::OomOptions;
use memlens::render::{self, documents::oom_doc};
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

/// Arguments of `memlens oom`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens oom at_oom.pickle.zst --device-memory H100\n  memlens oom --message-file train.log"
)]
pub struct Args {
    /// A snapshot taken at or after the OOM (its trace holds the `oom`
    /// event), or `-` to read the error message from stdin.
    pub snap: Option<PathBuf>,
    /// The out-of-memory error text (a whole traceback or log is fine); with
    /// SNAP, it tells the device's total and the memory cap.
    #[arg(long, value_name = "TEXT", conflicts_with = "message_file")]
    pub message: Option<String>,
    /// A file holding the error text (a log, a traceback); `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub message_file: Option<PathBuf>,
    /// Total memory of the GPU (e.g. 80GiB, or a name such as H100), for the
    /// memory outside PyTorch, the cap's fraction and the predictions.
    #[arg(long, value_name = "SIZE|GPU", value_parser = parse_device_memory)]
    pub device_memory: Option<u64>,
    /// The failing step's batch size, to say which batch fits.
    #[arg(long, value_name = "N")]
    pub batch: Option<u64>,
    /// The run's optimizer (adamw, adam, sgd-momentum, sgd): a run that failed
    /// in its first step had not made its state yet, which every later step
    /// holds; without it Adam(W)'s is assumed (and said).
    #[arg(long, value_name = "NAME", value_parser = parse_optimizer)]
    pub optimizer: Option<memlens::oom::FirstStepOptimizer>,
    /// Allocation sites to list as live at the OOM.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON (`"schema": "memlens/1"`).
    #[arg(long)]
    pub json: bool,
}

fn parse_optimizer(s: &str) -> Result<memlens::oom::FirstStepOptimizer, String> {
    memlens::oom::FirstStepOptimizer::named(s).map_err(|e| e.to_string())
}

fn parse_device_memory(s: &str) -> Result<u64, String> {
    memlens::units::parse_device_memory(s).map_err(|e| e.to_string())
}

/// Runs `memlens oom`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(p) = args.snap.as_ref().filter(|p| p.as_os_str() != "-") {
        return run_snapshot(p, &args);
    }
    if args.device_memory.is_some() || args.batch.is_some() || args.optimizer.is_some() {
        anyhow::bail!(
            "--device-memory, --batch and --optimizer apply to a snapshot: memlens oom SNAP \
             [--message TEXT]"
        );
    }
    let (text, origin) = match message_text(&args)? {
        Some(t) => t,
        None => (read_stdin()?, "stdin".to_string()),
    };
    let diagnosis = memlens::oom::explain_message(&text).with_context(|| origin)?;
    output::print(&diagnosis, args.json, render::oom::message_text)?;
    Ok(output::OK)
}

/// The message text given by `--message` or `--message-file`, with where it came from.
fn message_text(args: &Args) -> anyhow::Result<Option<(String, String)>> {
    Ok(match (&args.message, &args.message_file) {
        (Some(t), _) => Some((t.clone(), "--message".to_string())),
        (None, Some(f)) if f.as_os_str() == "-" => Some((read_stdin()?, "stdin".to_string())),
        (None, Some(f)) => Some((read_file(f)?, f.display().to_string())),
        (None, None) => None,
    })
}

fn run_snapshot(path: &Path, args: &Args) -> anyhow::Result<u8> {
    let message = match message_text(args)? {
        Some((text, origin)) => Some(memlens::oom::message::find(&text).with_context(|| origin)?),
        None => None,
    };
    let snap = super::load(path)?;
    let opts = OomOptions {
        message,
        device_memory: args.device_memory,
        batch: args.batch,
        top: args.top,
        // oom_doc reads what memlens.record wrote beside the snapshot.
        recorded: Vec::new(),
        optimizer: args.optimizer,
    };
    let report = oom_doc(&snap, &path.display().to_string(), &opts)?;
    output::print(&report, args.json, render::oom::text)?;
    Ok(output::OK)
}

fn read_stdin() -> anyhow::Result<String> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("memlens: paste the out-of-memory message, then Ctrl-D");
    }
    let mut bytes = Vec::new();
    stdin.read_to_end(&mut bytes).context("stdin")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).map_err(|error| memlens::Error::Io {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
