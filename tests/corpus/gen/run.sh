#!/usr/bin/env bash
# Records the real-world corpus on a machine with an NVIDIA GPU, PyTorch and
# transformers (no network needed):
#
#   tests/corpus/gen/run.sh OUTDIR [MEMLENS_WHEEL]
#
# Copies model.py and train.py to $PROJ (default /home/user/proj) so the frames
# read like a user's project, then runs every workload of train.py in its own
# process, all at once (each process has its own allocator, so they do not
# disturb each other's snapshots). The memlens.record workloads need the wheel (built by
# tests/python/run.sh). Writes OUTDIR/NAME.pickle (+ NAME.stepK.pickle),
# NAME.truth.json and log.NAME.txt. Compress with `zstd -19` into tests/corpus/.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mkdir -p "${1:?usage: run.sh OUTDIR [WHEEL]}" && cd "$1" && pwd)
PROJ=${PROJ:-/home/user/proj}
mkdir -p "$PROJ" && cp "$HERE/model.py" "$HERE/train.py" "$PROJ/"
if [ -n "${2:-}" ]; then
    SITE=$(mktemp -d)/site
    python3 -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$SITE" "$2" || exit 1
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
cd "$PROJ"
run() { timeout 240 python3 "$PROJ/train.py" "$D" "$1" > "$D/log.$1.txt" 2>&1; echo "$1: $(tail -1 "$D/log.$1.txt")"; }
for w in default_all prog_python prog_all one_step compiled forward_only forward_only_preloaded notebook hf_default; do
    run $w &
done
if [ -n "${2:-}" ]; then
    for w in clean leak_kept_logits leak_losses leak_eval_nograd; do run $w & done
fi
wait
