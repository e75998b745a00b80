#!/usr/bin/env bash
# Runs tests/gpu/hf_callback.py on a machine with an NVIDIA GPU, torch and
# transformers (no network): installs the carried memlens wheel into a private
# directory, optionally overlays a newer python/memlens tree (pure Python,
# when the wheel was built earlier than the code under test), and runs it.
#
#   tests/gpu/hf_callback.sh WHEEL OUTDIR [PYTHON_SRC]
set -uo pipefail
WHEEL=${1:?usage: tests/gpu/hf_callback.sh WHEEL OUTDIR [PYTHON_SRC]}
OUTDIR=$(mkdir -p "$2" && cd "$2" && pwd)
SRC=${3:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site
{
    echo "== memlens HF callback GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), wheel $(basename "$WHEEL")"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$WHEEL" || { echo "FAIL install"; exit 1; }
    if [ -n "$SRC" ]; then cp -r "$SRC"/memlens/. "$SITE/memlens/"; fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" MEMLENS_RUNTIME_DIR="$OUTDIR/runtime"
    "$PY" "$HERE/hf_callback.py" "$OUTDIR/run"
} 2>&1 | tee "$OUTDIR/hf-callback-results.txt"
exit "${PIPESTATUS[0]}"
