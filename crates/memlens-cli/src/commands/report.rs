//! `memlens report`.

/// Arguments of `memlens report`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens report`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens report` is not implemented yet")
}
