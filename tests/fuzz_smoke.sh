#!/usr/bin/env bash
# A short run of the fuzz target (fuzz/fuzz_targets/snapshot_reader.rs: reading,
# summary, replay, peak, leaks, oom, simulate) for tests/run_all.sh:
#
#   tests/fuzz_smoke.sh [SECONDS]      (default 60)
#
# Works on stable Rust: cargo-fuzz with `-s none` (no sanitizer; nightly is only
# needed for ASan). cargo-fuzz is installed from crates.io when missing. The
# corpus grows in target/fuzz-corpus (ignored, outside tracked folders), seeded
# from fuzz/seeds (small hand-made cases and minimised fixtures); findings go
# to target/fuzz-artifacts/. The seeds themselves also run as a plain test on
# every `cargo test` (crates/memlens/tests/fuzz_seeds.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (cargo install --locked cargo-fuzz)"
  cargo install --locked cargo-fuzz
fi
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
corpus=$target/fuzz-corpus
artifacts=$target/fuzz-artifacts
mkdir -p "$corpus" "$artifacts"
cd fuzz
# The fuzz crate keeps its own build folder (fuzz/target, ignored): its code is
# instrumented, unlike the workspace's.
CARGO_TARGET_DIR=$root/fuzz/target cargo fuzz run -s none snapshot_reader "$corpus" seeds -- \
  -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=20 \
  -artifact_prefix="$artifacts/" -print_final_stats=1
