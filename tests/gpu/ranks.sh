#!/usr/bin/env bash
# Records the 2-rank snapshots of tests/corpus/ranks/ on a machine with an
# NVIDIA GPU and PyTorch (no network: gloo on loopback, both ranks on GPU 0).
#
#   tests/gpu/ranks.sh OUTDIR
#
# Copies ranks.py (as train_ddp.py) and the corpus GPT (model.py) to
# /home/user/job/ so the frames read like a user's project, runs both jobs,
# and compresses the snapshots with zstd -19 when zstd is there.
set -uo pipefail
OUTDIR=$(mkdir -p "${1:?usage: tests/gpu/ranks.sh OUTDIR}" && cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJ=/home/user/job
mkdir -p "$PROJ"
cp "$HERE/ranks.py" "$PROJ/train_ddp.py"
cp "$HERE/../corpus/gen/model.py" "$PROJ/model.py"
cd "$PROJ"
{
    echo "== memlens 2-rank recording, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    python3 train_ddp.py launch "$OUTDIR"
    rc=$?
    if command -v zstd >/dev/null; then
        for f in "$OUTDIR"/*.pickle; do zstd -q -19 --rm "$f"; done
    else
        python3 - "$OUTDIR" <<'PY' || echo "no zstd: snapshots left uncompressed"
import glob, os, sys
import zstandard
for f in glob.glob(os.path.join(sys.argv[1], "*.pickle")):
    with open(f, "rb") as i, open(f + ".zst", "wb") as o:
        o.write(zstandard.ZstdCompressor(level=19).compress(i.read()))
    os.remove(f)
PY
    fi
    ls -l "$OUTDIR"
    exit $rc
} 2>&1 | tee "$OUTDIR/ranks-log.txt"
exit "${PIPESTATUS[0]}"
