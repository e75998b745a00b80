#!/usr/bin/env bash
# Builds the memlens wheel (maturin, abi3, CPython >= 3.9), installs it in a
# fresh virtualenv and runs the Python tests against it. Needs no GPU and no
# torch: the capture code is exercised with a fake torch (fake_torch.py).
#
#   tests/python/run.sh              build + test
#   PYTHON=python3.9 tests/python/run.sh    test under another interpreter
#   MEMLENS_WHEEL=portable tests/python/run.sh   build a manylinux2014 wheel
#                                    with zig (to carry to other machines)
#   extra arguments go to pytest
#
# The wheel is left in target/python/wheels/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
WORK=$ROOT/target/python
BUILD_VENV=$WORK/build-venv
TEST_VENV=$WORK/test-venv
WHEELS=$WORK/wheels

mkdir -p "$WORK"
cd "$ROOT"

# 1. maturin in its own virtualenv (kept between runs).
if [ ! -x "$BUILD_VENV/bin/maturin" ]; then
    python3 -m venv "$BUILD_VENV"
    "$BUILD_VENV/bin/pip" install -q --disable-pip-version-check "maturin>=1.9.4,<2"
fi

# 2. The wheel.
rm -rf "$WHEELS"
compat=()
if [ "${MEMLENS_WHEEL:-}" = portable ]; then
    "$BUILD_VENV/bin/pip" install -q --disable-pip-version-check ziglang
    compat=(--zig --compatibility manylinux2014)
fi
# The command line ships inside the package as a binary (the extension module
# links the library only). It is copied in for the build and removed after, so
# the source tree keeps nothing untracked (maturin leaves out git-ignored files,
# so it cannot be ignored instead).
echo "== building the memlens binary (release)"
cargo build --release --locked -p memlens-cli
BIN_DIR=$ROOT/python/memlens/_bin
trap 'rm -rf "$BIN_DIR"' EXIT
mkdir -p "$BIN_DIR"
cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/memlens" "$BIN_DIR/memlens"
echo "== building the wheel (release)"
# maturin finds zig as `python3 -m ziglang` on the PATH: the build venv's.
PATH="$BUILD_VENV/bin:$PATH" "$BUILD_VENV/bin/maturin" build --release --out "$WHEELS" "${compat[@]}"
rm -rf "$BIN_DIR"
WHEEL=$(ls "$WHEELS"/memlens-*.whl)
echo "== built $WHEEL"
case "$WHEEL" in
    *-cp39-abi3-*manylinux*) ;;
    *) echo "expected an abi3 manylinux wheel, got $WHEEL" >&2; exit 1 ;;
esac

# 3. A fresh virtualenv with the wheel and pytest; no torch, no pandas.
rm -rf "$TEST_VENV"
"$PY" -m venv "$TEST_VENV"
"$TEST_VENV/bin/pip" install -q --disable-pip-version-check "$WHEEL" "pytest>=7"
# pyarrow (and zstandard to read the fixtures) for Snapshot.to_arrow()'s
# test; it is skipped if they cannot be installed (no network).
"$TEST_VENV/bin/pip" install -q --disable-pip-version-check pyarrow zstandard \
    || echo "== pyarrow not installed: the to_arrow test is skipped"

# 4. The tests, from outside the source tree so `import memlens` is the wheel.
echo "== pytest ($("$TEST_VENV/bin/python" --version))"
cd "$WORK"
export MEMLENS_FIXTURES=${MEMLENS_FIXTURES:-$ROOT/../shared/fixtures}
"$TEST_VENV/bin/python" -m pytest -p no:cacheprovider -q "$ROOT/tests/python" "$@"
