#!/usr/bin/env bash
# `memlens export` throughput on the 1 GB benchmark snapshot (issue 17: at
# least 200 MB/s of input, in bounded memory).
#
#   bench/export.sh [SNAPSHOT]     default bench/data/large-1gb.pickle (made by
#                                  bench/make_large.py as bench/run.sh does)
#
# Prints the input size, wall time, MB/s of input, peak RSS (from
# /usr/bin/time) and the Parquet sizes; the median of three runs is the figure
# for BENCHMARKS.md. Release build, as users install it.
set -euo pipefail
cd "$(dirname "$0")/.."
FIX=${MEMLENS_FIXTURES:-../shared/fixtures}
IN=${1:-bench/data/large-1gb.pickle}
if [ ! -f "$IN" ] && [ "$IN" = bench/data/large-1gb.pickle ]; then
  mkdir -p bench/data
  python3 bench/make_large.py "$FIX/long.pickle.zst" "$IN" 1160
fi
cargo build --release -q -p memlens-cli
ML=${CARGO_TARGET_DIR:-target}/release/memlens
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
size=$(stat -c %s "$IN")
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo "input: $IN, $((size / 1000000)) MB"
for run in 1 2 3; do
  rm -rf "$OUT/t"
  out=$( { /usr/bin/time -f "%e %M" "$ML" export "$IN" -o "$OUT/t" >/dev/null; } 2>&1 | tail -1)
  set -- $out
  echo "run $run: $1 s, $(echo "$size / 1000000 / $1" | bc -l | xargs printf '%.0f') MB/s, peak RSS $(( $2 / 1024 )) MB ($(echo "$2 * 1024 / $size" | bc -l | xargs printf '%.2f')x the file)"
done
du -b "$OUT"/t/*.parquet | awk '{printf "  %s %.1f MB\n", $2, $1/1e6}'
