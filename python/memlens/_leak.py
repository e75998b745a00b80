"""The leak alarm rule, on the memory still allocated after each training step.

The rule (documented in the README and :func:`memlens.record`):

* After each ``memlens.step()`` memlens reads ``torch.cuda.memory_allocated()``:
  what the step left behind (parameters, optimizer state, and anything leaked).
* The first ``warmup`` steps (default 3) are ignored: optimizer state, cuBLAS
  workspaces and caches are created there and legitimately stay.
* A step *rises* when the figure is higher than after every step since the
  watch began; the watch begins at the first rise (its *base* is the figure
  just before) and ends when the figure falls back to the base or below.
  Steps that stay flat neither count nor end it: a loop that keeps a tensor
  every tenth step (an evaluation, a logging branch) rises once in ten steps.
* The alarm fires, once, when the watch has seen ``steps`` rises (default 5)
  and the figure stands at least ``min_bytes`` (default 8 MiB) above its base.
  Healthy training keeps this figure flat from step to step, or gives back
  what it took, so growth that is kept is the signature of a leak (a list that
  keeps losses with their graphs, a cache on a module).
* The total is only the trigger. memlens takes an in-memory snapshot (without
  its trace) once the watch has seen two rises (one when ``steps`` < 4) and
  stands ``min_bytes / 2`` above its base, then one at its middle rise (and
  never at the baseline's) and one when it would fire, and asks the same
  rules as ``memlens leaks`` (in Rust) which sites grew across those three
  points: growth over at least 3 steps, above the allocator's rounding noise,
  by the user's call path. No such site: no alarm (the total moved by
  noise), and the watch starts afresh. Not at the first rise: a figure that
  wanders by a few MiB from step to step starts watch after watch, and each
  snapshot converts the whole trace ring; measured on a CS336-style model,
  3 ms of a 41 ms step (BENCHMARKS.md, issue 35).

This module is pure logic (no torch), so it is tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

MIB = 1024 * 1024

BASELINE = "baseline"
"""Returned by :meth:`LeakRule.update` when a snapshot should be taken now (a watch began)."""
MIDPOINT = "midpoint"
"""Returned by :meth:`LeakRule.update` at the watch's middle rise: a second snapshot, so
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
    rises: int = 0
    """Rises seen since the watch began (0: no watch)."""
    fired: bool = False
    watch_start: int = 0
    """The step of the watch's first rise (while ``rises`` > 0)."""
    base: int = 0
    """The figure just before the watch's first rise."""
    high: int = 0
    """The highest figure since the watch began."""
    taken: int = 0
    """Snapshots the watch asked for: 0, 1 after :data:`BASELINE`, 2 after :data:`MIDPOINT`."""
    baseline_at: int = 0
    """The rise at which the watch asked for its baseline (while ``taken`` > 0)."""

    def __post_init__(self) -> None:
        # Two rises at least: the sites come from a diff between the snapshot
        # taken at the first rise and the one at the alarm.
        if self.warmup < 0 or self.steps < 2 or self.min_bytes < 0:
            raise ValueError("leak rule: warmup >= 0, steps >= 2 and min_bytes >= 0 are needed")

    def update(self, allocated: int) -> Optional[str]:
        """Records the bytes allocated after the next step; returns
        :data:`BASELINE`, :data:`MIDPOINT`, :data:`ALARM` or None."""
        if self.fired:
            return None  # the figures stay those of the alarm
        self.history.append(int(allocated))
        step = len(self.history)
        if step <= self.warmup or step < 2:
            return None
        now, before = self.history[-1], self.history[-2]
        if self.rises == 0:
            if now <= before:
                return None
            # The watch begins.
            self.rises, self.base, self.high = 1, before, now
            self.watch_start = step
        elif now <= self.base:
            # Everything taken since the watch began was given back.
            self.dismiss()
            return None
        elif now > self.high:
            self.rises += 1
            self.high = now
        else:
            return None
        # Three snapshots, in order, each at a later rise: the baseline, the
        # midpoint, then the alarm's.
        if self.taken == 0:
            if self.rises >= self.baseline_rise() and self.growth() >= self.baseline_bytes():
                self.taken, self.baseline_at = 1, self.rises
                return BASELINE
            return None
        if self.taken == 1:
            if self.rises >= max(self.baseline_at + 1, self.midpoint()):
                self.taken = 2
                return MIDPOINT
            return None
        if self.rises >= self.steps and self.growth() >= self.min_bytes:
            self.fired = True
            return ALARM
        return None

    def baseline_rise(self) -> int:
        """The first rise at which the baseline snapshot may be taken: the
        second, so that a lone rise given back at the next step costs no
        snapshot, unless the alarm needs fewer than 4 rises (then three points
        need the first)."""
        return 2 if self.steps >= 4 else 1

    def baseline_bytes(self) -> int:
        """How far above its base the figure must stand before the baseline
        snapshot is taken: half of ``min_bytes``. A figure that wanders within
        a few MiB from step to step (measured: 2.4 MB on a CS336-style model)
        never reaches it, and never pays for a snapshot; a leak reaches it on
        its way to ``min_bytes``."""
        return self.min_bytes // 2

    def midpoint(self) -> int:
        """The rise from which the middle snapshot is taken (and never at the
        baseline's rise)."""
        return (self.steps + 1) // 2

    def dismiss(self) -> None:
        """The sites showed no leak (the total moved by allocator noise, or a
        tensor was replaced by a larger one), or the growth was given back:
        start watching afresh."""
        self.fired = False
        self.rises = 0
        self.taken = 0

    def span(self) -> int:
        """Steps since the watch began, its first rise included."""
        if self.rises == 0:
            return 0
        return len(self.history) - self.watch_start + 1

    def growth(self) -> int:
        """Bytes above the watch's base now."""
        if self.rises == 0:
            return 0
        return self.history[-1] - self.base

    def per_step(self) -> int:
        """Average growth per step since the watch began."""
        n = self.span()
        return self.growth() // n if n else 0
