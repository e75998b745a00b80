#!/usr/bin/env bash
# Benchmarks memlens against what users run today, side by side in one run.
#
#   bench/run.sh              make the inputs if missing, then time everything
#   ONLY=350 bench/run.sh     the 357 MB file only (RUNS=N: best of N for memlens, default 3)
#
# Inputs (bench/data/, ignored by git): large-350mb.pickle and large-1gb.pickle,
# made from ../shared/fixtures/long.pickle.zst by bench/make_large.py.
# bench/mcp_session.py: an MCP session of 100 questions of the 357 MB file (issue 36).
# For each file: `memlens summary` (whole program: read + summary), `memlens
# doctor --no-report` (every analysis, no HTML) and Python's `pickle.load`
# (what every Python tool does first), with wall time and peak RSS from
# /usr/bin/time, and the ratios issue 19 asks for; then memlens's phases (read,
# replay, simulate, tune) from the bench_phases example. memlens runs with one parsing thread (and one
# decompression thread for compressed inputs).
#
# Timings use the release profile, which carries no debug info (what users
# install). For perf/flamegraph work build the `profiling` profile instead:
#   cargo build --profile profiling -p memlens-cli   # release code + line tables,
#   perf record target/profiling/memlens summary bench/data/large-1gb.pickle
set -euo pipefail
cd "$(dirname "$0")/.."
FIX=${MEMLENS_FIXTURES:-../shared/fixtures}
mkdir -p bench/data
[ -f bench/data/large-350mb.pickle ] || python3 bench/make_large.py "$FIX/long.pickle.zst" bench/data/large-350mb.pickle 390
[ "${ONLY:-}" = 350 ] || [ -f bench/data/large-1gb.pickle ] || python3 bench/make_large.py "$FIX/long.pickle.zst" bench/data/large-1gb.pickle 1160
cargo build --release -q -p memlens-cli
cargo build --release -q -p memlens --example bench_phases
ML=target/release/memlens
PH=target/release/examples/bench_phases

RUNS=${RUNS:-3}
measure() { # label, runs, command...: prints the best wall of `runs` and its peak RSS; sets BEST
  local label=$1 runs=$2; shift 2
  local best="" rss="" out
  for _ in $(seq "$runs"); do
    out=$( { /usr/bin/time -f "%e %M" "$@" >/dev/null; } 2>&1 | tail -1)
    local w=${out% *} m=${out#* }
    if [ -z "$best" ] || [ "$(echo "$w < $best" | bc -l)" = 1 ]; then best=$w; rss=$m; fi
  done
  BEST=$best
  printf "| %-44s | %8.2f s | %8.0f MB |\n" "$label" "$best" "$(echo "$rss/1024" | bc -l)"
  RSS_KB=$rss
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
files="bench/data/large-350mb.pickle bench/data/large-1gb.pickle"
[ "${ONLY:-}" = 350 ] && files=bench/data/large-350mb.pickle
for f in $files; do
  size=$(stat -c %s "$f")
  echo
  echo "$f: $((size / 1000000)) MB"
  echo "| command | wall | peak RSS |"
  echo "|---|---|---|"
  cat "$f" >/dev/null  # warm the page cache so every program reads from memory
  measure "memlens summary (best of $RUNS)" "$RUNS" "$ML" summary "$f"; summary=$BEST; summary_rss=$RSS_KB
  measure "memlens summary --json" 1 "$ML" summary --json "$f"
  measure "memlens doctor --no-report (best of $RUNS)" "$RUNS" "$ML" doctor --no-report "$f"; doctor=$BEST
  measure "python3 pickle.load" 1 python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$f"; pl=$BEST
  echo
  awk -v s="$summary" -v d="$doctor" -v p="$pl" -v b="$size" -v r="$summary_rss" 'BEGIN {
    printf "summary: %.1fx faster than pickle.load, %.0f MB/s, RSS %.2fx the file; doctor %.2fx summary\n",
      p / s, b / s / 1e6, r * 1024 / b, d / s }'
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  "$PH" "$f" ${TUNE:+--tune}
done
