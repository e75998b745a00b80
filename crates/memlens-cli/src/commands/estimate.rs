//! `memlens estimate`.

/// Arguments of `memlens estimate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens estimate`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens estimate` is not implemented yet")
}
