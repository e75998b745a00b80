//! One module per subcommand: its arguments and a `run` that calls the library
//! and prints the document or the text the library renders.

pub mod check;
pub mod diff;
pub mod doctor;
pub mod estimate;
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

/// Loads the snapshots of one run, each under its file name.
pub fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, memlens::Snapshot)>> {
    paths
        .iter()
        .map(|p| Ok((p.display().to_string(), load(p)?)))
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
