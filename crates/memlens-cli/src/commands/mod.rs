//! One module per subcommand: its arguments and a `run` that calls the library
//! and renders the result.

pub mod check;
pub mod diff;
pub mod doctor;
pub mod estimate;
pub mod leaks;
pub mod oom;
pub mod peak;
pub mod report;
pub mod simulate;
pub mod summary;
pub mod top;
pub mod tune;

use std::path::Path;

/// Loads a snapshot; the library's error already names the file.
pub fn load(path: &Path) -> anyhow::Result<memlens::Snapshot> {
    Ok(memlens::Snapshot::load(path)?)
}
