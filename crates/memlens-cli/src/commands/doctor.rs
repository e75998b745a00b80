//! `memlens doctor`.

/// Arguments of `memlens doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens doctor`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens doctor` is not implemented yet")
}
