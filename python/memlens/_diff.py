"""What grew between two in-memory snapshots, by allocation site.

Used by the leak alarm and the pytest marker: both ask Rust (the ``diff`` and
``leaks`` analyses, the same figures as ``memlens diff`` and ``memlens
leaks``); nothing is computed here.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Dict, List, Tuple

from . import _native


def without_trace(snapshot: Dict[str, Any]) -> Dict[str, Any]:
    """The snapshot without its trace. A diff is about what is held, which the
    segments say; the trace can be far larger, and dropping it keeps a
    baseline kept in the training process small."""
    return {k: v for k, v in snapshot.items() if k != "device_traces"}


def grown_sites(before: Dict[str, Any], after: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Sites that hold more memory in ``after`` than in ``before``, largest
    first, as ``{site, bytes, count, ...}``: the ``grown`` rows of the Rust
    ``diff`` analysis (``memlens diff``). Empty when Rust cannot read the
    snapshots (the caller's own figures still stand)."""
    try:
        a = _native.Snapshot.from_bytes(pickle.dumps(without_trace(before), protocol=4), "<before>")
        b = _native.Snapshot.from_bytes(pickle.dumps(without_trace(after), protocol=4), "<after>")
        return list(json.loads(a.analyze("diff", [b], "{}")).get("grown", []))
    except Exception:  # noqa: BLE001 - a listing of sites is an extra
        return []


def confirmed_leaks(points: List[Tuple[int, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Sites that kept growing across in-memory snapshots taken after the
    given steps (``[(step, snapshot), ...]``, oldest first), judged by the same
    rules as ``memlens leaks``: the ``leaks`` rows of medium or high
    confidence, most likely first. Empty when nothing persists (noise)."""
    if len(points) < 2 or "leaks" not in _native.analyses():
        return []
    snaps = [
        _native.Snapshot.from_bytes(pickle.dumps(without_trace(s), protocol=4), f"<alarm.step{k}>")
        for k, s in points
    ]
    report = json.loads(snaps[0].analyze("leaks", snaps[1:], "{}"))
    return [row for row in report.get("leaks", []) if row.get("confidence") in ("medium", "high")]
