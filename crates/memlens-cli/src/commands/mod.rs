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

use anyhow::Context;
use std::path::Path;

/// Loads a snapshot, naming the file in the error.
pub fn load(path: &Path) -> anyhow::Result<memlens::Snapshot> {
    memlens::Snapshot::load(path)
        .with_context(|| format!("cannot read snapshot {}", path.display()))
}
