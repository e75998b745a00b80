//! `memlens leaks`.

/// Arguments of `memlens leaks`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `memlens leaks`.
pub fn run(_args: Args) -> anyhow::Result<u8> {
    anyhow::bail!("`memlens leaks` is not implemented yet")
}
