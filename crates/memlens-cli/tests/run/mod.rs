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
