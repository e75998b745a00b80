//! `memlens summary`.

/// Arguments of `memlens summary`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens summary`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens summary` is not implemented yet")
}
