#!/usr/bin/env bash
# GPU checks of the memlens Python package, for a machine with an NVIDIA GPU
# and PyTorch (no network needed). The wheel is built elsewhere
# (tests/python/run.sh, or MEMLENS_WHEEL=portable for older glibc) and carried:
#
#   tests/gpu/run.sh path/to/memlens-*.whl [OUTDIR]
#
# Installs the wheel into a private directory (no dependencies, no index),
# then trains a small model under memlens.record, plants a leak, provokes an
# OOM under a memory fraction and runs the pytest marker. Prints PASS/FAIL
# lines and a closing "N passed, N failed"; everything printed is also in
# OUTDIR/gpu-results.txt (default: tests/gpu/out), for tests/gpu/RESULTS.md.
# Takes well under a minute on an H100.
#
# The marker check needs pytest on that machine. Without network, carry it
# too: `pip download pytest -d wheelhouse` here, then
#   MEMLENS_GPU_WHEELHOUSE=wheelhouse tests/gpu/run.sh WHEEL
set -uo pipefail

WHEEL=${1:?usage: tests/gpu/run.sh path/to/memlens-*.whl [OUTDIR]}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUTDIR=$(mkdir -p "${2:-$HERE/out}" && cd "${2:-$HERE/out}" && pwd)
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site

{
    echo "== memlens GPU checks, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "== wheel $(basename "$WHEEL")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/INFO gpu: /'
    if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$WHEEL"; then
        echo "FAIL install: pip could not install $WHEEL"
        echo "0 passed, 1 failed"
        exit 1
    fi
    if ! "$PY" -c "import pytest" 2>/dev/null && [ -n "${MEMLENS_GPU_WHEELHOUSE:-}" ]; then
        "$PY" -m pip install -q --disable-pip-version-check --no-index \
            --find-links "$MEMLENS_GPU_WHEELHOUSE" --target "$SITE" pytest
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    export MEMLENS_RUNTIME_DIR="$OUTDIR/runtime"
    rm -rf "$OUTDIR/train" "$OUTDIR/leak" "$OUTDIR/oom" "$OUTDIR/marker" "$OUTDIR/multi"
    "$PY" "$HERE/gpu_checks.py" all "$OUTDIR"
} 2>&1 | tee "$OUTDIR/gpu-results.txt"
rc=${PIPESTATUS[0]}
rm -rf "$(dirname "$SITE")"
exit "$rc"
