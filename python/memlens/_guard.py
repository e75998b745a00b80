"""Memory limits around one piece of code: what the pytest marker
``@pytest.mark.cuda_memory(...)`` checks. Pure logic over a torch module, so it
is tested with a fake one.

* ``max_peak``: ``torch.cuda.max_memory_allocated()`` during the test (after
  ``reset_peak_memory_stats()``), i.e. the peak of all memory allocated on the
  device, including what existed before the test.
* ``max_reserved``: the same for ``max_memory_reserved()`` (what the caching
  allocator took from the driver).
* ``no_leaks``: ``memory_allocated()`` after the test, after ``gc.collect()``
  and dropping cuBLAS workspaces (PyTorch keeps those on purpose), is not more
  than before plus ``leak_tolerance``. The diagnosis names the allocation
  sites from a diff of the snapshots before and after.

History is recorded during the test (unless memlens is already recording),
and the snapshot of a failing test is written for ``memlens peak``.
"""

from __future__ import annotations

import gc
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from . import _native
from ._diff import grown_sites, without_trace

MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Limits:
    """What the marker asks for; sizes in bytes."""

    max_peak: Optional[int] = None
    max_reserved: Optional[int] = None
    no_leaks: bool = False
    leak_tolerance: int = 0


def _size(name: str, value: Union[int, str, None]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a size such as '2GiB' or a number of bytes, not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative")
        return value
    if isinstance(value, str):
        try:
            return int(_native.parse_size(value))
        except _native.MemlensError as e:
            raise ValueError(f"{name}: {e}") from None
    raise TypeError(f"{name} must be a size such as '2GiB' or a number of bytes, not {value!r}")


def limits(
    max_peak: Union[int, str, None] = None,
    max_reserved: Union[int, str, None] = None,
    no_leaks: bool = False,
    leak_tolerance: Union[int, str] = 0,
) -> Limits:
    """Parses the marker's arguments (sizes as ``"2GiB"`` or bytes)."""
    return Limits(
        max_peak=_size("max_peak", max_peak),
        max_reserved=_size("max_reserved", max_reserved),
        no_leaks=bool(no_leaks),
        leak_tolerance=_size("leak_tolerance", leak_tolerance) or 0,
    )


def cuda_unavailable_reason() -> Optional[str]:
    """Why CUDA memory cannot be measured here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return "CUDA is not available"
    except Exception as e:  # noqa: BLE001
        return f"CUDA is not usable: {e}"
    return None


def snapshot_file(directory: str, test_id: str) -> str:
    """A file name for the snapshot of a test (its node id made safe)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id).strip("_")[:150] or "test"
    return os.path.join(directory, f"{safe}.pickle")


class Guard:
    """Measures one test: call :meth:`before`, run it, call :meth:`after`."""

    def __init__(self, torch: Any, limits: Limits, snapshot_path: str) -> None:
        self._torch = torch
        self.limits = limits
        self.snapshot_path = snapshot_path
        self._own_history = False
        self._before_snap: Optional[Dict[str, Any]] = None
        self.allocated_before = 0
        self.allocated_after = 0
        self.peak = 0
        self.peak_reserved = 0

    def _settle(self) -> None:
        gc.collect()
        clear = getattr(self._torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        self._torch.cuda.synchronize()

    def before(self) -> None:
        """Resets the peaks and starts recording."""
        from ._capture import current

        cuda = self._torch.cuda
        self._settle()
        cuda.reset_peak_memory_stats()
        self.allocated_before = int(cuda.memory_allocated())
        self._own_history = current() is None
        if self._own_history:
            cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES
            )
        if self.limits.no_leaks:
            self._before_snap = without_trace(cuda.memory._snapshot())

    def after(self, test_failed: bool = False) -> Optional[str]:
        """Checks the limits; returns the failure message, or None when all hold
        (or the test failed by itself, which is reported as it is)."""
        cuda = self._torch.cuda
        try:
            cuda.synchronize()
            self.peak = int(cuda.max_memory_allocated())
            self.peak_reserved = int(cuda.max_memory_reserved())
            self._settle()
            self.allocated_after = int(cuda.memory_allocated())
            if test_failed:
                return None
            return self._verdict()
        finally:
            if self._own_history:
                try:
                    cuda.memory._record_memory_history(enabled=None)
                except Exception:  # noqa: BLE001
                    pass
            self._before_snap = None

    def leaked(self) -> int:
        """Bytes still allocated after the test beyond what was there before."""
        return max(0, self.allocated_after - self.allocated_before)

    def _verdict(self) -> Optional[str]:
        fb = _native.format_bytes
        lim = self.limits
        problems: List[str] = []
        peak_broken = lim.max_peak is not None and self.peak > lim.max_peak
        if peak_broken:
            problems.append(f"peak allocated {fb(self.peak)} is over max_peak {fb(lim.max_peak or 0)}")
        if lim.max_reserved is not None and self.peak_reserved > lim.max_reserved:
            problems.append(
                f"peak reserved {fb(self.peak_reserved)} is over max_reserved {fb(lim.max_reserved)}"
            )
        leak = lim.no_leaks and self.leaked() > lim.leak_tolerance
        if leak:
            problems.append(
                f"{fb(self.leaked())} more is allocated after the test than before it "
                f"({fb(self.allocated_before)} -> {fb(self.allocated_after)}; no_leaks)"
            )
        if not problems:
            return None
        lines = [f"memlens cuda_memory: {p}" for p in problems]
        snap = self._torch.cuda.memory._snapshot()
        if leak and self._before_snap is not None:
            sites = grown_sites(self._before_snap, without_trace(snap))
            if sites:
                lines.append("still allocated after the test, by allocation site:")
                lines += [_site_line(r) for r in sites[:5]]
        path = self._save(snap)
        if path is not None:
            if peak_broken:
                lines += _peak_lines(path)
            lines.append(f"snapshot: {path}  (memlens peak {path})")
        return "\n".join(lines)

    def _save(self, snap: Dict[str, Any]) -> Optional[str]:
        try:
            os.makedirs(os.path.dirname(self.snapshot_path) or ".", exist_ok=True)
            with open(self.snapshot_path, "wb") as f:
                pickle.dump(snap, f)
        except OSError:
            return None
        return self.snapshot_path


def _site_line(row: Dict[str, Any]) -> str:
    # The site as every command shows it: Rust's wording, not a copy of it.
    where = row.get("display") or _native.site_display(
        str(row.get("site", "?")),
        str(row.get("function") or ""),
        [str(p) for p in row.get("path") or []],
    )
    return f"  +{_native.format_bytes(int(row.get('bytes', 0)))}  {int(row.get('count', 0))} blocks  {where}"


def _peak_lines(path: str) -> List[str]:
    """What was live at the peak, from the Rust peak analysis when this build has it."""
    if "peak" not in _native.analyses():
        return []
    from ._analysis import load

    try:
        rows = load(path).peak(top=5).to_dict().get("live_at_peak", [])
    except Exception:  # noqa: BLE001 - the numbers above still stand
        return []
    if not rows:
        return []
    return ["live at the peak, by allocation site:"] + [
        f"  {_native.format_bytes(int(r.get('bytes', 0)))}  {r.get('site', '?')}" for r in rows[:5]
    ]
