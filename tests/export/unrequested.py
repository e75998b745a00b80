"""The fleet queries on a recording without `free_requested` entries (run by
tests/export/ci.sh).

    python unrequested.py TABLES PEAK_JSON

TABLES: `memlens export` of `tests/corpus/no_free_requested.pickle.zst`, a
real recording made as `memlens.record` records by default
(`skip_actions=["free_requested"]`: each free is its `free_completed` alone).
PEAK_JSON: `memlens peak --json` of it. The allocated peak the SQL rebuilds
from the events must equal memlens's replayed peak, and the clean run's
growth per step must be near 0 (a query that waited for `free_requested`
would never subtract a free: its peak would be every allocation's sum).
Prints PASS/FAIL lines and "N passed, N failed"; exits 1 on a failure.
"""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "fleet"))
import queries  # noqa: E402

tables, peak_json = sys.argv[1:3]
MIB = 1 << 20
results = []


def check(ok, what, detail):
    results.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {what}: {detail}", flush=True)


duck = queries.run_duckdb(tables, queries.queries(["peak_per_run", "leak_slope"]))
peak = json.load(open(peak_json))["peak_allocated_bytes"]
rows = duck["peak_per_run"]
got = rows[0][3] if len(rows) == 1 else None
check(got == peak, "peak_per_run without free_requested", f"{got} vs memlens peak {peak}")
slopes = duck["leak_slope"]
slope = slopes[0][4] if len(slopes) == 1 else None
check(slope is not None and abs(slope) < MIB, "leak_slope of the clean run without free_requested",
      f"{slope} bytes a step (< 1 MiB)")
print(f"{results.count(True)} passed, {results.count(False)} failed")
sys.exit(0 if all(results) else 1)
