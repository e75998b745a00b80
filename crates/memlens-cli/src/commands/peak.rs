//! `memlens peak`.

/// Arguments of `memlens peak`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens peak`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens peak` is not implemented yet")
}
