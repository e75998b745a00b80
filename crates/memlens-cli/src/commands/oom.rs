//! `memlens oom`.

/// Arguments of `memlens oom`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens oom`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens oom` is not implemented yet")
}
