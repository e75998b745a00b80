//! The `memlens` binary: a thin shell over [`memlens_cli::run`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = memlens_cli::run(std::env::args_os());
    // How often the costly passes ran (replays, analysed traces), for the
    // test that holds each command to one (`crates/memlens-cli/tests/one_pass.rs`).
    if std::env::var_os("MEMLENS_WORK_COUNTS").is_some() {
        eprintln!("memlens work counts: {}", memlens::work::counts_line());
    }
    ExitCode::from(code)
}
