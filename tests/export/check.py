"""Checks `memlens export` tables with DuckDB (run by tests/export/ci.sh).

    python check.py TABLES EXPORT_JSON FIXTURES NAME...

For each fixture NAME (exported from FIXTURES/NAME.pickle.zst), reads the
snapshot with pickle and compares, per file, with DuckDB queries of the
Parquet tables: the number of trace events and of each action, the bytes of
`alloc` events, the segments and their bytes, the blocks and the bytes of
allocated blocks, the frames of every stack; and the dump-time figures with
NAME.stats.json (reserved and allocated bytes, segment count); and, when
NAME.peak.json (`memlens peak --json`) lies beside EXPORT_JSON, the allocated
peak rebuilt from the events table in SQL. Prints
PASS/FAIL lines and "N passed, N failed"; exits 1 on a failure.
"""
import collections
import json
import os
import pickle
import sys

import duckdb
import zstandard

tables, export_json, fixtures, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
RESULTS = []


def check(ok, what, detail):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {what}: {detail}", flush=True)


def q(sql, *params):
    return duckdb.execute(sql, list(params)).fetchall()


def t(name):
    return os.path.join(tables, f"{name}.parquet")


doc = json.load(open(export_json))
for name in names:
    path = os.path.join(fixtures, f"{name}.pickle.zst")
    file = next(f for f in doc["files"] if f.endswith(f"{name}.pickle.zst"))
    with open(path, "rb") as fh:
        snap = pickle.loads(zstandard.ZstdDecompressor().stream_reader(fh).read())
    stats = json.load(open(os.path.join(fixtures, f"{name}.stats.json")))["memory_stats"]
    events = [e for tr in snap["device_traces"] for e in tr]
    actions = collections.Counter(e["action"] for e in events)
    got = dict(q(f"SELECT action, count(*) FROM '{t('events')}' WHERE file = ? GROUP BY 1", file))
    check(got == dict(actions), f"{name} events by action", f"{sum(got.values())} rows, pickle {len(events)}")
    alloc_bytes = sum(e["size"] for e in events if e["action"] == "alloc")
    got = q(f"SELECT sum(size) FROM '{t('events')}' WHERE file = ? AND action = 'alloc'", file)[0][0]
    check(got == alloc_bytes, f"{name} alloc bytes", f"{got} vs {alloc_bytes}")
    segs = snap["segments"]
    got = q(f"SELECT count(*), sum(total_size) FROM '{t('segments')}' WHERE file = ?", file)[0]
    want = (len(segs), sum(s["total_size"] for s in segs))
    check(got == want, f"{name} segments", f"{got} vs pickle {want}")
    check(got[0] == stats["segment.all.current"] and got[1] == stats["reserved_bytes.all.current"],
          f"{name} segments vs stats.json", f"{got} vs ({stats['segment.all.current']}, {stats['reserved_bytes.all.current']})")
    blocks = [b for s in segs for b in s["blocks"]]
    got = q(f"SELECT count(*), sum(size) FILTER (WHERE state = 'active_allocated') FROM '{t('blocks')}' WHERE file = ?", file)[0]
    want = (len(blocks), sum(b["size"] for b in blocks if b["state"] == "active_allocated"))
    check(got == want, f"{name} blocks", f"{got} vs pickle {want}")
    check(got[1] == stats["allocated_bytes.all.current"], f"{name} allocated vs stats.json",
          f"{got[1]} vs {stats['allocated_bytes.all.current']}")
    # Every event's stack joins to its frames: the frames of the events equal
    # the pickle's frames, event by event (count of frame rows over all events).
    want = sum(len(e.get("frames") or []) for e in events)
    got = q(f"""SELECT count(*) FROM '{t('events')}' e JOIN '{t('frames')}' f
               ON e.file = f.file AND e.stack_id = f.stack_id WHERE e.file = ?""", file)[0][0]
    check(got == want, f"{name} event frames (join on stack_id)", f"{got} vs pickle {want}")

    # The allocated peak rebuilt in SQL: a running sum of the allocated
    # (rounded) sizes, + at `alloc`, - at `free_requested` (allocated bytes
    # fall when the user frees; `free_completed` is when the block is back in
    # its pool), equals `memlens peak --json` (ci.sh writes NAME.peak.json).
    peak_json = os.path.join(os.path.dirname(export_json), f"{name}.peak.json")
    if os.path.exists(peak_json):
        peak = json.load(open(peak_json))

        def running_peak(size, minus):
            return q(f"""SELECT max(running) FROM (
                SELECT sum(CASE action WHEN 'alloc' THEN CAST({size} AS BIGINT)
                                       WHEN '{minus}' THEN -CAST({size} AS BIGINT) ELSE 0 END)
                       OVER (ORDER BY index ROWS UNBOUNDED PRECEDING) AS running
                FROM '{t('events')}' WHERE file = ? AND device = ?)""", file, peak["device"])[0][0]

        got = running_peak("allocated_size", "free_requested")
        want = peak["peak_allocated_bytes"]
        requested = running_peak("size", "free_requested")
        check(got == want, f"{name} allocated peak from events (SQL running sum)",
              f"{got} vs memlens peak {want} (requested sizes: {requested}, "
              f"{(want - requested) / 2**20:.1f} MiB short)")
        print(f"INFO {name} the same sum with free_completed instead: "
              f"{running_peak('allocated_size', 'free_completed')}", flush=True)

# The export's own counts are the tables' rows.
for table in ["events", "blocks", "segments", "frames"]:
    got = q(f"SELECT count(*) FROM '{t(table)}'")[0][0]
    check(got == doc["rows"][table], f"{table} rows", f"{got} vs memlens {doc['rows'][table]}")
# The query the README shows runs: top sites by bytes live at the end.
rows = q(f"""
    WITH live AS (
      SELECT file, stack_id, sum(size) AS bytes FROM '{t('blocks')}'
      WHERE state = 'active_allocated' GROUP BY ALL)
    SELECT l.file, f.filename || ':' || f.line AS site, sum(l.bytes) AS bytes
    FROM live l JOIN '{t('frames')}' f USING (file, stack_id)
    WHERE f.depth = 0 GROUP BY ALL ORDER BY bytes DESC LIMIT 5""")
check(len(rows) > 0, "README query (top sites by live bytes)", rows[:2])
passed = sum(RESULTS)
print(f"{passed} passed, {len(RESULTS) - passed} failed")
sys.exit(0 if passed == len(RESULTS) else 1)
