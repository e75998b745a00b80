#!/usr/bin/env bash
# Records issue 31's item 2 cases (runs.py: an A/B pair, a 12-step DDP folder)
# on a machine with one NVIDIA GPU and PyTorch (no network needed):
#
#   tests/corpus/gen/runs.sh OUTDIR
#
# As run.sh: the project is copied to $PROJ (default /home/user/proj) so frames
# read like a user's. Compress the snapshots with `zstd -19` for
# tests/corpus/runs/.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mkdir -p "${1:?usage: runs.sh OUTDIR}" && cd "$1" && pwd)
PROJ=${PROJ:-/home/user/proj}
mkdir -p "$PROJ" && cp "$HERE/model.py" "$HERE/train.py" "$HERE/runs.py" "$PROJ/"
export PYTHONUNBUFFERED=1
cd "$PROJ"
timeout 300 python3 "$PROJ/runs.py" "$D" ab > "$D/log.ab.txt" 2>&1; echo "ab: $(tail -1 "$D/log.ab.txt")"
timeout 300 python3 "$PROJ/runs.py" "$D" ddp12 > "$D/log.ddp12.txt" 2>&1; echo "ddp12: $(tail -1 "$D/log.ddp12.txt")"
if command -v zstd > /dev/null; then Z="zstd -q -19 -f --rm"; else Z="xz -9 -f"; fi
for f in "$D"/*/*.pickle; do $Z "$f"; done
ls -l "$D"/*
