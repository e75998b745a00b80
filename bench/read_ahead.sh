#!/bin/bash
# Reading ahead on other cores (crates/memlens/src/pickle/ahead.rs), timed:
# `memlens summary` with two binaries, alternating, on the same files.
#
#   bench/read_ahead.sh OLD_BINARY NEW_BINARY FILE... [RUNS=5] [THREADS="0 8 4 2"]
#
# For each file: the outputs of both binaries must be identical; then for
# each thread count (0: rayon's default, all cores) RUNS timings of each
# binary, alternating, printed with the best and the median.
set -euo pipefail
old=$1 new=$2; shift 2
runs=${RUNS:-5}
for f in "$@"; do
    cmp <("$old" summary "$f") <("$new" summary "$f") >/dev/null \
        && echo "$(basename "$f"): same output" \
        || { echo "$(basename "$f"): OUTPUTS DIFFER"; exit 1; }
    size=$(stat -c %s "$f")
    for threads in ${THREADS:-0 8 4 2}; do
        for which in old new; do
            bin=$old; [ $which = new ] && bin=$new
            times=()
            for _ in $(seq "$runs"); do
                if [ "$threads" = 0 ]; then unset RAYON_NUM_THREADS; else export RAYON_NUM_THREADS=$threads; fi
                t=$( { /usr/bin/time -f %e "$bin" summary "$f" >/dev/null; } 2>&1 )
                times+=("$t")
            done
            unset RAYON_NUM_THREADS
            python3 - "$(basename "$f")" "$threads" "$which" "$size" "${times[@]}" <<'PY'
import statistics, sys
name, threads, which, size = sys.argv[1:5]
t = sorted(float(x) for x in sys.argv[5:])
best, med = t[0], statistics.median(t)
print(f"{name} threads={threads or 'all'} {which}: best {best:.2f} s ({int(size)/best/1e9:.2f} GB/s), "
      f"median {med:.2f} s ({int(size)/med/1e9:.2f} GB/s); runs {' '.join(f'{x:.2f}' for x in t)}")
PY
        done
    done
done
