"""`Snapshot.to_arrow()`: the export tables as pyarrow Tables, their row
counts and byte sums equal to the snapshot itself (read with pickle) and to
the fixture's stats.json. Skipped where pyarrow is not installed."""

from __future__ import annotations

import collections
import json
import pickle

import pytest

import memlens

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")
zstandard = pytest.importorskip("zstandard")


def read_pickle(path):
    with open(path, "rb") as fh:
        return pickle.loads(zstandard.ZstdDecompressor().stream_reader(fh).read())


@pytest.mark.parametrize("name", ["cache_leak", "gpt2_train"])
def test_tables_equal_the_snapshot(name, fixtures_dir):
    path = fixtures_dir / f"{name}.pickle.zst"
    raw = read_pickle(path)
    stats = json.loads((fixtures_dir / f"{name}.stats.json").read_text())["memory_stats"]
    t = memlens.load(str(path)).to_arrow(rank=3)
    assert set(t) == {"events", "blocks", "segments", "frames"}
    assert all(isinstance(v, pa.Table) for v in t.values())

    events = [e for tr in raw["device_traces"] for e in tr]
    ev = t["events"]
    assert ev.num_rows == len(events)
    got = collections.Counter(ev.column("action").to_pylist())
    assert got == collections.Counter(e["action"] for e in events)
    allocs = pc.equal(ev.column("action").cast(pa.string()), "alloc")
    assert pc.sum(pc.filter(ev.column("size"), allocs)).as_py() == sum(
        e["size"] for e in events if e["action"] == "alloc"
    )
    assert set(ev.column("rank").to_pylist()) == {3}
    assert set(ev.column("file").to_pylist()) == {str(path)}

    segs = raw["segments"]
    sg = t["segments"]
    assert sg.num_rows == len(segs) == stats["segment.all.current"]
    assert pc.sum(sg.column("total_size")).as_py() == stats["reserved_bytes.all.current"]

    blocks = [b for s in segs for b in s["blocks"]]
    bl = t["blocks"]
    assert bl.num_rows == len(blocks)
    live = pc.equal(bl.column("state").cast(pa.string()), "active_allocated")
    assert pc.sum(pc.filter(bl.column("size"), live)).as_py() == stats["allocated_bytes.all.current"]

    # Every stack id of an event has its frames (the innermost at depth 0).
    fr = t["frames"]
    assert fr.num_rows > 0
    with_frames = {s for s, d in zip(fr.column("stack_id").to_pylist(), fr.column("depth").to_pylist()) if d == 0}
    framed = sum(1 for e in events if e.get("frames"))
    assert sum(1 for s in ev.column("stack_id").to_pylist() if s in with_frames) == framed
