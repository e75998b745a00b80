"""Live figures for ``memlens top``: one small JSON file per process and device.

The format is a contract with ``memlens top`` (keep it exactly):

* directory: ``$MEMLENS_RUNTIME_DIR``, else ``/tmp/memlens-<uid>`` (mode 0700);
* file: ``<pid>-<device>.json``, replaced atomically (write a temporary file,
  then ``os.replace``), at most once a second;
* keys: ``schema`` ("memlens/1"), ``pid``, ``device``, ``rank`` (int or null),
  ``step`` (int or null), ``allocated_bytes``, ``reserved_bytes``,
  ``active_bytes``, ``peak_allocated_bytes``, ``time`` (Unix seconds, float),
  ``leak_alarm`` (str or null), ``cmdline`` (str), and ``cuda_total_bytes``
  (the device's total as CUDA counts it, for ``top``'s account of the GPU;
  absent when torch cannot tell);
* the files are removed when recording stops (and at interpreter exit).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

SCHEMA = "memlens/1"
MIN_INTERVAL_S = 1.0


def _monotonic() -> float:
    return time.monotonic()


def runtime_dir() -> str:
    """Where live files go: ``$MEMLENS_RUNTIME_DIR`` or ``/tmp/memlens-<uid>``."""
    env = os.environ.get("MEMLENS_RUNTIME_DIR")
    if env:
        return env
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    base = "/tmp" if os.name == "posix" else tempfile.gettempdir()
    return os.path.join(base, f"memlens-{uid}")


def cmdline() -> str:
    """The command line of this process, as ``ps`` shows it."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
        if parts:
            return " ".join(parts)
    except OSError:
        pass
    return " ".join([sys.executable, *sys.argv])


def figures(torch: Any, device: int) -> Dict[str, int]:
    """The allocator's figures for one device, from ``torch.cuda.memory_stats``."""
    stats = torch.cuda.memory_stats(device)
    out = {
        "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
        "active_bytes": int(stats.get("active_bytes.all.current", 0)),
        "peak_allocated_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
    }
    try:
        out["cuda_total_bytes"] = int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # noqa: BLE001 - the account is an extra
        pass
    return out


class Publisher:
    """Writes this process's live files; throttled to one write a second."""

    def __init__(
        self,
        torch: Any,
        devices: Callable[[], Iterable[int]],
        clock: Optional[Callable[[], float]] = None,
        directory: Optional[str] = None,
    ) -> None:
        self._torch = torch
        self._devices = devices
        self._clock = clock or (lambda: _monotonic())
        self._dir = directory or runtime_dir()
        self._last: Optional[float] = None
        self._written: Dict[int, str] = {}
        self._cmdline = cmdline()
        self._broken = False

    @property
    def paths(self) -> List[str]:
        """Files written so far (and not removed)."""
        return list(self._written.values())

    def path(self, device: int) -> str:
        """The live file of ``device`` for this process."""
        return os.path.join(self._dir, f"{os.getpid()}-{device}.json")

    def publish(
        self,
        step: Optional[int],
        rank: Optional[int],
        leak_alarm: Optional[str],
        force: bool = False,
    ) -> bool:
        """Writes the files unless one was written less than a second ago
        (``force`` writes anyway); returns whether it wrote."""
        if self._broken:
            return False
        now = self._clock()
        if not force and self._last is not None and now - self._last < MIN_INTERVAL_S:
            return False
        self._last = now
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            for device in self._devices():
                doc = {
                    "schema": SCHEMA,
                    "pid": os.getpid(),
                    "device": int(device),
                    "rank": rank,
                    "step": step,
                    **figures(self._torch, device),
                    "time": time.time(),
                    "leak_alarm": leak_alarm,
                    "cmdline": self._cmdline,
                }
                self._write(self.path(device), doc)
                self._written[int(device)] = self.path(device)
        except OSError as e:
            # A read-only /tmp must not stop training: say so once, then stop trying.
            self._broken = True
            print(f"memlens: cannot publish live figures in {self._dir}: {e}", file=sys.stderr)
            return False
        return True

    @staticmethod
    def _write(path: str, doc: Dict[str, Any]) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def remove(self) -> None:
        """Removes the files this publisher wrote."""
        for path in self._written.values():
            try:
                os.remove(path)
            except OSError:
                pass
        self._written.clear()
