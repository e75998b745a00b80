"""The line profiler: ``@memlens.profile`` and ``with memlens.profile():``.

::

    @memlens.profile
    def train_step(batch): ...

    with memlens.profile():
        out = model(x)
        out.sum().backward()

Around one call (or one ``with`` block) memlens records PyTorch's memory
history (or reuses the history of an active :func:`memlens.record`), takes a
snapshot when it ends, and prints for each line of the decorated function (of
the block) the memory allocated and freed by that line (itself and what it
called), the net change and the peak reached while it ran: what
pytorch_memlab's LineProfiler shows, but exact (every allocation with its
stack), without a synchronisation per line, and summed over every run of a
line (a loop body). The same table comes from the CLI for any snapshot:
``memlens lines SNAP FILE[:FUNCTION]``.

The call is marked with a ``memlens.profile N`` record_function scope, so the
analysis counts only the events inside it, even when a longer recording is
reused. ``path=`` keeps the snapshot; ``print_to`` is a file to print to
(default: ``sys.stdout``), ``None`` prints nothing (the result is on ``.last``).
"""

from __future__ import annotations

import functools
import itertools
import json
import pickle
import sys
import time
from typing import Any, Callable, Dict, Optional

from . import _native

# Prefix of the scope around a profiled call; the analysis
# (crates/memlens/src/analysis/lines.rs) reads the same string.
PROFILE_MARKER = "memlens.profile "
# Ring buffer for a recording profile() starts itself: room for ~100,000
# allocations in the profiled call.
PROFILE_MAX_ENTRIES = 300_000
_ids = itertools.count(1)


class Profile:
    """One profiled call or block; a decorator and a context manager."""

    def __init__(self, path: Optional[str] = None, print_to: Any = "stdout",
                 max_entries: int = PROFILE_MAX_ENTRIES) -> None:
        self.path = path
        self.print_to = print_to
        self.max_entries = max_entries
        self.last: Optional[Dict[str, Any]] = None
        # Seconds spent by memlens after the call (snapshot, analysis), the
        # cost beyond PyTorch's own recording.
        self.overhead_s = 0.0
        self._stack: list = []

    # -- decorator ---------------------------------------------------------
    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        code = getattr(func, "__code__", None)
        where = (code.co_filename, code.co_name, code.co_firstlineno, None) if code else None

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._begin(where)
            try:
                return func(*args, **kwargs)
            finally:
                self._end()

        wrapper.memlens_profile = self  # type: ignore[attr-defined]
        return wrapper

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> "Profile":
        frame = sys._getframe(1)
        code = frame.f_code
        # The block's lines: from the `with` line to the line that is
        # current at exit (read in __exit__).
        self._begin((code.co_filename, code.co_name, frame.f_lineno, frame))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end()

    # -- the work ------------------------------------------------------------
    def _begin(self, where: Any) -> None:
        from ._capture import _cuda_torch, current

        torch = _cuda_torch()
        state: Dict[str, Any] = {"torch": torch, "where": where, "owned": False, "scope": None}
        self._stack.append(state)
        if torch is None:
            return
        rec = current()
        if rec is None or not rec.active:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=self.max_entries
            )
            state["owned"] = True
        elif getattr(rec, "context", "all") != "all":
            # The frees must carry the stack of the line that freed (context
            # "all"); with "alloc" they carry the allocating line's. Re-arming
            # with the same ring keeps what was recorded.
            self._arm(torch, rec, "all")
            state["rearmed"] = rec
        name = f"{PROFILE_MARKER}{next(_ids)}"
        state["name"] = name
        rf = getattr(getattr(getattr(torch, "autograd", None), "profiler", None), "record_function", None)
        if rf is not None:
            scope = rf(name)
            scope.__enter__()
            state["scope"] = scope
        state["active"] = True

    @staticmethod
    def _arm(torch: Any, rec: Any, context: str) -> None:
        """Re-arms the recorder's history with ``context`` (its other settings kept)."""
        torch.cuda.memory._record_memory_history(
            enabled="all", context=context, stacks=rec.stacks, max_entries=rec.max_entries
        )

    def _end(self) -> None:
        state = self._stack.pop()
        torch = state["torch"]
        if torch is None or not state.get("active"):
            return
        if state["scope"] is not None:
            state["scope"].__exit__(None, None, None)
        t0 = time.perf_counter()
        try:
            snapshot = torch.cuda.memory._snapshot()
        finally:
            if state["owned"]:
                torch.cuda.memory._record_memory_history(enabled=None)
            elif state.get("rearmed") is not None:
                rec = state["rearmed"]
                self._arm(torch, rec, rec.context)
        filename, function, first, frame = state["where"]
        last = frame.f_lineno if frame is not None else None
        data = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
        if self.path:
            with open(self.path, "wb") as f:
                f.write(data)
        options: Dict[str, Any] = {"file": filename, "function": function}
        if state["scope"] is not None:
            options["scope"] = state["name"]
        if frame is not None:
            options["first_line"] = first
            options["last_line"] = last
        self.last = _analyse(data, options)
        self.overhead_s = time.perf_counter() - t0
        if self.print_to is not None and self.last is not None:
            # sys.stdout as it is now (a test's or notebook's capture), not at import.
            out = sys.stdout if self.print_to == "stdout" else self.print_to
            print(self.last.get("text", ""), file=out, flush=True)


def _analyse(data: bytes, options: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The `lines` analysis of the snapshot (its JSON document, with the
    table's text under ``"text"``), or None when this build has none."""
    if "lines" not in _native.analyses():
        return None
    snap = _native.Snapshot.from_bytes(data, "<memlens.profile>")
    opts = json.dumps(options)
    doc = json.loads(snap.analyze("lines", [], opts))
    doc["text"] = snap.lines_text(opts)
    return doc


def profile(func: Optional[Callable[..., Any]] = None, **options: Any) -> Any:
    """``@memlens.profile``, ``@memlens.profile(path=...)`` or
    ``with memlens.profile():``; see the module doc."""
    if func is not None and callable(func):
        return Profile(**options)(func)
    return Profile(**options)


__all__ = ["Profile", "profile", "PROFILE_MARKER"]
