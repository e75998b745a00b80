//! `memlens simulate`.

/// Arguments of `memlens simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens simulate`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens simulate` is not implemented yet")
}
