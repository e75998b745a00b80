//! Turns bytes into a [`Snapshot`](super::Snapshot).

use super::Snapshot;
use crate::error::{Error, Result};
use std::path::Path;

/// Reads a snapshot file.
pub fn load_path(path: &Path) -> Result<Snapshot> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    load_bytes(&bytes, path)
}

/// Reads a snapshot from bytes in memory.
pub fn load_bytes(_bytes: &[u8], path: &Path) -> Result<Snapshot> {
    Err(Error::NotASnapshot {
        path: path.into(),
        what: "reader not written yet".into(),
    })
}
