//! One module per subcommand: its arguments and a `run` that calls the library
//! and prints the document or the text the library renders.

pub mod check;
pub mod diff;
pub mod doctor;
pub mod estimate;
#[cfg(feature = "export")]
pub mod export;
pub mod fit;
pub mod leaks;
pub mod lines;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod oom;
pub mod peak;
pub mod report;
pub mod simulate;
pub mod state;
pub mod summary;
pub mod top;
pub mod tune;

use std::path::{Path, PathBuf};

/// Loads a snapshot; the library's error already names the file. A step
/// traced with fake tensors is refused: see [`load_replayable`].
pub fn load(path: &Path) -> anyhow::Result<memlens::Snapshot> {
    let snap = load_replayable(path)?;
    snap.refuse_fake_trace(&path.display().to_string())?;
    Ok(snap)
}

/// [`load`] for the commands that replay a trace through the allocator
/// model (`fit`, `simulate`), which also take a step traced with fake
/// tensors (`memlens.trace_step`).
pub fn load_replayable(path: &Path) -> anyhow::Result<memlens::Snapshot> {
    Ok(memlens::Snapshot::load(path)?)
}

/// Loads snapshots, each under its file name: folders and quoted patterns
/// stand for the files in them, files are read in parallel, with a progress
/// bar on a terminal when there are several. The first bad file named on
/// the command line is the error; a bad file found in a folder is skipped
/// with a warning that says why.
pub fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    let snaps = read_all(paths)?;
    for (name, snap) in &snaps {
        snap.refuse_fake_trace(name)?;
    }
    Ok(snaps)
}

/// [`load_all`] that also takes steps traced with fake tensors (`fit`).
pub fn load_all_replayable(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    read_all(paths)
}

/// Snapshots read with their traces replayed beside the reader, each under
/// its file name, and those replays, in the same order.
pub struct ReadForPeak {
    /// The snapshots, each under its file name.
    pub snaps: Vec<(String, memlens::Snapshot)>,
    /// The replay beside the reader of each.
    pub passes: Vec<Option<std::sync::Arc<memlens::replay::during_read::PendingPass>>>,
}

/// [`load_all`] for the commands that report peaks (`doctor`, `report`):
/// each trace is replayed while it is read
/// ([`memlens::replay::during_read::load_many`]); the analyses take those
/// replays through [`memlens::analysis::peak::AnalysedSet::with_passes`].
pub fn load_all_for_peak(paths: &[PathBuf]) -> anyhow::Result<ReadForPeak> {
    let found = memlens::input::expand_found(paths)?;
    let files: Vec<PathBuf> = found.iter().map(|(p, _)| p.clone()).collect();
    let pb = progress(files.len());
    let loaded = memlens::replay::during_read::load_many(&files, || pb.inc(1));
    pb.finish_and_clear();
    let mut read = ReadForPeak {
        snaps: Vec::with_capacity(files.len()),
        passes: Vec::with_capacity(files.len()),
    };
    for r in keep_readable(&found, loaded)? {
        let (p, r) = r;
        r.snap.refuse_fake_trace(&p.display().to_string())?;
        read.snaps.push((p.display().to_string(), r.snap));
        read.passes.push(r.pass);
    }
    Ok(read)
}

/// The files read, in order: an error for a file named on the command line;
/// for one found in a folder or by a pattern, a warning naming it and why it
/// was skipped (a folder of runs holds other files too), so the rest are
/// analysed. An error when nothing was left.
fn keep_readable<T>(
    found: &[(PathBuf, bool)],
    loaded: Vec<memlens::Result<T>>,
) -> anyhow::Result<Vec<(PathBuf, T)>> {
    let mut kept = Vec::with_capacity(loaded.len());
    let mut first_skipped = None;
    for ((path, in_folder), r) in found.iter().zip(loaded) {
        match r {
            Ok(v) => kept.push((path.clone(), v)),
            Err(e) if *in_folder => {
                eprintln!("memlens: warning: skipped {e}");
                first_skipped.get_or_insert(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    match first_skipped {
        Some(e) if kept.is_empty() => Err(e.into()),
        _ => Ok(kept),
    }
}

/// A progress bar over `files` files, on a terminal when there are several.
fn progress(files: usize) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if files > 1 && std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(files as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "reading snapshots {bar:30} {pos}/{len} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

fn read_all(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    let found = memlens::input::expand_found(paths)?;
    let files: Vec<PathBuf> = found.iter().map(|(p, _)| p.clone()).collect();
    let pb = progress(files.len());
    let loaded = memlens::Snapshot::load_many_with(&files, || pb.inc(1));
    pb.finish_and_clear();
    Ok(keep_readable(&found, loaded)?
        .into_iter()
        .map(|(p, s)| (p.display().to_string(), s))
        .collect())
}

/// The loaded snapshots as the library's analyses of several snapshots take them.
pub fn named(snaps: &[(String, memlens::Snapshot)]) -> Vec<(String, &memlens::Snapshot)> {
    snaps.iter().map(|(n, s)| (n.clone(), s)).collect()
}

/// The profiler trace at `path` when it is one (a Chrome trace exported by
/// torch.profiler), else `None` (a snapshot, read by [`load`]).
pub fn profiler_trace(path: &Path) -> anyhow::Result<Option<memlens::profiler::ProfilerTrace>> {
    match memlens::input::kind(path)? {
        memlens::input::InputKind::ProfilerTrace => {
            Ok(Some(memlens::profiler::ProfilerTrace::load(path)?))
        }
        memlens::input::InputKind::Snapshot => Ok(None),
    }
}
