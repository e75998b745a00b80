//! The `memlens` binary: a thin shell over [`memlens_cli::run`].

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(memlens_cli::run(std::env::args_os()))
}
