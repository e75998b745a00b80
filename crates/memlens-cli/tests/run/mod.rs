//! Helpers shared by the tests that run the `memlens` binary on the real
//! snapshots in `../shared/fixtures` (or `MEMLENS_FIXTURES`). Each test file
//! uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fixtures folder.
pub fn fixtures() -> PathBuf {
    std::env::var("MEMLENS_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
        })
}

/// The path of fixture `name`, as an argument.
pub fn fixture(name: &str) -> String {
    fixtures().join(name).to_string_lossy().into_owned()
}

/// The JSON document `memlens ARGS` prints; the command must succeed.
pub fn json(args: &[&str]) -> serde_json::Value {
    let out = memlens(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Runs `memlens ARGS`.
pub fn memlens(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .output()
        .expect("memlens runs")
}

/// Runs `memlens ARGS` in folder `dir`.
pub fn memlens_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memlens"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("memlens runs")
}

/// A block of `size` bytes allocated at `frames` (innermost first), as a
/// JSON snapshot holds it.
pub fn json_block(size: u64, frames: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"size": size, "requested_size": size, "state": "active_allocated",
        "frames": frames})
}

/// A JSON snapshot with no trace: one segment on device 0 exactly filled by
/// `blocks` (from [`json_block`]).
pub fn json_snapshot(blocks: Vec<serde_json::Value>) -> serde_json::Value {
    let total: u64 = blocks.iter().filter_map(|b| b["size"].as_u64()).sum();
    serde_json::json!({
        "segments": [{"device": 0, "address": 1u64 << 32, "total_size": total, "stream": 0,
            "segment_type": "large", "allocated_size": total, "active_size": total,
            "requested_size": total, "blocks": blocks}],
        "device_traces": [[]]})
}
