#!/usr/bin/env bash
# Issue 14's acceptance checks on a GPU machine with PyTorch (no network needed):
#
#   tests/gpu/realworld.sh path/to/memlens-*.whl path/to/memlens [OUTDIR]
#
# Installs the wheel into a private directory, copies the corpus workloads
# (tests/corpus/gen) to $PROJ (default /home/user/proj, like a user's project)
# and runs realworld.py: 10 clean runs of the ~100 ms/step transformer under
# memlens.record (no LeakWarning, no alarm in `memlens top`), the three planted
# leaks (the alarm fires and names the call path), and `memlens leaks` /
# `memlens doctor` on their periodic snapshots alone and final trace alone.
# Prints PASS/FAIL lines and "N passed, N failed"; all of it also goes to
# OUTDIR/realworld-results.txt (default tests/gpu/out-realworld), for RESULTS.md.
# About 2-3 minutes on an H100.
set -uo pipefail
WHEEL=$(realpath "${1:?usage: realworld.sh WHEEL MEMLENS_BINARY [OUTDIR]}")
ML=$(realpath "${2:?memlens binary}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUTDIR=$(mkdir -p "${3:-$HERE/out-realworld}" && cd "${3:-$HERE/out-realworld}" && pwd)
PROJ=${PROJ:-/home/user/proj}
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site
{
    echo "== memlens real-world checks, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "== wheel $(basename "$WHEEL"), binary $("$ML" --version 2>&1)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/INFO gpu: /'
    if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$WHEEL"; then
        echo "FAIL install: pip could not install $WHEEL"; echo "0 passed, 1 failed"; exit 1
    fi
    mkdir -p "$PROJ" && cp "$HERE/../corpus/gen/model.py" "$HERE/../corpus/gen/train.py" "$PROJ/"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export MEMLENS_RUNTIME_DIR="$OUTDIR/runtime"
    rm -rf "$OUTDIR/leaks" "$OUTDIR/clean_runs"
    "$PY" "$HERE/realworld.py" all "$OUTDIR" --proj "$PROJ" --memlens "$ML" --runs "${RUNS:-10}"
} 2>&1 | tee "$OUTDIR/realworld-results.txt"
rc=${PIPESTATUS[0]}
rm -rf "$(dirname "$SITE")"
exit "$rc"
