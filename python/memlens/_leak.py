"""The leak alarm rule, on the memory still allocated after each training step.

The rule (documented in the README and :func:`memlens.record`):

* After each ``memlens.step()`` memlens reads ``torch.cuda.memory_allocated()``:
  what the step left behind (parameters, optimizer state, and anything leaked).
* The first ``warmup`` steps (default 3) are ignored: optimizer state, cuBLAS
  workspaces and caches are created there and legitimately stay.
* A step *grows* when the figure is strictly larger than after the step before.
* The alarm fires, once, when the last ``steps`` steps (default 5) all grew and
  together grew by at least ``min_bytes`` (default 8 MiB). Healthy training
  keeps this figure flat from step to step, so steady growth is the signature
  of a leak (a list that keeps losses with their graphs, a cache on a module).
* The total is only the trigger. memlens takes an in-memory snapshot (without
  its trace) when a growth streak starts, halfway through it and when it
  would fire, and asks the same rules as ``memlens leaks`` (in Rust) which
  sites grew across those three points: growth over at least 3 steps, above
  the allocator's rounding noise, by the user's call path. No such site: no
  alarm (the total moved by noise), and the watch starts afresh.

This module is pure logic (no torch), so it is tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

MIB = 1024 * 1024

BASELINE = "baseline"
"""Returned by :meth:`LeakRule.update` when a snapshot should be taken now (a streak started)."""
MIDPOINT = "midpoint"
"""Returned by :meth:`LeakRule.update` halfway through a streak: a second snapshot, so
that the sites are judged on three points, as ``memlens leaks`` judges them."""
ALARM = "alarm"
"""Returned by :meth:`LeakRule.update` when the alarm fires (once)."""


@dataclass
class LeakRule:
    """State of the leak rule. Feed it the allocated bytes after each step."""

    warmup: int = 3
    steps: int = 5
    min_bytes: int = 8 * MIB
    history: List[int] = field(default_factory=list)
    streak: int = 0
    fired: bool = False
    streak_start_step: Optional[int] = None

    def __post_init__(self) -> None:
        # Two steps at least: the sites come from a diff between the snapshot
        # taken after the first growing step and the one at the alarm.
        if self.warmup < 0 or self.steps < 2 or self.min_bytes < 0:
            raise ValueError("leak rule: warmup >= 0, steps >= 2 and min_bytes >= 0 are needed")

    def update(self, allocated: int) -> Optional[str]:
        """Records the bytes allocated after the next step; returns
        :data:`BASELINE`, :data:`ALARM` or None."""
        self.history.append(int(allocated))
        step = len(self.history)
        if self.fired or step <= self.warmup or step < 2:
            return None
        if self.history[-1] > self.history[-2]:
            self.streak += 1
        else:
            self.streak = 0
            self.streak_start_step = None
            return None
        if self.streak == 1:
            self.streak_start_step = step
        if self.streak >= self.steps and self.growth() >= self.min_bytes:
            self.fired = True
            return ALARM
        if self.streak == 1:
            return BASELINE
        if self.streak == self.midpoint():
            return MIDPOINT
        return None

    def midpoint(self) -> int:
        """The streak length at which the middle snapshot is taken."""
        return max(2, (self.steps + 1) // 2)

    def dismiss(self) -> None:
        """The sites showed no leak (the total moved by allocator noise, or a
        tensor was replaced by a larger one): start watching afresh."""
        self.fired = False
        self.streak = 0
        self.streak_start_step = None

    def growth(self) -> int:
        """Bytes grown over the last ``steps`` steps (or the streak, if shorter)."""
        n = min(self.streak, self.steps)
        if n == 0 or len(self.history) <= n:
            return 0
        return self.history[-1] - self.history[-1 - n]

    def per_step(self) -> int:
        """Average growth per step over the same window."""
        n = min(self.streak, self.steps)
        return self.growth() // n if n else 0
