//! The `memlens` command line as a library (`memlens_cli::run(argv)`, which the
//! tests call in-process). Argument parsing and printing only: every analysis,
//! every JSON document and every text lives in the `memlens` library.

pub mod commands;
pub mod output;
pub mod tui;

use clap::{Parser, Subcommand};

/// memlens: a GPU memory doctor for PyTorch.
///
/// Reads the snapshots that `torch.cuda.memory._dump_snapshot()` writes
/// (.pickle, .pickle.gz, .pickle.zst or JSON) and explains them: peaks, leaks,
/// fragmentation, OOMs, and what `PYTORCH_CUDA_ALLOC_CONF` would change.
#[derive(Parser, Debug)]
#[command(
    name = "memlens",
    version,
    about,
    long_about = None,
    after_help = "Example:\n  memlens doctor run.pickle.zst      (no snapshot: the example built into memlens)\n\nExit codes:\n  0  success\n  1  a check failed (`check`, `leaks --fail-on-leak`)\n  2  bad input or usage (one line on stderr naming the file and the problem),\n     or an output that could not be written"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The whole diagnosis: every analysis that applies, a verdict and an HTML report.
    Doctor(commands::doctor::Args),
    /// Allocator state at dump time: reserved, allocated, fragmentation, trace counts.
    Summary(commands::summary::Args),
    /// Replays the trace: the peak, and what was live at it by allocation site.
    Peak(commands::peak::Args),
    /// Memory allocated and freed by each line of a function (a line profiler).
    Lines(commands::lines::Args),
    /// What snapshot B holds that A did not, and the reverse, by allocation site.
    Diff(commands::diff::Args),
    /// Leak candidates: sites whose live memory keeps growing.
    Leaks(commands::leaks::Args),
    /// Why an allocation failed and what would fix it.
    Oom(commands::oom::Args),
    /// Replays the trace through the allocator model under other settings.
    Simulate(commands::simulate::Args),
    /// The allocator's state right after one event: what was live, by site.
    State(commands::state::Args),
    /// Simulates the usual PYTORCH_CUDA_ALLOC_CONF settings and ranks them.
    Tune(commands::tune::Args),
    /// Writes the self-contained interactive HTML report.
    Report(commands::report::Args),
    /// Memory a training step will need, before running it.
    Estimate(commands::estimate::Args),
    /// Will the run fit at another batch size, and the largest batch that fits (from two probes).
    Fit(commands::fit::Args),
    /// Live per-process GPU memory with the allocator's view.
    Top(commands::top::Args),
    /// A memory gate for CI: fails when the peak exceeds a limit.
    Check(commands::check::Args),
    /// Writes snapshots as Parquet tables (events, blocks, segments, frames) for DuckDB or Spark.
    #[cfg(feature = "export")]
    Export(commands::export::Args),
    /// A Model Context Protocol server over stdio, for coding agents.
    #[cfg(feature = "mcp")]
    Mcp(commands::mcp::Args),
}

/// Runs the CLI on `argv` (program name first) and returns the exit code:
/// 0 success, 1 a check failed, 2 bad input or usage.
pub fn run<I, T>(argv: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and version are successes; everything else is a usage error.
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 2,
            };
        }
    };
    let result = match cli.command {
        Command::Doctor(a) => commands::doctor::run(a),
        Command::Summary(a) => commands::summary::run(a),
        Command::Peak(a) => commands::peak::run(a),
        Command::Lines(a) => commands::lines::run(a),
        Command::Diff(a) => commands::diff::run(a),
        Command::Leaks(a) => commands::leaks::run(a),
        Command::Oom(a) => commands::oom::run(a),
        Command::Simulate(a) => commands::simulate::run(a),
        Command::State(a) => commands::state::run(a),
        Command::Tune(a) => commands::tune::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Estimate(a) => commands::estimate::run(a),
        Command::Fit(a) => commands::fit::run(a),
        Command::Top(a) => commands::top::run(a),
        Command::Check(a) => commands::check::run(a),
        #[cfg(feature = "export")]
        Command::Export(a) => commands::export::run(a),
        #[cfg(feature = "mcp")]
        Command::Mcp(a) => commands::mcp::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => output::fail(&e),
    }
}
