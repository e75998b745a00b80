#!/usr/bin/env bash
# Benchmarks memlens against what users run today, side by side in one run.
#
#   bench/run.sh              make the inputs if missing, then time everything
#
# Inputs (bench/data/, ignored by git): large-350mb.pickle and large-1gb.pickle,
# made from ../shared/fixtures/long.pickle.zst by bench/make_large.py.
# For each file: `memlens summary` (whole program: read + summary) and Python's
# `pickle.load` (what every Python tool does first), with wall time and peak
# RSS from /usr/bin/time; then memlens's phases (read, replay, simulate, tune)
# from the bench_phases example. memlens runs with one parsing thread (and one
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
[ -f bench/data/large-1gb.pickle ] || python3 bench/make_large.py "$FIX/long.pickle.zst" bench/data/large-1gb.pickle 1160
cargo build --release -q -p memlens-cli
cargo build --release -q -p memlens --example bench_phases
ML=target/release/memlens
PH=target/release/examples/bench_phases

measure() { # label, command...: prints label, wall seconds, peak RSS MB
  local label=$1; shift
  local out
  out=$( { /usr/bin/time -f "%e %M" "$@" >/dev/null; } 2>&1 | tail -1)
  set -- $out
  printf "| %-44s | %8.2f s | %8.0f MB |\n" "$label" "$1" "$(echo "$2/1024" | bc -l)"
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
for f in bench/data/large-350mb.pickle bench/data/large-1gb.pickle; do
  size=$(stat -c %s "$f")
  echo
  echo "$f: $((size / 1000000)) MB"
  echo "| command | wall | peak RSS |"
  echo "|---|---|---|"
  cat "$f" >/dev/null  # warm the page cache so both read from memory
  measure "memlens summary" "$ML" summary "$f"
  measure "memlens summary --json" "$ML" summary --json "$f"
  measure "python3 pickle.load" python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" "$f"
  echo
  "$PH" "$f" ${TUNE:+--tune}
done
