//! `memlens tune`.

/// Arguments of `memlens tune`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens tune`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens tune` is not implemented yet")
}
