"""A stand-in for memlens.Recorder with the same public face, for tests of the
framework callbacks on machines without CUDA (where the real recorder records
nothing). It keeps what it was asked to do, and plays a scripted leak alarm and
OOM at given steps, as the real recorder would report them."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional


class RecorderDouble:
    def __init__(self, directory: str, alarm_at: Optional[int] = None, oom_at: Optional[int] = None) -> None:
        self.directory = directory
        self.alarm_at = alarm_at
        self.oom_at = oom_at
        self.active = False
        self.steps = 0
        self.starts = 0
        self.stops = 0
        self.snapshots: List[str] = []
        self.leak_alarm: Optional[str] = None
        self.leak_sites: List[Dict[str, Any]] = []
        self.ooms = 0

    def start(self) -> "RecorderDouble":
        self.active = True
        self.starts += 1
        return self

    def step(self) -> None:
        if not self.active:
            return
        self.steps += 1
        if self.steps == self.oom_at:
            self.ooms += 1
            self.snapshots.append(os.path.join(self.directory, "snapshot.oom.pickle"))
        if self.steps == self.alarm_at:
            self.leak_sites = [{"site": "/home/me/train.py:42", "function": "compute_loss", "bytes": 4 << 20, "count": 4}]
            self.leak_alarm = "+1.00 MiB/step over 5 steps, top site /home/me/train.py:42"

    def stop(self) -> Optional[str]:
        if not self.active:
            return None
        self.active = False
        self.stops += 1
        path = os.path.join(self.directory, "snapshot.pickle")
        self.snapshots.append(path)
        return path
