//! `memlens check`.

/// Arguments of `memlens check`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens check`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens check` is not implemented yet")
}
