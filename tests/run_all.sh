#!/usr/bin/env bash
# Runs the whole test suite, as CI does: formatting, lints, the Rust tests
# (unit + integration over ../shared/fixtures), then the Python package tests
# and the browser test of the HTML report when their scripts are present.
# Each part installs what it needs. GPU tests live in tests/gpu/ and are not
# run here (CI has no GPU).
#
# Every part runs even when an earlier one failed (a failing lint does not
# hide a failing test); a summary line per part is printed at the end, and
# the exit status is 1 if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

RESULTS=()
FAILED=0

# part NAME COMMAND...: runs one part, noting whether it passed and how long it took.
part() {
    local name=$1
    shift
    echo "== $name"
    local start=$SECONDS
    "$@"
    local rc=$?
    if [ "$rc" -eq 0 ]; then
        RESULTS+=("PASS  $name ($((SECONDS - start)) s)")
    else
        RESULTS+=("FAIL  $name ($((SECONDS - start)) s, exit $rc)")
        FAILED=1
    fi
}

part "cargo fmt --check" cargo fmt --all -- --check
part "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
# `memlens top` without its NVML source (cargo feature `nvml`) must lint too.
part "cargo clippy --no-default-features -D warnings" \
    cargo clippy -p memlens -p memlens-cli --all-targets --no-default-features -- -D warnings
part "rust-version build (tests/rust_version.sh)" bash tests/rust_version.sh
part "cargo doc -D warnings" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
part "cargo test" cargo test --workspace --no-fail-fast
part "fuzz smoke run (60 s)" bash tests/fuzz_smoke.sh 60
for name in python browser export mcp; do
    if [ -f "tests/$name/ci.sh" ]; then
        part "tests/$name/ci.sh" bash "tests/$name/ci.sh"
    fi
done

echo
echo "== summary"
printf '%s\n' "${RESULTS[@]}"
if [ "$FAILED" -ne 0 ]; then
    echo "== some parts failed"
    exit 1
fi
echo "== all tests passed"
