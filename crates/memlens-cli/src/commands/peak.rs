//! `memlens peak`: the peak and what was live at it, by allocation site or by module.

use crate::output;
use memlens::analysis::modules::modules_at_peak;
use memlens::analysis::peak::peak_analysed;
use memlens::render;
use memlens::source::SourceFinder;
use memlens::trace::Analysed;
use std::path::PathBuf;

/// How `memlens peak` groups what was live.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// By allocation site and category.
    Site,
    /// By the modules whose forward allocated it, as a tree.
    Module,
}

/// Arguments of `memlens peak`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  memlens peak run.pickle.zst --top 5\n  memlens peak run.pickle.zst --by module --depth 4"
)]
pub struct Args {
    /// The snapshot, or a Chrome trace exported by torch.profiler with profile_memory=True.
    pub snapshot: PathBuf,
    /// How many sites to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Group by allocation site, or by module (module instances when recorded
    /// with memlens.record(model=...), else the classes of the forward frames).
    #[arg(long, value_enum, default_value_t = By::Site)]
    pub by: By,
    /// Levels of the module tree shown (--by module).
    #[arg(long, default_value_t = 4)]
    pub depth: usize,
    /// Where to look for the source files the frames name, to read the class
    /// of each forward (repeatable; also MEMLENS_SOURCE_ROOT).
    #[arg(long, value_name = "DIR")]
    pub source_root: Vec<PathBuf>,
    /// Print the JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `memlens peak`.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(trace) = super::profiler_trace(&args.snapshot)? {
        let r = memlens::profiler::peak(&trace, args.top);
        output::print(&r, args.json, render::profiler::peak_text)?;
        return Ok(output::OK);
    }
    let read = memlens::replay::during_read::load(&args.snapshot)?;
    read.snap
        .refuse_fake_trace(&args.snapshot.display().to_string())?;
    let an = Analysed::with_pass(&read.snap, read.pass);
    match args.by {
        By::Site => output::print(&peak_analysed(&an, args.top), args.json, render::peak::text)?,
        By::Module => {
            let finder = SourceFinder::with_env(args.source_root);
            let r = modules_at_peak(&an, &finder);
            output::print(&r, args.json, |r| render::modules::text(r, args.depth))?
        }
    }
    Ok(output::OK)
}
