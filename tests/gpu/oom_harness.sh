#!/usr/bin/env bash
# Issue 16's OOM evidence on a GPU machine with PyTorch (no network, no memlens needed):
#
#   tests/gpu/oom_harness.sh record OUTDIR            # snapshots at real OOMs + truth.json
#   tests/gpu/oom_harness.sh rerun OUTDIR FIXES.json  # rerun fixes, reruns.json
#   tests/gpu/oom_harness.sh slope OUTDIR             # gpt_warm's bytes per sample, slope.json
#
# Copies the corpus's student GPT (tests/corpus/gen/model.py) and the harness to $PROJ
# (default /home/user/proj, so the frames read like a user's project), runs
# oom_harness.py, and compresses the snapshots with zstd (xz where zstd is missing).
# About 3 minutes on an H100 for `record`; the snapshots are analysed elsewhere
# (tests/corpus/oom, crates/memlens/tests/oom_corpus.rs).
set -uo pipefail
CMD=${1:?usage: oom_harness.sh record|rerun|slope OUTDIR [FIXES.json]}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUTDIR=$(mkdir -p "${2:?OUTDIR}" && cd "$2" && pwd)
PROJ=${PROJ:-/home/user/proj}
PY=${PYTHON:-python3}
mkdir -p "$PROJ" && cp "$HERE/../corpus/gen/model.py" "$PROJ/" && cp "$HERE/oom_harness.py" "$PROJ/train_oom.py"
export PROJ PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/INFO gpu: /'
"$PY" -c 'import torch; print("INFO torch", torch.__version__)'
case "$CMD" in
record) "$PY" "$PROJ/train_oom.py" record "$OUTDIR" ;;
rerun) "$PY" "$PROJ/train_oom.py" rerun "$OUTDIR" "$(realpath "${3:?FIXES.json}")" ;;
slope) "$PY" "$PROJ/train_oom.py" slope "$OUTDIR" ;;
*) echo "unknown command $CMD"; exit 2 ;;
esac
rc=$?
for f in "$OUTDIR"/*.pickle; do
    [ -e "$f" ] || continue
    if command -v zstd >/dev/null; then zstd -q -12 --rm -f "$f"
    else "$PY" -c 'import lzma,sys,os; p=sys.argv[1]; open(p+".xz","wb").write(lzma.compress(open(p,"rb").read(), preset=6)); os.remove(p)' "$f"; fi
done
ls -la "$OUTDIR"
exit "$rc"
