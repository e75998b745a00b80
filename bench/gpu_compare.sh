#!/usr/bin/env bash
# Side by side where PyTorch is installed (the GPU machine): memlens against
# pickle.load and PyTorch's own `python -m torch.cuda._memory_viz stats`.
#
#   bench/gpu_compare.sh MEMLENS_BINARY LONG_PICKLE_ZST
#   ONLY=350 bench/gpu_compare.sh ...      the 357 MB file only
set -uo pipefail
ML=$(realpath "$1"); SRC=$(realpath "$2"); D=${TMPDIR:-/tmp}/memlens-bench
mkdir -p "$D"; cd "$(dirname "$0")"
[ -f "$D/large-350mb.pickle" ] || python3 make_large.py "$SRC" "$D/large-350mb.pickle" 390
files="$D/large-350mb.pickle $D/large-1gb.pickle"
if [ "${ONLY:-}" = 350 ]; then files=$D/large-350mb.pickle
else [ -f "$D/large-1gb.pickle" ] || python3 make_large.py "$SRC" "$D/large-1gb.pickle" 1160; fi
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), torch $(python3 -c 'import torch; print(torch.__version__)')"
printf 'import pickle, sys\npickle.load(open(sys.argv[1], "rb"))\n' > "$D/load.py"
run() { # label, command...
  local label=$1; shift
  /usr/bin/time -f "  %e s wall  %M KB peak RSS  :: $label" "$@" > /dev/null 2> "$D/err" || echo "  (failed: $(tail -1 "$D/err"))"
  tail -1 "$D/err"
}
for f in $files; do
  cat "$f" > /dev/null
  echo "$(basename "$f"): $(( $(stat -c %s "$f") / 1000000 )) MB"
  run "memlens summary" "$ML" summary "$f"
  run "memlens summary" "$ML" summary "$f"
  run "memlens doctor --no-report" "$ML" doctor --no-report "$f"
  run "memlens doctor --no-report" "$ML" doctor --no-report "$f"
  run "python3 pickle.load" python3 "$D/load.py" "$f"
  run "python3 -m torch.cuda._memory_viz stats" python3 -m torch.cuda._memory_viz stats "$f"
done
