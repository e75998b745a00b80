//! `memlens diff`.

/// Arguments of `memlens diff`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens diff`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens diff` is not implemented yet")
}
