#!/usr/bin/env bash
# The 64-rank benchmark (issue 34): writes N rank files of about MB each from
# a real recording (bench/make_ranks.py: its trace repeated, a buffer of a
# different size on each rank, 512 MiB on the heavy one), then times
# `memlens doctor` on the folder (peak RSS too), and checks each rank's peak
# against the recording's GPU figure plus its buffer, and that the heavy rank
# and its line are found. Run on the GPU host (16 cores), through `device`:
#
#   bash bench/ranks_job.sh SRC.pickle.gz N MB [MEMLENS]
#
# The files go to /dev/shm when it has room (the host's disk is 64 GiB).
set -euo pipefail
src=$1 n=$2 mb=$3 bin=${4:-target/release/memlens}
need=$((n * mb * 105 / 100))
shm=$(df -m --output=avail /dev/shm | tail -1)
if [ "$shm" -gt "$need" ]; then dir=/dev/shm/ranks; else dir=${TMPDIR:-/tmp}/ranks; fi
rm -rf "$dir"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB RAM, $(lscpu | sed -n 's/^Model name: *//p'); files in $dir"
start=$(date +%s.%N)
python3 bench/make_ranks.py "$src" "$dir" "$n" "$mb"
echo "written in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}') s ($(du -sh "$dir" | cut -f1))"
out=$(mktemp -d)
for run in 1 2; do
  /usr/bin/time -f "%e %M" -o "$out/t" "$bin" doctor --json --no-report "$dir" > "$out/doctor.json"
  read -r wall rss < "$out/t"
  echo "doctor --no-report, run $run: $wall s, peak RSS $((rss / 1024)) MB"
done
/usr/bin/time -f "%e %M" -o "$out/t" "$bin" doctor -o "$out/report.html" "$dir" > /dev/null
read -r wall rss < "$out/t"
echo "doctor (report written, $(du -h "$out/report.html" | cut -f1)): $wall s, peak RSS $((rss / 1024)) MB"
python3 - "$dir/expected.json" "$out/doctor.json" <<'PY'
import json, sys
expected, got = (json.load(open(p)) for p in sys.argv[1:3])
rows = got["ranks"]
exact = sum(r["peak_allocated_bytes"] == e["peak_allocated"] for r, e in zip(rows, expected["ranks"]))
print(f"rank peaks equal to the GPU's figure plus the buffer: {exact} / {len(expected['ranks'])}")
im = got["diagnosis"]["ranks"]["imbalance"] or {}
site = (im.get("sites") or [{}])[0].get("site")
print(f"heavy rank found: {im.get('rank')} (planted {expected['heavy_rank']}), at {site} (planted {expected['site']})")
ok = exact == len(rows) == len(expected["ranks"]) and im.get("rank") == expected["heavy_rank"] and site == expected["site"]
print("PASS" if ok else "FAIL")
PY
python3 - "$dir/job.rank0.pickle" <<'PY'
import pickle, sys, time, resource
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    pickle.load(f)
print(f"for comparison, pickle.load of one rank file: {time.perf_counter() - t:.1f} s, "
      f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
PY
rm -rf "$dir"
