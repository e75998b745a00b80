"""Checks the fleet queries (examples/fleet) on real recordings (run by
tests/export/ci.sh).

    python fleet.py TABLES CORPUS PEAKS_DIR [SPARK_JSON]

TABLES: `memlens export` of the corpus's 2-rank DDP job (`ranks/ddp_ema`,
rank 0 keeps an EMA copy of the weights), the planted leak `leak_losses`
and the clean run `clean`. PEAKS_DIR holds `memlens peak --json` of each
(NAME.peak.json). Runs every query on DuckDB and checks its answers against
what happened on the GPU (the truth files) and memlens's own figures; with
SPARK_JSON (the same queries' answers from Spark, `queries.py --engine spark
--json`), checks that Spark gives the same rows. Prints PASS/FAIL lines and
"N passed, N failed"; exits 1 on a failure.
"""
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "fleet"))
import queries  # noqa: E402

tables, corpus, peaks_dir = sys.argv[1:4]
spark_json = sys.argv[4] if len(sys.argv) > 4 else None
RESULTS = []
MIB = 1 << 20


def check(ok, what, detail):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {what}: {detail}", flush=True)


def by_name(rows, name):
    return [r for r in rows if r[0].endswith(name)]


duck = queries.run_duckdb(tables, queries.queries())
ema = json.load(open(os.path.join(corpus, "ranks", "ddp_ema.truth.json")))
leak = json.load(open(os.path.join(corpus, "leak_losses.truth.json")))
clean = json.load(open(os.path.join(corpus, "clean.truth.json")))

# Peak per run: memlens's replayed peak, and on the GPU max_memory_allocated().
peaks = duck["peak_per_run"]
for name, truth in [
    ("leak_losses.pickle.zst", leak["memory_stats"]["allocated_bytes.all.peak"]),
    ("clean.pickle.zst", clean["memory_stats"]["allocated_bytes.all.peak"]),
] + [(f"ddp_ema.rank{r['rank']}.pickle.zst", r["max_memory_allocated"]) for r in ema["ranks"]]:
    rows = by_name(peaks, name)
    got = rows[0][3] if len(rows) == 1 else None
    memlens = json.load(open(os.path.join(peaks_dir, name.replace(".pickle.zst", ".peak.json"))))
    check(got == truth == memlens["peak_allocated_bytes"], f"peak_per_run {name}",
          f"{got} vs GPU {truth}, memlens peak {memlens['peak_allocated_bytes']}")

# Leak slope: the planted leak keeps the same bytes every step; the clean run
# and the ranks' steady steps keep nothing.
slopes = {r[0].split("/")[-1]: r[4] for r in duck["leak_slope"]}
want = leak["growth_per_step_from_step2"][0]
check(slopes.get("leak_losses.pickle.zst") == want, "leak_slope of the planted leak",
      f"{slopes.get('leak_losses.pickle.zst')} bytes a step vs {want} kept a step on the GPU")
for name in ["clean.pickle.zst", "ddp_ema.rank0.pickle.zst", "ddp_ema.rank1.pickle.zst"]:
    got = slopes.get(name)
    check(got is not None and abs(got) < MIB, f"leak_slope of {name}", f"{got} bytes a step (< 1 MiB)")

# Rank imbalance: the planted EMA copy, on its rank, at its line, first.
top = duck["rank_imbalance"][0] if duck["rank_imbalance"] else None
planted = ema["planted"]
check(top is not None and top[0] == planted["line"] and top[2] == planted["rank"]
      and planted["bytes"] <= top[1] < planted["bytes"] + 2 * MIB,
      "rank_imbalance names the planted copy first",
      f"{top} vs {planted['line']} on rank {planted['rank']}, {planted['bytes']} bytes")

# Top lines: the leak's line of allocation leads.
top = duck["top_lines"][0] if duck["top_lines"] else None
paths = leak["leak"]["alloc_path"]
check(top is not None and top[0] in paths, "top_lines leads with the leak's line",
      f"{top} (the leak's path {paths})")

if spark_json:
    spark = json.load(open(spark_json))
    for name, rows in duck.items():
        check(spark.get(name) == rows, f"Spark gives DuckDB's rows for {name}",
              f"{len(spark.get(name) or [])} rows vs {len(rows)}")
else:
    print("SKIP Spark: no answers given (pyspark or Java not installed)", flush=True)

passed = sum(RESULTS)
print(f"{passed} passed, {len(RESULTS) - passed} failed")
sys.exit(0 if passed == len(RESULTS) else 1)
