#!/usr/bin/env bash
# Runs the whole test suite, as CI does: formatting, lints, the Rust tests
# (unit + integration over ../shared/fixtures), then the Python package tests
# and the browser test of the HTML report when their scripts are present.
# Each part installs what it needs. GPU tests live in tests/gpu/ and are not
# run here (CI has no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# `memlens top` without its NVML source (cargo feature `nvml`) must lint too.
cargo clippy -p memlens -p memlens-cli --all-targets --no-default-features -- -D warnings
echo "== rust-version build (tests/rust_version.sh)"
bash tests/rust_version.sh
echo "== cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "== cargo test"
cargo test --workspace --no-fail-fast
echo "== fuzz smoke run (60 s)"
bash tests/fuzz_smoke.sh 60
for part in python browser export; do
  if [ -f "tests/$part/ci.sh" ]; then
    echo "== tests/$part/ci.sh"
    bash "tests/$part/ci.sh"
  fi
done
echo "== all tests passed"
