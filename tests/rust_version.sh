#!/usr/bin/env bash
# The rust-version build (issue 15): builds the workspace with exactly the Rust
# release that Cargo.toml declares as `rust-version`, so the declaration is a
# tested fact rather than a hope.
#
# - If rustup has that toolchain (or can install it), `cargo +VERSION build`.
# - Else, if the active toolchain is that release, the build with it is the
#   rust-version build.
# - Else it fails and says why: the declared version cannot be checked here.
#
# Machines of this project have one toolchain and cannot fetch another, so
# rust-version is the release CI builds with (1.95), not an older one nobody
# builds with.
set -euo pipefail
cd "$(dirname "$0")/.."
declared=$(grep -m1 '^rust-version' Cargo.toml | cut -d'"' -f2)
active=$(rustc --version | awk '{print $2}')
same_release() { [ "$(echo "$1" | cut -d. -f1,2)" = "$(echo "$2" | cut -d. -f1,2)" ]; }

# A toolchain rustup has of the declared release (`1.95` matches `1.95.0-x86_64-...`).
installed() { command -v rustup >/dev/null && rustup toolchain list | awk '{print $1}' | grep -E "^${declared//./\\.}([.-]|$)" | head -1; }
toolchain=$(installed || true)
if [ -z "$toolchain" ] && command -v rustup >/dev/null && rustup toolchain install --profile minimal "$declared" >/dev/null 2>&1; then
    toolchain=$(installed || true)
fi
if [ -n "$toolchain" ]; then
    echo "rust-version $declared: building with toolchain $toolchain"
    cargo "+$toolchain" build --workspace --locked --quiet
elif same_release "$declared" "$active"; then
    echo "rust-version $declared: the active toolchain is rustc $active"
    cargo build --workspace --locked --quiet
else
    echo "rust-version $declared cannot be built here: the active rustc is $active and rustup cannot install $declared" >&2
    exit 1
fi
# Any std API newer than the declared version is flagged too (useful when the
# build above ran with a toolchain of the same release but a later patch).
cargo clippy --workspace --all-targets --quiet -- -D clippy::incompatible_msrv
echo "rust-version $declared: ok"
