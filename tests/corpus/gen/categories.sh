#!/usr/bin/env bash
# Records issue 31's category cases (categories.py) on a machine with an NVIDIA
# GPU, PyTorch, torchvision and transformers (no network needed):
#
#   tests/corpus/gen/categories.sh OUTDIR
#
# As run.sh: copies the project to $PROJ (default /home/user/proj) so frames
# read like a user's, runs each case in its own process (all at once), and
# compresses each snapshot with `zstd -19` for tests/corpus/categories/.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mkdir -p "${1:?usage: categories.sh OUTDIR}" && cd "$1" && pwd)
PROJ=${PROJ:-/home/user/proj}
mkdir -p "$PROJ" && cp "$HERE/model.py" "$HERE/train.py" "$HERE/categories.py" "$PROJ/"
export PYTHONUNBUFFERED=1
cd "$PROJ"
run() { timeout 300 python3 "$PROJ/categories.py" "$D" "$1" > "$D/log.$1.txt" 2>&1; echo "$1: $(tail -1 "$D/log.$1.txt")"; }
for w in kv_generate kv_generate_freed cuda_graph sidestream compiled_backward resnet50_amp resnet50_amp_all; do
    run $w &
done
wait
if command -v zstd > /dev/null; then Z="zstd -q -19 -f --rm"; else Z="xz -9 -f"; fi
for f in "$D"/*.pickle; do $Z "$f"; done
ls -l "$D"
