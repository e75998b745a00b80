//! Files `memlens.record` writes beside a snapshot (`<snapshot><suffix>`):
//! evidence the snapshot itself cannot hold (what holds a leak, the device's
//! figures). Each is small JSON; a missing one is normal, a bad one is
//! reported in one phrase by its reader and never fails the analysis.

use serde::de::DeserializeOwned;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file with `suffix` that belongs to the snapshot at `snapshot`.
pub fn path_of(snapshot: &Path, suffix: &str) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The JSON file at `path`, read as `T`: `None` when there is none, an error
/// (one phrase) when it is unreadable, larger than `max_bytes` or not a `T`
/// (`what` names the kind of file in that phrase).
pub fn read_json<T: DeserializeOwned>(
    path: &Path,
    max_bytes: u64,
    what: &str,
) -> Result<Option<T>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("not readable ({e})")),
    };
    let mut text = String::new();
    file.take(max_bytes + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("not readable ({e})"))?;
    if text.len() as u64 > max_bytes {
        return Err(format!(
            "larger than {} (a {what} is a few KiB)",
            crate::units::format_bytes(max_bytes)
        ));
    }
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("not a {what} ({e})"))
}
