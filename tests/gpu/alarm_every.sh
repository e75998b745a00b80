#!/usr/bin/env bash
# The in-process leak alarm on every-few-steps leaks and long clean loops
# (tests/gpu/alarm_every.py), on a GPU machine with PyTorch:
#
#   tests/gpu/alarm_every.sh path/to/memlens-*.whl
#
# Installs the wheel into a private directory and runs the checks; prints
# PASS/FAIL lines and "N passed, N failed". About 2 minutes on an H100.
set -uo pipefail
WHEEL=$(realpath "${1:?usage: alarm_every.sh WHEEL}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site
trap 'rm -rf "$(dirname "$SITE")"' EXIT
echo "== memlens leak alarm, every few steps, $(date -u +%Y-%m-%dT%H:%M:%SZ), wheel $(basename "$WHEEL")"
nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | sed 's/^/INFO gpu: /'
if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$WHEEL"; then
    echo "FAIL install: pip could not install $WHEEL"; echo "0 passed, 1 failed"; exit 1
fi
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    "$PY" "$HERE/alarm_every.py" --proj "$HERE/../corpus/gen"
