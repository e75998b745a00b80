#!/usr/bin/env bash
# End-to-end on a GPU machine: record fresh snapshots with the fixture
# workloads, then check memlens on them against torch.cuda.memory_stats().
#
#   tests/gpu/e2e.sh MEMLENS_BINARY WORKLOADS_PY [OUTDIR]
#
# WORKLOADS_PY is ../shared/fixtures/gen/workloads.py (carry a copy). Prints
# PASS/FAIL lines and a closing "N passed, N failed".
set -uo pipefail
ML=$(realpath "${1:?usage: e2e.sh MEMLENS_BINARY WORKLOADS_PY [OUTDIR]}")
WL=$(realpath "${2:?workloads.py}")
OUT=$(mkdir -p "${3:-/tmp/memlens-e2e}" && cd "${3:-/tmp/memlens-e2e}" && pwd)
pass=0; fail=0
ok() { echo "PASS $*"; pass=$((pass + 1)); }
ko() { echo "FAIL $*"; fail=$((fail + 1)); }
export PYTHONUNBUFFERED=1
for w in gpt2_eval_leak cache_leak oom; do
  if (cd "$(dirname "$WL")" && timeout 300 python3 "$WL" "$OUT" "$w" > "$OUT/log.$w.txt" 2>&1); then
    ok "record $w: $(tail -1 "$OUT/log.$w.txt" | cut -c1-80)"
  else
    ko "record $w: $(tail -3 "$OUT/log.$w.txt")"; continue
  fi
  snap="$OUT/$w.pickle"
  # Peaks of the replay against memory_stats of the same run, exactly.
  python3 - "$ML" "$snap" "$OUT/$w.stats.json" <<'PY' && ok "$w: peak allocated/reserved and summary equal memory_stats" || ko "$w: figures differ"
import json, subprocess, sys
ml, snap, stats = sys.argv[1:4]
ms = json.load(open(stats))["memory_stats"]
peak = json.loads(subprocess.run([ml, "peak", snap, "--json"], capture_output=True, check=True).stdout)
summ = json.loads(subprocess.run([ml, "summary", snap, "--json"], capture_output=True, check=True).stdout)
want = {"peak_allocated_bytes": ms["allocated_bytes.all.peak"], "peak_reserved_bytes": ms["reserved_bytes.all.peak"]}
got = {k: peak[k] for k in want}
want2 = {"reserved_bytes": ms["reserved_bytes.all.current"], "allocated_bytes": ms["allocated_bytes.all.current"], "segments": ms["segment.all.current"]}
got2 = {k: summ[k] for k in want2}
print("   ", got, got2)
sys.exit(0 if got == want and got2 == want2 else 1)
PY
done
# The leak workloads: doctor names the planted line.
for w in gpt2_eval_leak:55 cache_leak:75; do
  name=${w%%:*}; line=${w##*:}
  [ -f "$OUT/$name.pickle" ] || continue
  "$ML" doctor "$OUT/$name.pickle" -o "$OUT/$name.html" > "$OUT/doctor.$name.txt" 2>&1
  if grep -q "^!! Leak: .*workloads.py:$line" "$OUT/doctor.$name.txt" && [ -s "$OUT/$name.html" ]; then
    ok "doctor $name: $(grep -m1 '^!! Leak' "$OUT/doctor.$name.txt")"
  else
    ko "doctor $name: $(head -8 "$OUT/doctor.$name.txt")"
  fi
done
if [ -f "$OUT/oom.at_oom.pickle" ]; then
  "$ML" oom "$OUT/oom.at_oom.pickle" --json > "$OUT/oom.json" 2>&1 && grep -q '"cause": "memory_cap"' "$OUT/oom.json" \
    && ok "oom: cause memory_cap on the fresh OOM snapshot" || ko "oom: $(head -c 300 "$OUT/oom.json")"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
