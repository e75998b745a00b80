#!/usr/bin/env bash
# Runs tests/gpu/modules.py (issue 22's recordings) on a machine with an NVIDIA
# GPU, torch and transformers (no network): installs a memlens wheel into a
# private directory, overlays the python/memlens tree of this checkout (the
# Python side of module naming and the line profiler), runs it, compresses
# the outputs for tests/corpus/modules/.
#
#   tests/gpu/modules.sh WHEEL OUTDIR [PYTHON_SRC]
set -uo pipefail
WHEEL=${1:?usage: tests/gpu/modules.sh WHEEL OUTDIR [PYTHON_SRC]}
OUTDIR=$(mkdir -p "$2" && cd "$2" && pwd)
SRC=${3:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
SITE=$(mktemp -d)/site
"$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$WHEEL" || { echo "FAIL install"; exit 1; }
if [ -n "$SRC" ]; then cp -r "$SRC"/memlens/. "$SITE/memlens/"; fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MEMLENS_RUNTIME_DIR="$OUTDIR/runtime"
"$PY" "$HERE/modules.py" "$OUTDIR" || exit 1
rm -rf "$OUTDIR/runtime"
for f in named.pickle plain.pickle planted.pickle trace.json src.tar; do
    [ -f "$OUTDIR/$f" ] && { if command -v zstd >/dev/null; then zstd -q -T0 -19 --rm -f "$OUTDIR/$f"; else gzip -9 -f "$OUTDIR/$f"; fi; }
done
ls -la "$OUTDIR"
