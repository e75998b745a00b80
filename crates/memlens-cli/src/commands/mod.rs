//! One module per subcommand: its arguments and a `run` that calls the library
//! and prints the document or the text the library renders.

pub mod check;
pub mod diff;
pub mod doctor;
pub mod estimate;
#[cfg(feature = "export")]
pub mod export;
pub mod leaks;
pub mod lines;
pub mod oom;
pub mod peak;
pub mod report;
pub mod simulate;
pub mod summary;
pub mod top;
pub mod tune;

use std::path::{Path, PathBuf};

/// Loads a snapshot; the library's error already names the file.
pub fn load(path: &Path) -> anyhow::Result<memlens::Snapshot> {
    Ok(memlens::Snapshot::load(path)?)
}

/// Loads snapshots, each under its file name: folders and quoted patterns
/// stand for the files in them, files are read in parallel, with a progress
/// bar on a terminal when there are several. The first bad file (in the
/// order given) is the error.
pub fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    read_all(paths, false)
}

/// [`load_all`] for the commands that report the last snapshot's peak: its
/// trace is replayed while it is read ([`memlens::Snapshot::load_many_for_peak`]).
pub fn load_all_for_peak(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    read_all(paths, true)
}

fn read_all(paths: &[PathBuf], for_peak: bool) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    use std::io::IsTerminal;
    let files = memlens::input::expand(paths)?;
    let pb = if files.len() > 1 && std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(files.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "reading snapshots {bar:30} {pos}/{len} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let loaded = if for_peak {
        memlens::Snapshot::load_many_for_peak(&files, || pb.inc(1))
    } else {
        memlens::Snapshot::load_many_with(&files, || pb.inc(1))
    };
    pb.finish_and_clear();
    files
        .iter()
        .zip(loaded)
        .map(|(p, r)| Ok((p.display().to_string(), r?)))
        .collect()
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
