#!/usr/bin/env bash
# Issue 29's targets: `doctor` writing the report at most 2x `summary`,
# `doctor --no-report` at most 1.5x, on the 357 MB benchmark file and on the
# same trace with its first third cut off (a ring buffer that wrapped), peak
# RSS at most the file's size.
#
#   bash bench/doctor_report.sh [OTHER_MEMLENS]   (OTHER: a second binary, side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
FIX=${MEMLENS_FIXTURES:-../shared/fixtures}
mkdir -p bench/data
whole=bench/data/large-350mb.pickle cut=bench/data/large-350mb-cut.pickle
[ -f $whole ] || python3 bench/make_large.py "$FIX/long.pickle.zst" $whole 390
[ -f $cut ] || python3 bench/cut_trace.py $whole $cut
cargo build --release -q -p memlens-cli
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| file | binary | command | best of 3 | peak RSS | x summary |"
echo "|---|---|---|---|---|---|"
for f in $whole $cut; do
  cat $f >/dev/null
  for b in target/release/memlens ${1:-}; do
    summary=""
    for c in "summary" "doctor --no-report" "doctor -o $out/r.html"; do
      best=""; rss=0
      for _ in 1 2 3; do
        /usr/bin/time -f "%e %M" -o $out/t $b $c $f >/dev/null 2>&1
        read -r w m <$out/t
        if [ -z "$best" ] || [ "$(echo "$w < $best" | bc -l)" = 1 ]; then best=$w; rss=$m; fi
      done
      [ -z "$summary" ] && summary=$best
      printf "| %s | %s | %s | %s s | %d MB | %.2fx |\n" "$(basename $f)" "$b" "${c%% -o*}" "$best" $((rss / 1024)) "$(echo "$best / $summary" | bc -l)"
    done
  done
done
