//! `memlens top`.

/// Arguments of `memlens top`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens top`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens top` is not implemented yet")
}
