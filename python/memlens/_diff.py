"""What grew between two in-memory snapshots, by allocation site.

Used by the leak alarm and the pytest marker. :func:`grown_sites` is the one
place that decides how: the Rust ``diff`` analysis when this build has it (the
same figures as ``memlens diff``), else a small pure-Python fallback that groups
the ``active_allocated`` blocks of each snapshot by their innermost user frame
and subtracts.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Dict, List, Optional, Tuple

from . import _native

def is_user_file(filename: str) -> bool:
    """True when a frame's file is the user's own code: memlens's one frame
    rulebook (Rust, ``memlens::frames``), never a rule of its own here."""
    return bool(filename) and _native.frame_kind(filename) == "user"


def user_site(frames: List[Dict[str, Any]]) -> Tuple[str, str]:
    """``(file:line, function)`` of the innermost user frame of a stack
    (innermost first); the innermost frame when none is user code."""
    chosen: Optional[Dict[str, Any]] = None
    for f in frames:
        if is_user_file(str(f.get("filename", ""))):
            chosen = f
            break
    if chosen is None and frames:
        chosen = frames[0]
    if chosen is None:
        return ("<no stack recorded>", "")
    return (f"{chosen.get('filename', '?')}:{chosen.get('line', 0)}", str(chosen.get("name", "")))


def active_by_site(snapshot: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Bytes and count of ``active_allocated`` blocks per site."""
    sites: Dict[str, Dict[str, Any]] = {}
    for seg in snapshot.get("segments") or []:
        for blk in seg.get("blocks") or []:
            if blk.get("state") != "active_allocated":
                continue
            site, function = user_site(blk.get("frames") or [])
            entry = sites.setdefault(site, {"site": site, "function": function, "bytes": 0, "count": 0})
            entry["bytes"] += int(blk.get("size", 0))
            entry["count"] += 1
    return sites


def python_diff(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    """``{"grown": [...], "shrunk": [...]}`` of ``{site, function, bytes, count}``,
    largest change first; bytes and count are the changes (absolute values)."""
    a = active_by_site(before)
    b = active_by_site(after)
    grown: List[Dict[str, Any]] = []
    shrunk: List[Dict[str, Any]] = []
    for site in set(a) | set(b):
        ea = a.get(site, {"bytes": 0, "count": 0, "function": ""})
        eb = b.get(site, {"bytes": 0, "count": 0, "function": ea["function"]})
        delta = eb["bytes"] - ea["bytes"]
        row = {
            "site": site,
            "function": eb["function"] or ea["function"],
            "bytes": abs(delta),
            "count": abs(eb["count"] - ea["count"]),
        }
        if delta > 0:
            grown.append(row)
        elif delta < 0:
            shrunk.append(row)
    grown.sort(key=lambda r: (-r["bytes"], r["site"]))
    shrunk.sort(key=lambda r: (-r["bytes"], r["site"]))
    return {"grown": grown, "shrunk": shrunk}


def without_trace(snapshot: Dict[str, Any]) -> Dict[str, Any]:
    """The snapshot without its trace. A diff is about what is held, which the
    segments say; the trace can be far larger, and dropping it keeps a
    baseline kept in the training process small."""
    return {k: v for k, v in snapshot.items() if k != "device_traces"}


def grown_sites(before: Dict[str, Any], after: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Sites that hold more memory in ``after`` than in ``before``, largest
    first, as ``{site, bytes, count, ...}``."""
    if "diff" in _native.analyses():
        try:
            a = _native.Snapshot.from_bytes(pickle.dumps(without_trace(before), protocol=4), "<before>")
            b = _native.Snapshot.from_bytes(pickle.dumps(without_trace(after), protocol=4), "<after>")
            return list(json.loads(a.analyze("diff", [b], "{}")).get("grown", []))
        except Exception:  # noqa: BLE001 - the fallback below still answers
            pass
    return python_diff(before, after)["grown"]


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
